"""CPU kernels: pooling.

Windowed pools loop over the window taps only (9 for a 3x3 window); each tap is one strided slice of
the padded input covering every output position of every image and channel, so the arithmetic is
vectorised over N*C*prod(out) elements. The geometry comes from ``hetflow.ops.spatial`` like Conv's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.buffers import Out, Scratch, deliver, output, scratch_bytes
from hetflow.devices.cpu.kernels.conv import pad_into, padding_scratch
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.pool import pool_window
from hetflow.ops.spatial import AxisGeometry, Geometry, geometry

Workspace = np.ndarray | None


def _separable_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """The padded input, plus the separable 2-D path's two partial-result buffers (each at most the
    padded input's size)."""
    x = inputs[0]
    if x is None:
        return 0
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    dtype = _compute_dtype(node, x.dtype)
    padded = padding_scratch(geo, x.shape, dtype)
    if not _fast_2d(node, len(geo.axes)):
        return scratch_bytes(padded)
    flat = (math.prod((int(x.shape[0]), int(x.shape[1]), *(a.padded for a in geo.axes))),)
    return scratch_bytes([*padded, (flat, dtype), (flat, dtype)])


def _compute_dtype(node: Node, dtype: np.dtype) -> np.dtype:
    """AveragePool sums float16 in float32; everything else computes in its own dtype."""
    return np.dtype(np.float32) if dtype == np.float16 and node.op_type == "AveragePool" else np.dtype(dtype)


def _fast_2d(node: Node, rank: int) -> bool:
    """Whether the separable 2-D path applies: two spatial axes, no Indices output."""
    return rank == 2 and not (len(node.outputs) > 1 and bool(node.outputs[1]))


def _lowest(dtype: np.dtype) -> float | int:
    """The value padding takes in a max pool: it never wins against real input."""
    return -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)


@cpu_kernel("MaxPool", writes_out=True, workspace=_separable_workspace)
def max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray | None]:
    """MaxPool on ``[N, C, *spatial]``, any dtype it allows; Indices (int64) when the node asks for them.

    2-D pools without Indices take the separable path (``_separable_2d``); the rest loop over the taps.
    """
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    scratch = Scratch(workspace)
    padded = pad_into(geo, x, scratch, _lowest(x.dtype))
    if _fast_2d(node, len(geo.axes)) and padded.flags.c_contiguous:
        return [_separable_2d(padded, geo, scratch, out, np.maximum), None]
    want_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    y: np.ndarray | None = None
    best = np.zeros((), dtype=np.int64)  # winning tap per output element (only with indices)
    for index, tap in enumerate(geo.taps()):
        source = padded[(..., *geo.tap_slices(tap))]
        if y is None:
            y = output(out, 0, source.shape, x.dtype)
            np.copyto(y, source)
            if want_indices:
                best = np.zeros(y.shape, dtype=np.int64)
        elif want_indices:
            # Strictly greater keeps the first maximum, as ONNX's reference and ONNX Runtime do.
            better = source > y
            np.copyto(y, source, where=better)
            np.copyto(best, index, where=better)
        else:
            np.maximum(y, source, out=y)
    assert y is not None
    indices = _flat_indices(best, x.shape, geo, node.attrs.storage_order) if want_indices else None
    return [y, indices]


#: Output rows shorter than this take the flat path even when strided: numpy's per-row overhead on
#: short strided rows outweighs the work the strided path saves (3x3/2 max pool, one core: 576x14x14
#: 0.13 ms flat vs 0.28 ms strided; 64x112x112 1.47 ms flat vs 1.05 ms strided).
STRIDED_MIN_ROW = 16


def _separable_2d(padded: np.ndarray, geo: Geometry, scratch: Scratch, out: Out, combine: np.ufunc) -> np.ndarray:
    """A 2-D window reduction (``combine``: np.maximum or np.add) of a padded ``[N, C, Hp, Wp]``, first
    along each row, then down the columns: (kw - 1) + (kh - 1) passes instead of kh*kw - 1.

    Stride 1, or short output rows, run each pass on long flat vectors (``_flat_2d``); otherwise each
    pass reads strided views that visit only the window starts the output needs (``_strided_2d``), so a
    stride-2 pool does a quarter of the work of reducing every position.
    """
    rows, cols = geo.axes
    unit_stride = rows.stride == 1 and cols.stride == 1
    if padded.flags.c_contiguous and (unit_stride or cols.out < STRIDED_MIN_ROW):
        return _flat_2d(padded, geo, scratch, out, combine)
    return _strided_2d(padded, geo, scratch, out, combine)


def _flat_2d(padded: np.ndarray, geo: Geometry, scratch: Scratch, out: Out, combine: np.ufunc) -> np.ndarray:
    """Reduction of a contiguous padded input as running reductions over shifted flat views.

    Flattened, the window tap (i, j) of output (h, w) sits at ``base + i*dh*Wp + j*dw`` from the tap
    (0, 0), so the reduction over the taps of a row, then over the rows, is a handful of ufunc calls
    on long contiguous vectors (SIMD, no per-row loop). Positions that run past a row or a channel only
    hold garbage that is never read back: the output is the strided view of the valid window starts.
    """
    rows, cols = geo.axes
    height, width = padded.shape[2:]
    flat = padded.reshape(-1)
    across = flat.size - (cols.kernel - 1) * cols.dilation
    row_part = scratch.take((across,), padded.dtype)
    _running(combine, flat, cols.kernel, cols.dilation, row_part)
    length = across - (rows.kernel - 1) * rows.dilation * width
    window = scratch.take((length,), padded.dtype)
    _running(combine, row_part, rows.kernel, rows.dilation * width, window)
    item = padded.itemsize
    starts = np.lib.stride_tricks.as_strided(
        window,
        (*padded.shape[:2], rows.out, cols.out),
        (padded.shape[1] * height * width * item, height * width * item, rows.stride * width * item,
         cols.stride * item),
        writeable=False,
    )
    y = output(out, 0, starts.shape, padded.dtype)
    np.copyto(y, starts)
    return y


def _running(combine: np.ufunc, source: np.ndarray, taps: int, step: int, target: np.ndarray) -> None:
    """``target[q] = combine(source[q + t*step] for t < taps)`` for every q of ``target``."""
    size = target.size
    if taps == 1:
        np.copyto(target, source[:size])
        return
    combine(source[:size], source[step : step + size], out=target)
    for tap in range(2, taps):
        combine(target, source[tap * step : tap * step + size], out=target)


def _strided_2d(padded: np.ndarray, geo: Geometry, scratch: Scratch, out: Out, combine: np.ufunc) -> np.ndarray:
    """Any-stride reduction: along rows at the output's columns only, then down at its rows only."""
    rows, cols = geo.axes
    batch, channels, height = padded.shape[:3]
    row_part = scratch.take((batch, channels, height, cols.out), padded.dtype)
    _reduce_taps(combine, [padded[..., _tap_range(cols, t)] for t in range(cols.kernel)], row_part)
    y = output(out, 0, (batch, channels, rows.out, cols.out), padded.dtype)
    _reduce_taps(combine, [row_part[:, :, _tap_range(rows, t)] for t in range(rows.kernel)], y)
    return y


def _tap_range(axis: AxisGeometry, tap: int) -> slice:
    """The positions tap ``tap`` of every window reads along ``axis`` (strided to the window starts)."""
    start = tap * axis.dilation
    return slice(start, start + (axis.out - 1) * axis.stride + 1, axis.stride)


def _reduce_taps(combine: np.ufunc, views: Sequence[np.ndarray], target: np.ndarray) -> None:
    """``target = combine(views[0], views[1], ...)`` elementwise, in ``len(views) - 1`` passes."""
    if len(views) == 1:
        np.copyto(target, views[0])
        return
    combine(views[0], views[1], out=target)
    for view in views[2:]:
        combine(target, view, out=target)


def _flat_indices(best: np.ndarray, shape: Sequence[int], geo: Geometry, storage_order: int) -> np.ndarray:
    """Flat positions in X (padding ignored) of the winning taps ``best`` (``[N, C, *out]``)."""
    spatial = shape[2:]
    rank = len(spatial)
    taps = np.unravel_index(best, geo.kernel) if rank else ()
    # Row-major strides of the spatial axes, or column-major ones for storage_order=1.
    if storage_order == 1:
        steps = [int(np.prod(spatial[:axis], dtype=np.int64)) for axis in range(rank)]
    else:
        steps = [int(np.prod(spatial[axis + 1:], dtype=np.int64)) for axis in range(rank)]
    plane = int(np.prod(spatial, dtype=np.int64))
    channels = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape[0], shape[1], *(1,) * rank)
    flat = channels * plane
    for axis, a in enumerate(geo.axes):
        along = [1] * rank
        along[axis] = a.out
        starts = (np.arange(a.out, dtype=np.int64) * a.stride - a.pad_begin).reshape(along)
        flat = flat + (starts + taps[axis] * a.dilation) * steps[axis]
    return flat


@cpu_kernel("AveragePool", writes_out=True, workspace=_separable_workspace)
def average_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """AveragePool on float ``[N, C, *spatial]``; float16 accumulates in float32."""
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    compute = _compute_dtype(node, x.dtype)
    scratch = Scratch(workspace)
    padded = pad_into(geo, x.astype(compute, copy=False), scratch)
    total: np.ndarray | None = None
    if _fast_2d(node, len(geo.axes)):
        total = _separable_2d(padded, geo, scratch, out if compute == x.dtype else None, np.add)
    else:
        for tap in geo.taps():
            source = padded[(..., *geo.tap_slices(tap))]
            if total is None:
                total = output(out, 0, source.shape, compute)
                np.copyto(total, source)
            else:
                total += source
    assert total is not None
    counts = geo.window_counts(include_pad=bool(node.attrs.count_include_pad))
    total /= counts.astype(compute)
    return [deliver(out, 0, total.astype(x.dtype, copy=False))]


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@cpu_kernel("GlobalAveragePool", writes_out=True)
def global_average_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """Mean over the spatial axes (float16 accumulates in float32, numpy's rule)."""
    x = inputs[0]
    assert x is not None
    if x.dtype == np.float16:
        return [deliver(out, 0, np.mean(x, axis=_spatial_axes(x), keepdims=True).astype(x.dtype))]
    y = output(out, 0, (*x.shape[:2], *(1,) * (x.ndim - 2)), x.dtype)
    return [np.mean(x, axis=_spatial_axes(x), keepdims=True, out=y)]


@cpu_kernel("GlobalMaxPool", writes_out=True)
def global_max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """Maximum over the spatial axes."""
    x = inputs[0]
    assert x is not None
    y = output(out, 0, (*x.shape[:2], *(1,) * (x.ndim - 2)), x.dtype)
    return [np.max(x, axis=_spatial_axes(x), keepdims=True, out=y)]
