"""OpenCL tensor ops: Concat (each input written into its slice of one output), Transpose, and the
views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, inference Dropout) that move no data.

Views only change the shape the next kernel reads: on the device they are metadata, so their kernels
reshape without launching anything (a ``DeviceArray`` view shares its buffer). Shape arithmetic comes
from ``hetflow.ops.tensor`` (the same helpers shape inference and the CPU kernels use). Data inputs may
be host or device tensors; results come back the same way (``common.result``); shape and axes inputs
are host integers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.opencl import DeviceArray
from hetflow.devices.opencl.kernels.common import (
    Tensor,
    device_inputs,
    float32_reason,
    on_device,
    on_host,
    result,
    source,
)
from hetflow.graph import Node
from hetflow.ops.tensor import flatten_axis, normalize_axes, reshape_target, transpose_perm

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice

SOURCE = source("tensor.cl")
MAX_RANK = 8


def _ints(array: np.ndarray | None) -> list[int] | None:
    return None if array is None else [int(v) for v in np.asarray(array).reshape(-1)]


def squeezed_shape(shape: Sequence[int], axes: Sequence[int] | None) -> tuple[int, ...]:
    """``shape`` without the listed axes (every size-1 axis when ``axes`` is None), as ``np.squeeze``."""
    if axes is None:
        return tuple(d for d in shape if d != 1)
    drop = set(normalize_axes(list(axes), len(shape)))
    return tuple(d for axis, d in enumerate(shape) if axis not in drop)


def unsqueezed_shape(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, ...]:
    """``shape`` with size-1 axes inserted at ``axes`` (of the result), as ``np.expand_dims``."""
    rank = len(shape) + len(axes)
    inserted = set(normalize_axes(list(axes), rank))
    rest = iter(shape)
    return tuple(1 if axis in inserted else next(rest) for axis in range(rank))


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


def run_concat(device: OpenCLDevice, arrays: Sequence[Tensor], axis: int) -> Tensor:
    """``np.concatenate(arrays, axis)`` with one slice copy per input into one device buffer."""
    first = arrays[0]
    axis = axis + first.ndim if axis < 0 else axis
    total = sum(a.shape[axis] for a in arrays)
    shape = (*first.shape[:axis], total, *first.shape[axis + 1 :])
    outer = math.prod(first.shape[:axis])
    after = math.prod(first.shape[axis + 1 :])
    out = device.empty(shape)
    if math.prod(shape) == 0:
        return result(device, out, *arrays)
    kernel = device.kernel("copy_slice", SOURCE)
    offset = 0
    for array in arrays:
        inner = array.shape[axis] * after
        if inner and outer:
            buffer = on_device(device, array)
            args = (buffer.buffer, out.buffer, np.int32(inner), np.int64(total * after), np.int64(offset))
            device.enqueue(kernel, (inner, outer), None, args)
        offset += inner
    return result(device, out, *arrays)


def run_transpose(device: OpenCLDevice, x: Tensor, perm: Sequence[int]) -> Tensor:
    """``np.transpose(x, perm)`` as a contiguous array."""
    shape = tuple(x.shape[p] for p in perm)
    if x.size == 0 or x.ndim == 0:
        if isinstance(x, DeviceArray):
            return x.reshape(shape)  # no element moves
        return np.ascontiguousarray(np.transpose(x, perm))
    kernel = device.kernel("transpose", SOURCE)
    meta_buf = device.constant(("transpose", tuple(x.shape), tuple(perm)), lambda: _transpose_meta(x.shape, perm))
    x_buf = on_device(device, x)
    y = device.empty(shape)
    device.enqueue(kernel, (x.size,), None, (np.int32(x.size), np.int32(x.ndim), x_buf.buffer, y.buffer,
                                             meta_buf.buffer))  # fmt: skip
    return result(device, y, x)


def _transpose_meta(in_shape: Sequence[int], perm: Sequence[int]) -> np.ndarray:
    """The output shape, then the input stride of each output axis (``MAX_RANK`` entries each)."""
    rank = len(in_shape)
    strides = [math.prod(in_shape[axis + 1 :]) for axis in range(rank)]
    meta = np.zeros((2, MAX_RANK), np.int64)
    meta[0, :rank] = [in_shape[p] for p in perm]
    meta[1, :rank] = [strides[p] for p in perm]
    return meta.reshape(-1)


def register(device: OpenCLDevice) -> None:
    """Add Concat, Transpose and the views to ``device``'s kernel table."""

    @device.kernels.register("Concat", supports=_supports_concat)
    @device_inputs("all")
    def concat(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Concat: each input copied into its slice of the output."""
        arrays = [a for a in inputs if a is not None]
        return [run_concat(device, arrays, int(node.attrs.axis))]

    @device.kernels.register("Transpose", supports=_supports_transpose)
    @device_inputs((0,))
    def transpose(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Transpose: one work-item per output element."""
        x = inputs[0]
        assert x is not None
        return [run_transpose(device, x, transpose_perm(node.attrs.perm, x.ndim))]

    @device.kernels.register("Reshape", supports=_supports_data)
    @device_inputs((0,))
    def reshape(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Reshape: a view."""
        x, shape = inputs[0], on_host(device, inputs[1])
        assert x is not None and shape is not None
        return [x.reshape(reshape_target(x.shape, _ints(shape) or [], node.attrs.allowzero, "?"))]

    @device.kernels.register("Flatten", supports=_supports_data)
    @device_inputs((0,))
    def flatten(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Flatten: a view."""
        x = inputs[0]
        assert x is not None
        axis = flatten_axis(node.attrs.axis, x.ndim)
        return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]

    @device.kernels.register("Squeeze", supports=_supports_data)
    @device_inputs((0,))
    def squeeze(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Squeeze: a view."""
        x = inputs[0]
        assert x is not None
        axes = _ints(on_host(device, inputs[1])) if len(inputs) > 1 else None
        return [x.reshape(squeezed_shape(x.shape, axes))]

    @device.kernels.register("Unsqueeze", supports=_supports_data)
    @device_inputs((0,))
    def unsqueeze(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Unsqueeze: a view."""
        x = inputs[0]
        assert x is not None
        axes = _ints(on_host(device, inputs[1])) or []
        return [x.reshape(unsqueezed_shape(x.shape, axes))]

    @device.kernels.register("Identity", supports=_supports_data)
    @device_inputs((0,))
    def identity(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Identity: the input itself."""
        x = inputs[0]
        assert x is not None
        return [x]

    @device.kernels.register("Dropout", supports=_supports_dropout)
    @device_inputs((0,))
    def dropout(node: Node, inputs: Sequence[Tensor | None]) -> list[Tensor]:
        """Dropout at inference: the input itself."""
        x = inputs[0]
        assert x is not None
        return [x]
