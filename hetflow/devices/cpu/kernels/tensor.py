"""CPU kernels: data movement and shape ops.

Every kernel here keeps the input's dtype (Cast excepted) and works on any dtype numpy holds, numpy
object arrays included: the constant-folding pass runs Gather / Unsqueeze / Squeeze / Concat / Slice /
Identity / Reshape / Flatten over shape vectors whose entries may be symbols such as ``"N"``.
Reshape-like kernels return views (no copy) when numpy can; nothing in hetflow writes into a kernel's
inputs, so sharing memory is safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from onnx import TensorProto

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels.buffers import Out, output
from hetflow.devices.cpu.kernels.jit_copy import copy_rows_job, transpose_planes_job
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.tensor import (
    cast_dtype,
    fill_value,
    flatten_axis,
    normalize_axes,
    pad_widths,
    reshape_target,
    shape_range,
    slice_specs,
    split_sizes,
    transpose_perm,
)

Inputs = Sequence[np.ndarray | None]


def _ints(array: np.ndarray | None) -> list[int] | None:
    """An int tensor input as a Python list (None when omitted)."""
    if array is None:
        return None
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _scalar(array: np.ndarray | None, default: Any) -> Any:
    """The single element (a numpy scalar, dtype kept) of an optional scalar input, else ``default``."""
    if array is None or np.asarray(array).size == 0:
        return default
    return np.asarray(array).reshape(-1)[0]


def _prepare_concat(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """Concat bound to its planned output: a call as ``concat`` makes it, and, where every input already
    lies in its slice (its producer wrote there), a capture with no job: nothing is left to copy."""
    if out is None or out[0] is None:
        return None
    target, placed = out[0], out[1:]

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return concat(node, arrays, out, workspace)

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[object]] | None:
        inside = all(x is None or (i < len(placed) and x is placed[i]) for i, x in enumerate(arrays))
        return ([target], []) if inside else None

    return with_capture(call, capture)


@cpu_kernel("Concat", writes_out=True, prepare=_prepare_concat)
def concat(node: Node, inputs: Inputs, out: Out = None, workspace: np.ndarray | None = None) -> list[np.ndarray]:
    """Concatenation along ``axis``, into ``out[0]`` when given.

    The memory planner may have placed inputs in their slices of the output already (their producers
    wrote there): ``out[1 + i]`` is then the very array input ``i`` should be, and that input is not
    copied.
    """
    arrays = [x for x in inputs if x is not None]
    target = out[0] if out is not None else None
    if target is None or target.dtype == object:
        return [np.concatenate(arrays, axis=node.attrs.axis)]
    axis = node.attrs.axis % target.ndim
    shape = list(arrays[0].shape)
    shape[axis] = sum(x.shape[axis] for x in arrays)
    if tuple(shape) != target.shape or any(x.dtype != target.dtype for x in arrays):
        return [np.concatenate(arrays, axis=axis)]
    assert out is not None
    placed = out[1:]
    start = 0
    for index, x in enumerate(inputs):
        if x is None:
            continue
        stop = start + x.shape[axis]
        if index >= len(placed) or x is not placed[index]:
            target[(slice(None),) * axis + (slice(start, stop),)] = x
        start = stop
    return [target]


def _bound_input(arrays: Sequence[np.ndarray | None], shape: tuple[int, ...]) -> np.ndarray | None:
    """A capture's X: the first input where it has the bound ``shape`` and is C-contiguous, else None."""
    x = arrays[0]
    return x if x is not None and x.shape == shape and x.flags.c_contiguous else None


def _prepare_split(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """Split bound to its planned pieces: a call as ``split`` makes it, and, for a float32 X whose every
    piece has its planned C-contiguous buffer, a capture that copies each piece's rows in a compiled job
    (``jit_copy``), so that a captured run replays it."""
    x_info = inputs[0] if inputs else None
    if out is None or x_info is None or x_info.dtype != np.float32:
        return None
    shape = tuple(x_info.shape)
    if not all(isinstance(d, int) for d in shape) or len(out) != len(node.outputs):
        return None
    if any(t is None or t.dtype != np.float32 or not t.flags.c_contiguous or t.ndim != len(shape) for t in out):
        return None
    axis = normalize_axes([node.attrs.axis], len(shape))[0]
    sizes = [target.shape[axis] for target in out]
    if sum(sizes) != shape[axis]:
        return None
    rows, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1 :])

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return split(node, arrays, out, workspace)

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        x = _bound_input(arrays, shape)
        if x is None:
            return None
        flat, starts = x.reshape(-1), np.cumsum([0, *sizes[:-1]]) * inner
        jobs = [copy_rows_job(flat, target.reshape(-1), rows, int(start), shape[axis] * inner, min(rows, 4))
                for target, start in zip(out, starts)]  # fmt: skip
        return list(out), jobs

    return with_capture(call, capture)


@cpu_kernel("Split", writes_out=True, prepare=_prepare_split)
def split(node: Node, inputs: Inputs, out: Out = None, workspace: np.ndarray | None = None) -> list[np.ndarray]:
    """X cut along ``axis``, each piece copied into its own contiguous buffer (``out[i]`` when the runtime
    gives one): a piece of the channel axis of a batch is strided, and the kernels that read it (the
    one-group Convs ``split_conv_groups`` makes) run their fast paths on contiguous images only."""
    x = inputs[0]
    assert x is not None
    axis = normalize_axes([node.attrs.axis], x.ndim)[0]
    sizes = _ints(inputs[1]) if len(inputs) > 1 else None
    if sizes is None:
        sizes = split_sizes(x.shape[axis], node.attrs.num_outputs or len(node.outputs))
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not add up to the axis length {x.shape[axis]}")
    bounds = np.cumsum(sizes)[:-1]
    # NOTE: always copies (into a new array without a runtime's buffer): the runtime may reuse X's
    # memory once Split has run.
    pieces = np.split(x, bounds, axis=axis)
    targets = [output(out, index, piece.shape, piece.dtype) for index, piece in enumerate(pieces)]
    for target, piece in zip(targets, pieces, strict=True):
        np.copyto(target, piece)
    return targets


@cpu_kernel("Slice")
def slice_(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x, starts, ends = inputs[:3]
    assert x is not None and starts is not None and ends is not None
    axes = _ints(inputs[3]) if len(inputs) > 3 else None
    steps = _ints(inputs[4]) if len(inputs) > 4 else None
    specs = slice_specs(x.ndim, _ints(starts) or [], _ints(ends) or [], axes, steps)
    index = [slice(None)] * x.ndim
    for axis, (start, end, step) in specs.items():
        # NOTE: Python slices clamp exactly as ONNX specifies (INT64_MAX / INT64_MIN included).
        index[axis] = slice(start, end, step)
    return [x[tuple(index)]]


@cpu_kernel("Reshape")
def reshape(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x, shape = inputs
    assert x is not None and shape is not None
    target = reshape_target(x.shape, _ints(shape) or [], node.attrs.allowzero, "?")
    return [x.reshape(target)]


@cpu_kernel("Flatten")
def flatten(node: Node, inputs: Inputs) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    axis = flatten_axis(node.attrs.axis, x.ndim)
    # NOTE: math.prod, not np.prod: this runs once per run for every Flatten, and np.prod costs ~5 us.
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


def _prepare_transpose(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """Transpose bound to its planned output: a call as ``transpose`` makes it, and, for a float32 X
    whose permutation swaps two adjacent groups of axes (``_swapped_groups``: lstm-gesture's ``[N, seq,
    features]`` to time-major), a capture that transposes it in a compiled job (``jit_copy``)."""
    x_info = inputs[0] if inputs else None
    if out is None or out[0] is None or x_info is None or x_info.dtype != np.float32:
        return None
    shape = tuple(x_info.shape)
    groups = _swapped_groups(transpose_perm(node.attrs.perm, len(shape)), shape)
    target = out[0]
    if groups is None or not target.flags.c_contiguous or target.size != math.prod(shape):
        return None

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        return transpose(node, arrays, out, workspace)

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        x = _bound_input(arrays, shape)
        if x is None:
            return None
        planes, rows, columns, inner = groups
        return [target], [transpose_planes_job(x, target, planes, rows, columns, min(planes, 4), inner)]

    return with_capture(call, capture)


def _swapped_groups(perm: Sequence[int], shape: Sequence[int]) -> tuple[int, int, int, int] | None:
    """(planes, rows, columns, inner) where ``perm`` swaps two adjacent groups of ``shape``'s axes once
    its axes of length 1 are left out (``[planes, rows, columns, inner]`` to ``[planes, columns, rows,
    inner]``; rows or columns 1 where it only moves unit axes), else None."""
    kept = [axis for axis in perm if shape[axis] != 1]
    order = sorted(kept)
    for middle in range(len(order) + 1):
        for end in range(middle, len(order) + 1):
            for start in range(middle + 1):
                if kept == order[:start] + order[middle:end] + order[start:middle] + order[end:]:
                    sizes = [shape[a] for a in order]
                    return (math.prod(sizes[:start]), math.prod(sizes[start:middle]), math.prod(sizes[middle:end]),
                            math.prod(sizes[end:]))  # fmt: skip
    return None


@cpu_kernel("Transpose", writes_out=True, prepare=_prepare_transpose)
def transpose(node: Node, inputs: Inputs, out: Out = None, workspace: np.ndarray | None = None) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    # A physical transpose: later kernels (BLAS, convolutions) want contiguous inputs.
    view = np.transpose(x, transpose_perm(node.attrs.perm, x.ndim))
    y = output(out, 0, view.shape, x.dtype)
    np.copyto(y, view)
    return [y]


@cpu_kernel("Squeeze")
def squeeze(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axes = _ints(inputs[1]) if len(inputs) > 1 else None
    if axes is None:
        return [np.squeeze(x)]
    return [np.squeeze(x, axis=tuple(normalize_axes(axes, x.ndim)))]


@cpu_kernel("Unsqueeze")
def unsqueeze(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x, axes = inputs
    assert x is not None
    out_rank = x.ndim + len(_ints(axes) or [])
    return [np.expand_dims(x, axis=tuple(normalize_axes(_ints(axes) or [], out_rank)))]


@cpu_kernel("Pad")
def pad(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x, pads = inputs[:2]
    assert x is not None and pads is not None
    axes = _ints(inputs[3]) if len(inputs) > 3 else None
    widths = pad_widths(x.ndim, _ints(pads) or [], axes)
    # Negative pads crop; crop first, then pad what is positive.
    crop = tuple(slice(max(-b, 0), x.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(widths))
    x = x[crop]
    positive = [(max(b, 0), max(e, 0)) for b, e in widths]
    if not any(b or e for b, e in positive):
        return [x.copy()]
    mode = node.attrs.mode
    if mode == "constant":
        default = "" if x.dtype == object else 0
        value = _scalar(inputs[2] if len(inputs) > 2 else None, default)
        return [np.pad(x, positive, mode="constant", constant_values=value).astype(x.dtype, copy=False)]
    if mode not in ("reflect", "edge", "wrap"):
        raise ValueError(f"Pad mode {mode!r} is not supported")
    return [np.pad(x, positive, mode=mode)]


@cpu_kernel("Dropout")
def dropout(node: Node, inputs: Inputs) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    ratio = _scalar(inputs[1] if len(inputs) > 1 else None, np.float32(0.5))
    training = bool(_scalar(inputs[2] if len(inputs) > 2 else None, False))
    if not training or float(ratio) == 0.0:
        return [x.copy(), np.ones(x.shape, dtype=bool)]
    # NOTE: the legacy RandomState stream is what the ONNX reference uses for a given seed, so a
    # seeded node reproduces its expected outputs exactly (RandomState takes seeds in [0, 2**32)).
    seed = node.attrs.seed
    rng = np.random.RandomState(seed % 2**32) if seed is not None else np.random.RandomState()
    mask = rng.uniform(0.0, 1.0, x.shape) >= ratio
    scale = 1.0 / (1.0 - ratio)
    return [(mask * x * scale).astype(x.dtype, copy=False), mask]


@cpu_kernel("Identity")
def identity(node: Node, inputs: Inputs) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    # A copy, so that a graph output never aliases a feed.
    return [x.copy()]


@cpu_kernel("Shape")
def shape(node: Node, inputs: Inputs) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    start, end = shape_range(x.ndim, node.attrs.start, node.attrs.end)
    return [np.array(x.shape[start:end], dtype=np.int64)]


@cpu_kernel("Gather")
def gather(node: Node, inputs: Inputs) -> list[np.ndarray]:
    data, indices = inputs
    assert data is not None and indices is not None
    axis = normalize_axes([node.attrs.axis], data.ndim)[0]
    # np.take accepts negative indices (counting from the end) and raises IndexError out of range.
    taken = np.take(data, indices.astype(np.int64, copy=False), axis=axis)
    # A scalar index makes np.take return a numpy (or, for object arrays, Python) scalar.
    return [np.asarray(taken, dtype=data.dtype)]


@cpu_kernel("ConstantOfShape")
def constant_of_shape(node: Node, inputs: Inputs) -> list[np.ndarray]:
    (shape,) = inputs
    fill = fill_value(node.attrs.value)
    return [np.full(tuple(_ints(shape) or []), fill, dtype=fill.dtype)]


_FLOAT8 = frozenset(
    {
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
    }
)


@cpu_kernel("Cast")
def cast(node: Node, inputs: Inputs) -> list[np.ndarray]:
    (x,) = inputs
    assert x is not None
    to = node.attrs.to
    target = cast_dtype(to)
    if to == TensorProto.STRING:
        # numpy's str() of a float is the shortest text that reads back to the same value.
        return [x.astype(np.str_).astype(object)]
    if x.dtype == object:
        # Strings parse as decimal text ("3.5", "-INF", "NaN"); bool strings as numbers first.
        return [_from_strings(x, target)]
    if to == TensorProto.FLOAT8E8M0:
        from onnx.numpy_helper import to_float8e8m0

        return [to_float8e8m0(x, bool(node.attrs.saturate), node.attrs.round_mode).astype(target)]
    if to in _FLOAT8 and node.attrs.saturate and x.dtype.kind == "f":
        import ml_dtypes

        info = ml_dtypes.finfo(target)
        return [np.clip(x, info.min, info.max).astype(target)]
    return [x.astype(target)]


def _from_strings(x: np.ndarray, target: np.dtype) -> np.ndarray:
    if target == np.dtype(bool):
        return x.astype(np.float64).astype(bool)
    if target.kind in "iu":
        # Integers may be written as "12" or "1e3"; int() rejects the latter, so go through floats
        # only when needed.
        try:
            return np.array([int(v) for v in x.reshape(-1)], dtype=target).reshape(x.shape)
        except ValueError:
            return x.astype(np.float64).astype(target)
    return x.astype(np.float64).astype(target) if target.kind != "f" else x.astype(target)
