"""OpenCL LRN and BatchNormalization (inference form) on ``[N, C, ...]`` float32 (``norm.cl``).

BatchNormalization is usually folded into the preceding Conv by ``passes/fold_batchnorm.py``; this
kernel runs the ones that remain (DenseNet's pre-activation BN, graphs run without optimisation). The
per-channel factor ``scale / sqrt(var + epsilon)`` and shift ``bias - mean * factor`` are computed once
per parameter set on the host and kept on the device. The training form stays on the CPU. X may be a
host or a device tensor; Y comes back the same way (``common.result``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    act_args,
    act_options,
    device_inputs,
    float32_reason,
    i32,
    on_device,
    result,
    source,
)
from hetflow.graph import Node
from hetflow.ops.norm import lrn_window

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("epilogue.cl", "norm.cl")


def _planes(x: Tensor) -> tuple[int, int, int]:
    return x.shape[0], x.shape[1], math.prod(x.shape[2:])


def _supports_lrn(node: Node, inputs: InputInfos) -> str | None:
    return float32_reason(node, inputs)


def _supports_batchnorm(node: Node, inputs: InputInfos) -> str | None:
    attrs = node.attrs
    if attrs.training_mode:
        return "OpenCL BatchNormalization runs the inference form only (training_mode=0)"
    if any(name for name in node.outputs[1:]):
        return "OpenCL BatchNormalization computes Y only (no running statistics)"
    if inputs is not None and inputs[0] is not None and len(inputs[0].shape) < 2:
        return "OpenCL BatchNormalization needs [N, C, ...]"
    if inputs is not None and inputs[1] is not None and len(inputs[1].shape) != 1:
        return "OpenCL BatchNormalization needs per-channel parameters (spatial=1)"
    return float32_reason(node, inputs)


def run_lrn(device: OpenCLDevice, node: Node, x: Tensor) -> Tensor:
    """LRN across channels of ``x`` ``[N, C, ...]``."""
    attrs = node.attrs
    n, c, p = _planes(x)
    before, after = lrn_window(attrs.size)
    kernel = device.kernel("lrn", SOURCE)
    x_buf = on_device(device, x)
    y = device.empty(x.shape)
    args = (
        x_buf.buffer, y.buffer, *i32(c, p, before, after),
        np.float32(attrs.alpha / attrs.size), np.float32(attrs.bias), np.float32(attrs.beta),
    )  # fmt: skip
    device.enqueue(kernel, (p, c, n), None, args)
    return result(device, y, x)


def _folded(scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float) -> np.ndarray:
    factor = scale.astype(np.float32) / np.sqrt(var.astype(np.float32) + np.float32(epsilon))
    shift = bias.astype(np.float32) - mean.astype(np.float32) * factor
    return np.ascontiguousarray(np.stack([factor, shift]), np.float32)


def run_batchnorm(device: OpenCLDevice, node: Node, inputs: Sequence[Tensor | None]) -> Tensor:
    """Inference BatchNormalization of ``x`` ``[N, C, ...]`` with host parameters (kept resident)."""
    x, scale, bias, mean, var = inputs
    assert isinstance(scale, np.ndarray) and isinstance(bias, np.ndarray)
    assert isinstance(mean, np.ndarray) and isinstance(var, np.ndarray)
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    n, c, p = _planes(x)
    epsilon = float(node.attrs.epsilon)
    # Keyed by the scale array and the other three: a session passes the same initializers every run.
    key = ("batchnorm", id(bias), id(mean), id(var), epsilon)
    params = device.resident.get(
        scale, key, lambda: device.to_device(_folded(scale, bias, mean, var, epsilon))
    )
    fused = node.attrs.fused
    kernel = device.kernel("batchnorm", SOURCE, act_options(fused))
    x_buf = on_device(device, x)
    y = device.empty(x.shape)
    device.enqueue(kernel, (p, c, n), None, (x_buf.buffer, y.buffer, params.buffer, *i32(c, p), *act_args(fused)))
    return result(device, y, x)


def register(device: OpenCLDevice) -> None:
    """Add LRN and BatchNormalization to ``device``'s kernel table."""

    @device.kernels.register("LRN", supports=_supports_lrn)
    @device_inputs((0,))
    def lrn(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """LRN across channels, one work-item per element."""
        x = inputs[0]
        assert x is not None
        return [run_lrn(device, node, x)]

    @device.kernels.register("BatchNormalization", supports=_supports_batchnorm)
    @device_inputs((0,))
    def batchnorm(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """BatchNormalization (inference), one work-item per element."""
        return [run_batchnorm(device, node, inputs)]
