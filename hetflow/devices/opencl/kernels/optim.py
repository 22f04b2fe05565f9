"""OpenCL optimizer updates (``optim.cl``): SGD (momentum, Nesterov, L2 weight decay) and Adam / AdamW,
in place on a parameter and its state, one work-item per element.

The arrays are host arrays, as everywhere in this backend: on host-unified-memory devices a buffer
wraps each one (``USE_HOST_PTR``) when it is aligned (the trainer allocates parameters and state that
way), so the kernel writes the host memory itself and reading back is a map; otherwise (a discrete GPU,
an unaligned array) the updated values are copied back into the array. NOTE: keeping parameters and
state resident on a discrete device needs the forward kernels to take device values; until then every
step's forward reads the host copy anyway.

``register`` puts them in a training table under the rule names the optimizers ask for (``"sgd"``,
``"adam"``; see ``hetflow.train.optim``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.opencl.kernels.common import source

if TYPE_CHECKING:
    from hetflow.devices.opencl import DeviceArray, OpenCLDevice

SOURCE = source("optim.cl")


def _bind(device: OpenCLDevice, array: np.ndarray) -> DeviceArray:
    assert array.dtype == np.float32 and array.flags.c_contiguous, "updates run on contiguous float32"
    return device.to_device(array)


def _write_back(device: OpenCLDevice, buffer: DeviceArray, array: np.ndarray) -> None:
    """Make ``array`` hold the buffer's values: a map (the wait) when the buffer wraps it, else a copy."""
    values = device.to_host(buffer)
    if buffer.host is not array:
        array[...] = values


def sgd_update(
    device: OpenCLDevice,
    param: np.ndarray,
    grad: np.ndarray,
    velocity: np.ndarray | None,
    *,
    lr: float,
    momentum: float,
    nesterov: bool,
    weight_decay: float,
) -> None:
    """SGD's update of ``param`` (and of ``velocity`` when momentum is on) in place."""
    if param.size == 0:
        return
    p_buf = _bind(device, param)
    g_buf = device.to_device(np.ascontiguousarray(grad, np.float32))
    v_buf = _bind(device, velocity) if velocity is not None else g_buf  # never written without momentum
    args = (
        p_buf.buffer, g_buf.buffer, v_buf.buffer, np.float32(lr), np.float32(momentum),
        np.float32(weight_decay), np.int32(velocity is not None), np.int32(nesterov),
    )  # fmt: skip
    device.enqueue(device.kernel("sgd_update", SOURCE), (int(param.size),), None, args)
    _write_back(device, p_buf, param)
    if velocity is not None:
        _write_back(device, v_buf, velocity)


def adam_update(
    device: OpenCLDevice,
    param: np.ndarray,
    grad: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    *,
    lr: float,
    step: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    decoupled: bool,
) -> None:
    """Adam's (AdamW's with ``decoupled``) update of ``param``, ``m`` and ``v`` in place; ``step`` is the
    bias-corrected step size ``lr * sqrt(1 - beta2^t) / (1 - beta1^t)``."""
    if param.size == 0:
        return
    buffers = [_bind(device, array) for array in (param, m, v)]
    g_buf = device.to_device(np.ascontiguousarray(grad, np.float32))
    args = (
        buffers[0].buffer, g_buf.buffer, buffers[1].buffer, buffers[2].buffer,
        np.float32(beta1), np.float32(beta2), np.float32(1 - beta1), np.float32(1 - beta2),
        np.float32(step), np.float32(eps), np.float32(weight_decay), np.float32(lr * weight_decay),
        np.int32(decoupled),
    )  # fmt: skip
    device.enqueue(device.kernel("adam_update", SOURCE), (int(param.size),), None, args)
    for buffer, array in zip(buffers, (param, m, v)):
        _write_back(device, buffer, array)


def register(device: OpenCLDevice, updates: dict[str, Callable[..., None]]) -> None:
    """Add the update kernels, bound to ``device``, under their rule names."""
    updates["sgd"] = functools.partial(sgd_update, device)
    updates["adam"] = functools.partial(adam_update, device)
