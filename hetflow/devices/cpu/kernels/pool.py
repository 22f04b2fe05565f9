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
from hetflow.ops.spatial import Geometry, geometry

Workspace = np.ndarray | None


def _padding_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """The padded input's bytes (the pool's only large temporary)."""
    x = inputs[0]
    if x is None:
        return 0
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    dtype = np.dtype(np.float32) if x.dtype == np.float16 and node.op_type == "AveragePool" else x.dtype
    return scratch_bytes(padding_scratch(geo, x.shape, dtype))


def _max_pool_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """The padded input, plus the fast 2-D path's two running-maximum buffers (each at most its size)."""
    x = inputs[0]
    if x is None:
        return 0
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    padded = padding_scratch(geo, x.shape, x.dtype)
    if not _fast_2d(node, len(geo.axes)):
        return scratch_bytes(padded)
    flat = (math.prod((int(x.shape[0]), int(x.shape[1]), *(a.padded for a in geo.axes))),)
    return scratch_bytes([*padded, (flat, x.dtype), (flat, x.dtype)])


def _fast_2d(node: Node, rank: int) -> bool:
    """Whether the separable 2-D max pool applies: two spatial axes, no Indices output."""
    return rank == 2 and not (len(node.outputs) > 1 and bool(node.outputs[1]))


def _lowest(dtype: np.dtype) -> float | int:
    """The value padding takes in a max pool: it never wins against real input."""
    return -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)


@cpu_kernel("MaxPool", writes_out=True, workspace=_max_pool_workspace)
def max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray | None]:
    """MaxPool on ``[N, C, *spatial]``, any dtype it allows; Indices (int64) when the node asks for them.

    2-D pools without Indices take the separable path (``_max_pool_2d``); the rest loop over the taps.
    """
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    scratch = Scratch(workspace)
    padded = pad_into(geo, x, scratch, _lowest(x.dtype))
    if _fast_2d(node, len(geo.axes)) and padded.flags.c_contiguous:
        return [_max_pool_2d(padded, geo, scratch, out), None]
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


def _max_pool_2d(padded: np.ndarray, geo: Geometry, scratch: Scratch, out: Out) -> np.ndarray:
    """2-D max pool of a contiguous padded ``[N, C, Hp, Wp]`` as running maxima over shifted flat views.

    Flattened, the window tap (i, j) of output (h, w) sits at ``base + i*dh*Wp + j*dw`` from the tap
    (0, 0), so the maximum over the taps of a row, then over the rows, is a handful of ``np.maximum``
    calls on long contiguous vectors (SIMD, no per-row loop) — the strided per-tap slices of the
    general path are 2-5x slower. Positions that run past a row or a channel only hold garbage that
    is never read back: the output is the strided view of the valid window starts.
    """
    rows, cols = geo.axes
    height, width = padded.shape[2:]
    flat = padded.reshape(-1)
    across = flat.size - (cols.kernel - 1) * cols.dilation
    row_max = scratch.take((across,), padded.dtype)
    _running_max(flat, cols.kernel, cols.dilation, row_max)
    length = across - (rows.kernel - 1) * rows.dilation * width
    window_max = scratch.take((length,), padded.dtype)
    _running_max(row_max, rows.kernel, rows.dilation * width, window_max)
    item = padded.itemsize
    starts = np.lib.stride_tricks.as_strided(
        window_max,
        (*padded.shape[:2], rows.out, cols.out),
        (padded.shape[1] * height * width * item, height * width * item, rows.stride * width * item,
         cols.stride * item),
        writeable=False,
    )
    y = output(out, 0, starts.shape, padded.dtype)
    np.copyto(y, starts)
    return y


def _running_max(source: np.ndarray, taps: int, step: int, target: np.ndarray) -> None:
    """``target[q] = max(source[q + t*step] for t < taps)`` for every q of ``target``."""
    size = target.size
    if taps == 1:
        np.copyto(target, source[:size])
        return
    np.maximum(source[:size], source[step : step + size], out=target)
    for tap in range(2, taps):
        np.maximum(target, source[tap * step : tap * step + size], out=target)


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


@cpu_kernel("AveragePool", writes_out=True, workspace=_padding_workspace)
def average_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """AveragePool on float ``[N, C, *spatial]``; float16 accumulates in float32."""
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    compute = np.dtype(np.float32) if x.dtype == np.float16 else x.dtype
    padded = pad_into(geo, x.astype(compute, copy=False), Scratch(workspace))
    total: np.ndarray | None = None
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
