"""OpenCL tensor ops: Concat (each input written into its slice of one output), Transpose, and the
views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, inference Dropout) that move no data.

Views only change the shape the next kernel reads: on the device they are metadata, so their kernels
reshape without launching anything. Shape arithmetic comes from ``hetflow.ops.tensor`` (the same
helpers shape inference and the CPU kernels use).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl.kernels.common import float32_reason, source
from hetflow.graph import Node
from hetflow.ops.tensor import flatten_axis, normalize_axes, reshape_target, transpose_perm

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("tensor.cl")
MAX_RANK = 8


def _ints(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def _supports_data(node: Node, inputs: InputInfos) -> str | None:
    """The data input is float32 (shape and axes inputs are host integers, read as such)."""
    return float32_reason(node, inputs, [0])


def _supports_concat(node: Node, inputs: InputInfos) -> str | None:
    return float32_reason(node, inputs)


def _supports_transpose(node: Node, inputs: InputInfos) -> str | None:
    if inputs is not None and inputs[0] is not None and len(inputs[0].shape) > MAX_RANK:
        return f"OpenCL Transpose handles up to rank {MAX_RANK}"
    return float32_reason(node, inputs)


def _supports_dropout(node: Node, inputs: InputInfos) -> str | None:
    if len(node.outputs) > 1 and node.outputs[1]:
        return "OpenCL Dropout does not produce a mask"
    if len(node.inputs) > 2 and node.inputs[2]:
        return "OpenCL Dropout runs the inference form only (no training_mode input)"
    return float32_reason(node, inputs, [0])


def run_concat(device: OpenCLDevice, arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
    """``np.concatenate(arrays, axis)`` with one slice copy per input into one device buffer."""
    first = arrays[0]
    axis = axis + first.ndim if axis < 0 else axis
    total = sum(a.shape[axis] for a in arrays)
    shape = (*first.shape[:axis], total, *first.shape[axis + 1 :])
    outer = math.prod(first.shape[:axis])
    after = math.prod(first.shape[axis + 1 :])
    out = device.empty(shape)
    if math.prod(shape) == 0:
        return np.empty(shape, np.float32)
    kernel = device.kernel("copy_slice", SOURCE)
    buffers = []
    offset = 0
    for array in arrays:
        inner = array.shape[axis] * after
        if inner and outer:
            buffer = device.to_device(np.ascontiguousarray(array, np.float32))
            buffers.append(buffer)  # alive until the copies have run (to_host waits for them)
            args = (buffer.buffer, out.buffer, np.int32(inner), np.int64(total * after), np.int64(offset))
            device.enqueue(kernel, (inner, outer), None, args)
        offset += inner
    return device.to_host(out)


def run_transpose(device: OpenCLDevice, x: np.ndarray, perm: Sequence[int]) -> np.ndarray:
    """``np.transpose(x, perm)`` as a contiguous array."""
    shape = tuple(x.shape[p] for p in perm)
    if x.size == 0 or x.ndim == 0:
        return np.ascontiguousarray(np.transpose(x, perm))
    strides = [math.prod(x.shape[axis + 1 :]) for axis in range(x.ndim)]
    meta = np.zeros((2, MAX_RANK), np.int64)
    meta[0, : x.ndim] = shape
    meta[1, : x.ndim] = [strides[p] for p in perm]
    kernel = device.kernel("transpose", SOURCE)
    x_buf = device.to_device(np.ascontiguousarray(x, np.float32))
    meta_buf = device.to_device(meta.reshape(-1))
    y = device.empty(shape)
    device.enqueue(kernel, (x.size,), None, (np.int32(x.size), np.int32(x.ndim), x_buf.buffer, y.buffer,
                                             meta_buf.buffer))  # fmt: skip
    return device.to_host(y)


def register(device: OpenCLDevice) -> None:
    """Add Concat, Transpose and the views to ``device``'s kernel table."""

    @device.kernels.register("Concat", supports=_supports_concat)
    def concat(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Concat: each input copied into its slice of the output."""
        arrays = [a for a in inputs if a is not None]
        return [run_concat(device, arrays, int(node.attrs.axis))]

    @device.kernels.register("Transpose", supports=_supports_transpose)
    def transpose(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Transpose: one work-item per output element."""
        x = inputs[0]
        assert x is not None
        return [run_transpose(device, x, transpose_perm(node.attrs.perm, x.ndim))]

    @device.kernels.register("Reshape", supports=_supports_data)
    def reshape(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Reshape: a view."""
        x, shape = inputs[0], inputs[1]
        assert x is not None and shape is not None
        return [x.reshape(reshape_target(x.shape, _ints(shape) or [], node.attrs.allowzero, "?"))]

    @device.kernels.register("Flatten", supports=_supports_data)
    def flatten(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Flatten: a view."""
        x = inputs[0]
        assert x is not None
        axis = flatten_axis(node.attrs.axis, x.ndim)
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]

    @device.kernels.register("Squeeze", supports=_supports_data)
    def squeeze(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Squeeze: a view."""
        x = inputs[0]
        assert x is not None
        axes = _ints(inputs[1]) if len(inputs) > 1 else None
        if axes is None:
            return [np.squeeze(x)]
        return [np.squeeze(x, axis=tuple(normalize_axes(axes, x.ndim)))]

    @device.kernels.register("Unsqueeze", supports=_supports_data)
    def unsqueeze(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Unsqueeze: a view."""
        x = inputs[0]
        assert x is not None
        axes = _ints(inputs[1]) or []
        return [np.expand_dims(x, axis=tuple(normalize_axes(axes, x.ndim + len(axes))))]

    @device.kernels.register("Identity", supports=_supports_data)
    def identity(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Identity: the input itself."""
        x = inputs[0]
        assert x is not None
        return [x]

    @device.kernels.register("Dropout", supports=_supports_dropout)
    def dropout(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        """Dropout at inference: the input itself."""
        x = inputs[0]
        assert x is not None
        return [x]
