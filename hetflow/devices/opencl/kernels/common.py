"""Pieces every OpenCL launcher uses: reading ``.cl`` sources, the fused-activation epilogue's build
option and arguments, float32 checks for ``supports``, and the operand conventions.

Operands: a launcher's tensor arguments are numpy arrays or ``DeviceArray`` values (``Tensor``). It
returns a ``DeviceArray`` when any of them was one, else a numpy array (``result``): numpy in, numpy out
for direct callers (tests, the trainer), device in, device out for the executor, which keeps values on
the device between OpenCL nodes. ``device_inputs`` declares which inputs of a kernel the executor
hands over as device buffers; the others (weights, shapes, bounds) arrive as host arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

#: A launcher's tensor argument: host or device.
Tensor = np.ndarray | DeviceArray
#: Positions of a kernel's inputs it takes as device buffers, or ``"all"``.
DeviceInputs = tuple[int, ...] | Literal["all"]

F = TypeVar("F", bound=Callable[..., object])

HERE = Path(__file__).parent

#: ``ACT`` codes of epilogue.cl (and gemm.cl).
ACTIVATION_CODES = {None: 0, "Relu": 1, "LeakyRelu": 2, "Clip": 3, "Sigmoid": 4, "Tanh": 5}


def source(*names: str) -> str:
    """The ``.cl`` files ``names`` (beside this module) joined into one program source."""
    return "\n".join((HERE / name).read_text(encoding="utf-8") for name in names)


def source_paths(*names: str) -> tuple[str, ...]:
    """Absolute paths of ``.cl`` files (tuning hashes them with the launcher's own source)."""
    return tuple(str(HERE / name) for name in names)


def act_options(fused: FusedActivation | None) -> tuple[str, ...]:
    """Build options selecting the fused activation of epilogue.cl."""
    return (f"-DACT={ACTIVATION_CODES[fused.op_type if fused is not None else None]}",)


def act_args(fused: FusedActivation | None) -> tuple[np.float32, np.float32]:
    """The epilogue's ``act_a``, ``act_b`` kernel arguments."""
    if fused is None:
        return np.float32(0), np.float32(0)
    return np.float32(fused.alpha), np.float32(fused.beta)


def float32_reason(node: Node, inputs: InputInfos, indices: Sequence[int] | None = None) -> str | None:
    """A reason when any of the (selected) known inputs is not float32."""
    if inputs is None:
        return None
    chosen = range(len(inputs)) if indices is None else indices
    for index in chosen:
        info = inputs[index] if index < len(inputs) else None
        if info is not None and info.dtype != np.float32:
            return f"OpenCL {node.op_type} runs float32 only, got {info.dtype}"
    return None


def rank_reason(node: Node, inputs: InputInfos, rank: int) -> str | None:
    """A reason when the first input's rank is known and is not ``rank``."""
    if inputs is None or inputs[0] is None:
        return None
    if len(inputs[0].shape) != rank:
        return f"OpenCL {node.op_type} runs rank-{rank} inputs only, got rank {len(inputs[0].shape)}"
    return None


def i32(*values: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(v) for v in values)


def device_inputs(positions: DeviceInputs) -> Callable[[F], F]:
    """Decorator for a kernel function: the executor hands the inputs at ``positions`` over as device
    buffers (``OpenCLDevice.device_inputs`` reads it); every other input arrives on the host."""

    def mark(fn: F) -> F:
        fn.device_inputs = positions  # type: ignore[attr-defined]
        return fn

    return mark


def on_device(device: OpenCLDevice, x: Tensor, dtype: type = np.float32) -> DeviceArray:
    """``x`` as a device buffer: itself when it is one; a read-only host array (a weight or constant)
    through the resident cache, so it is uploaded once; any other host array uploaded now (its buffer
    parked until the queue is next waited on)."""
    if isinstance(x, DeviceArray):
        return x
    if not x.flags.writeable and x.dtype == dtype:
        return device.resident.get(x, ("operand", np.dtype(dtype).str), lambda: _upload_copy(device, x, dtype))
    uploaded = device.to_device(np.ascontiguousarray(x, dtype))
    device.park(uploaded)
    return uploaded


def _upload_copy(device: OpenCLDevice, x: np.ndarray, dtype: type) -> DeviceArray:
    # NOTE: a private copy: wrapping ``x`` itself would tie the resident entry to the array it is keyed by.
    return device.to_device(np.array(x, dtype, order="C"))


def on_host(device: OpenCLDevice, x: Tensor | None) -> np.ndarray | None:
    """``x`` as a host array (brought back from the device when it is a device buffer)."""
    if isinstance(x, DeviceArray):
        return device.to_host(x)
    return x


def any_on_device(*tensors: object) -> bool:
    return any(isinstance(t, DeviceArray) for t in tensors)


def result(device: OpenCLDevice, out: DeviceArray, *inputs: object) -> Tensor:
    """``out`` as the caller expects it: left on the device when any of ``inputs`` was on the device,
    else brought to the host (numpy in, numpy out)."""
    if any_on_device(*inputs):
        return out
    host = device.to_host(out)
    device.release(out)  # back to the pool when the host has a copy; parked when ``host`` maps it
    return host
