"""OpenCL elementwise ops: Add/Sub/Mul/Div with numpy broadcasting, and Relu/LeakyRelu/Clip/Sigmoid/Tanh.

``elementwise.cl`` holds two macro templates; this module instantiates one kernel per op from its
expression, so every op is a single line below and all of them build as one program. Operands may be
host or device tensors (``common.Tensor``); constants (read-only initializers) are uploaded once, and
the broadcast metadata of each shape combination is a device constant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import Tensor, device_inputs, on_device, on_host, result
from hetflow.graph import Node

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

#: Broadcast rank the kernels handle (``MAX_RANK`` in elementwise.cl).
MAX_RANK = 8

#: Binary op -> expression of ``x`` (A's element) and ``z`` (B's element).
BINARY_OPS = {"Add": "x + z", "Sub": "x - z", "Mul": "x * z", "Div": "x / z"}

#: Unary op -> expression of ``x`` and the parameters ``p0``, ``p1``. Comparisons are written so that
#: NaN passes through, as numpy's do.
UNARY_OPS = {
    "Relu": "x < 0.0f ? 0.0f : x",
    "LeakyRelu": "x < 0.0f ? x * p0 : x",
    "Clip": "(x < p0 ? p0 : x) > p1 ? p1 : (x < p0 ? p0 : x)",
    "Sigmoid": "1.0f / (1.0f + exp(-x))",
    "Tanh": "tanh(x)",
}


def _generate() -> str:
    template = Path(__file__).with_name("elementwise.cl").read_text(encoding="utf-8")
    lines = [template, ""]
    lines += [f"BINARY({_kernel_name(op)}, {expr})" for op, expr in BINARY_OPS.items()]
    lines += [f"UNARY({_kernel_name(op)}, {expr})" for op, expr in UNARY_OPS.items()]
    return "\n".join(lines) + "\n"


def _kernel_name(op_type: str) -> str:
    return f"ew_{op_type.lower()}"


SOURCE = _generate()


def broadcast_meta(out_shape: tuple[int, ...], *shapes: tuple[int, ...]) -> np.ndarray:
    """The output shape followed by each input's element strides into the output's index space (0 along
    broadcast axes), each padded to ``MAX_RANK`` entries."""
    rank = len(out_shape)
    meta = np.zeros((1 + len(shapes), MAX_RANK), np.int32)
    meta[0, :rank] = out_shape
    for row, shape in enumerate(shapes, start=1):
        aligned = (1,) * (rank - len(shape)) + tuple(shape)
        stride = 1
        for axis in range(rank - 1, -1, -1):
            meta[row, axis] = stride if aligned[axis] != 1 else 0
            stride *= aligned[axis]
    return meta.reshape(-1)


def _float32_up_to_max_rank(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None:
        return None
    for info in inputs[:2]:
        if info is None:
            continue
        if info.dtype != np.float32:
            return f"OpenCL {node.op_type} runs float32 only, got {info.dtype}"
        if len(info.shape) > MAX_RANK:
            return f"OpenCL {node.op_type} broadcasts up to rank {MAX_RANK}, got rank {len(info.shape)}"
    return None


def _float32_all_up_to_max_rank(node: Node, inputs: InputInfos) -> str | None:
    if inputs is None:
        return None
    for info in inputs:
        if info is not None and (info.dtype != np.float32 or len(info.shape) > MAX_RANK):
            return f"OpenCL {node.op_type} runs float32 up to rank {MAX_RANK}"
    return None


def run_binary(device: OpenCLDevice, op_type: str, a: Tensor, b: Tensor) -> Tensor:
    """``a <op> b`` with broadcasting on the device."""
    out_shape = tuple(np.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
    count = math.prod(out_shape)
    if count == 0:
        return result(device, device.empty(out_shape), a, b)
    same = tuple(a.shape) == out_shape and tuple(b.shape) == out_shape
    kernel = device.kernel(_kernel_name(op_type), SOURCE)
    a_buf, b_buf = on_device(device, a), on_device(device, b)
    key = ("broadcast", out_shape, tuple(a.shape), tuple(b.shape))
    meta_buf = device.constant(key, lambda: broadcast_meta(out_shape, tuple(a.shape), tuple(b.shape)))
    out = device.empty(out_shape, np.float32)
    args = (
        np.int32(count), np.int32(len(out_shape)), np.int32(same),
        a_buf.buffer, b_buf.buffer, out.buffer, meta_buf.buffer,
    )  # fmt: skip
    device.enqueue(kernel, (count,), None, args)
    return result(device, out, a, b)


def run_unary(device: OpenCLDevice, op_type: str, x: Tensor, p0: float = 0.0, p1: float = 0.0) -> Tensor:
    """``op(x; p0, p1)`` on the device."""
    out = device.empty(tuple(x.shape), np.float32)
    if x.size == 0:
        return result(device, out, x)
    kernel = device.kernel(_kernel_name(op_type), SOURCE)
    x_buf = on_device(device, x)
    args = (np.int32(x.size), x_buf.buffer, out.buffer, np.float32(p0), np.float32(p1))
    device.enqueue(kernel, (x.size,), None, args)
    return result(device, out, x)


def _clip_bounds(device: OpenCLDevice, inputs: Sequence[Tensor | None]) -> tuple[float, float]:
    low = on_host(device, inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
    high = on_host(device, inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
    return (
        float(np.asarray(low).reshape(())) if low is not None else -np.inf,
        float(np.asarray(high).reshape(())) if high is not None else np.inf,
    )


def register(device: OpenCLDevice) -> None:
    """Add the elementwise ops to ``device``'s kernel table."""
    for op_type in BINARY_OPS:
        device.kernels.register(op_type, supports=_float32_up_to_max_rank)(_binary_kernel(device, op_type))
    for op_type in UNARY_OPS:
        device.kernels.register(op_type, supports=_float32_up_to_max_rank)(_unary_kernel(device, op_type))

    @device.kernels.register("Sum", supports=_float32_all_up_to_max_rank)
    @device_inputs("all")
    def sum_(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Sum of any number of inputs with broadcasting: one Add launch per extra input."""
        arrays = [a for a in inputs if a is not None]
        first = arrays[0]
        if len(arrays) == 1:
            if isinstance(first, np.ndarray):
                return [np.array(first, np.float32)]
            return [device.copy(on_device(device, first))]
        total = run_binary(device, "Add", first, arrays[1])
        for other in arrays[2:]:
            partial = total
            total = run_binary(device, "Add", partial, other)
            if partial is not total and not isinstance(partial, np.ndarray):
                device.release(partial)  # an intermediate sum, read only by the launch just queued
        return [activated(device, node, total)]


def activated(device: OpenCLDevice, node: Node, value: Tensor) -> Tensor:
    """``value`` (a new array the caller owns) with the node's fused activation applied by a second
    launch (Add's and Sum's), or ``value`` itself when there is none."""
    fused = getattr(node.attrs, "fused", None)
    if fused is None:
        return value
    # UNARY_OPS read LeakyRelu's slope and Clip's bounds from p0, p1, as FusedActivation holds them.
    applied = run_unary(device, fused.op_type, value, fused.alpha, fused.beta)
    if not isinstance(value, np.ndarray):
        device.release(value)  # the sum, read only by the launch just queued
    return applied


def _binary_kernel(device: OpenCLDevice, op_type: str):  # noqa: ANN202  (a KernelFn)
    @device_inputs((0, 1))
    def kernel(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        a, b = inputs
        assert a is not None and b is not None
        return [activated(device, node, run_binary(device, op_type, a, b))]

    kernel.__doc__ = f"OpenCL {op_type} with numpy broadcasting (then Add's fused activation, if any)."
    return kernel


def _unary_kernel(device: OpenCLDevice, op_type: str):  # noqa: ANN202  (a KernelFn)
    @device_inputs((0,))
    def kernel(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        x = inputs[0]
        assert x is not None
        if op_type == "LeakyRelu":
            p0, p1 = float(node.attrs.alpha), 0.0
        elif op_type == "Clip":
            p0, p1 = _clip_bounds(device, inputs)
        else:
            p0 = p1 = 0.0
        return [run_unary(device, op_type, x, p0, p1)]

    kernel.__doc__ = f"OpenCL {op_type}."
    return kernel
