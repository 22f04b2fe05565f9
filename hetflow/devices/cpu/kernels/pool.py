"""CPU kernels: pooling.

Windowed pools loop over the window taps only (9 for a 3x3 window); each tap is one strided slice of
the padded input covering every output position of every image and channel, so the arithmetic is
vectorised over N*C*prod(out) elements. The geometry comes from ``hetflow.ops.spatial`` like Conv's.
"""

from __future__ import annotations

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


def _lowest(dtype: np.dtype) -> float | int:
    """The value padding takes in a max pool: it never wins against real input."""
    return -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)


@cpu_kernel("MaxPool", writes_out=True, workspace=_padding_workspace)
def max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray | None]:
    """MaxPool on ``[N, C, *spatial]``, any dtype it allows; Indices (int64) when the node asks for them."""
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    padded = pad_into(geo, x, Scratch(workspace), _lowest(x.dtype))
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
