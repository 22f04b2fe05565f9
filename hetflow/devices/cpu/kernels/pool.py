"""CPU kernels: pooling.

2-D float pools without Indices run the compiled kernel (``jit_pool``: any window, in cache). The rest
(other ranks, integer MaxPool, MaxPool with Indices) loop over the window taps in numpy; each tap is one
strided slice of the padded input covering every output position of every image and channel.
The geometry comes from ``hetflow.ops.spatial`` like Conv's.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, deliver, output, scratch_bytes
from hetflow.devices.cpu.kernels.conv import pad_into, padding_scratch
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.jit_pool import (
    bind_small_pool,
    compiled_window,
    plane_means,
    plane_means_job,
    pool_2d,
    pool_job,
)
from hetflow.devices.cpu.kernels.jit_pool import workspace_bytes as pool_workspace_bytes
from hetflow.devices.cpu.kernels.one_pass import captured_as_one_job, float32_target
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import available_cores
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.pool import has_indices, pool_window
from hetflow.ops.spatial import Geometry, geometry

Workspace = np.ndarray | None


def _pool_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """The compiled 2-D loop's phase planes, for every core at once (``jit_pool.workspace_bytes``: none
    for the float32 vector loop), or the padded input the tap loop takes."""
    x = inputs[0]
    if x is None:
        return 0
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    dtype = _compute_dtype(node, x.dtype)
    if geo.covers_input and (node.op_type == "AveragePool" or not has_indices(node)):
        return 0  # a global pool's reduction
    if _compiled(node, geo, dtype):
        return pool_workspace_bytes(geo, dtype, available_cores())
    return scratch_bytes(padding_scratch(geo, x.shape, dtype))


def _compute_dtype(node: Node, dtype: np.dtype) -> np.dtype:
    """AveragePool sums float16 in float32; everything else computes in its own dtype."""
    return np.dtype(np.float32) if dtype == np.float16 and node.op_type == "AveragePool" else np.dtype(dtype)


def _compiled(node: Node, geo: Geometry, dtype: np.dtype) -> bool:
    """Whether the compiled 2-D kernel runs this pool: 2-D, float, no Indices output."""
    return compiled_window(geo) and not has_indices(node) and np.dtype(dtype) in COMPILED_DTYPES


def _lowest(dtype: np.dtype) -> float | int:
    """The value padding takes in a max pool: it never wins against real input."""
    return -np.inf if dtype.kind == "f" else int(np.iinfo(dtype).min)


def _prepare_pool(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: Workspace
) -> BoundCall | None:
    """A 2-D float pool without Indices bound to its shapes and buffers (``Kernel.prepare``): the
    geometry, the output buffer and an average's reciprocal window counts are worked out once (~5 us of
    a cifar10-quick pool's ~11 us)."""
    x_info = inputs[0]
    if x_info is None or len(x_info.shape) != 4:
        return None
    dtype = np.dtype(x_info.dtype)
    x_shape = tuple(int(d) for d in x_info.shape)
    geo = geometry(pool_window(node.attrs), x_shape[2:])
    is_max = node.op_type == "MaxPool"
    if geo.covers_input and not is_max and not (node.attrs.count_include_pad and geo.needs_padding):
        return _prepare_means(node, inputs, out, workspace)
    if _compute_dtype(node, dtype) != dtype or geo.covers_input or not _compiled(node, geo, dtype):
        return None
    y_shape = (*x_shape[:2], *geo.out)
    target = out[0] if out is not None else None
    if target is not None and (target.shape != y_shape or target.dtype != dtype):
        target = None
    scale = None if is_max else _reciprocal_counts(geo, bool(node.attrs.count_include_pad), dtype)
    second = [None] if is_max else []
    small = bind_small_pool(x_shape, target, geo, scale) if target is not None else None
    if small is not None:

        def call_small(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
            small(np.ascontiguousarray(arrays[0]))
            return [target, *second]

        def capture_small(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray | None], list[Job]] | None:
            x = arrays[0]
            if not x.flags.c_contiguous:  # type: ignore[union-attr]
                return None
            return [target, *second], [small.job(x)]  # type: ignore[arg-type]

        return with_capture(call_small, capture_small)

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        y = np.empty(y_shape, dtype) if target is None else target
        pool_2d(np.ascontiguousarray(arrays[0]), y, geo, scale, workspace)
        return [y, *second]

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray | None], list[Job]] | None:
        job = None if target is None else pool_job(arrays[0], target, geo, scale)  # type: ignore[arg-type]
        return None if job is None else ([target, *second], [job])

    return with_capture(call, capture)


@cpu_kernel("MaxPool", writes_out=True, workspace=_pool_workspace, prepare=_prepare_pool)
def max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray | None]:
    """MaxPool on ``[N, C, *spatial]``, any dtype it allows; Indices (int64) when the node asks for them.

    2-D float pools without Indices run compiled (``jit_pool``); the rest loop over the taps.
    """
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    want_indices = has_indices(node)
    if geo.covers_input and not want_indices:
        return [_global_pool(np.max, x, out, x.dtype), None]
    if _compiled(node, geo, x.dtype):
        y = output(out, 0, (*x.shape[:2], *geo.out), x.dtype)
        pool_2d(np.ascontiguousarray(x), y, geo, None, workspace)
        return [y, None]
    padded = pad_into(geo, x, Scratch(workspace), _lowest(x.dtype))
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


@cpu_kernel("AveragePool", writes_out=True, workspace=_pool_workspace, prepare=_prepare_pool)
def average_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """AveragePool on float ``[N, C, *spatial]``; float16 accumulates in float32."""
    x = inputs[0]
    assert x is not None
    geo = geometry(pool_window(node.attrs), x.shape[2:])
    compute = _compute_dtype(node, x.dtype)
    include_pad = bool(node.attrs.count_include_pad)
    if geo.covers_input:
        y = _global_pool(np.mean, x, out, compute)
        if include_pad and geo.needs_padding:
            # The window also counts its padding: the mean of the input times input / window size.
            counted = math.prod(int(a.window_counts(include_pad=True)[0]) for a in geo.axes)
            y *= y.dtype.type(math.prod(a.size for a in geo.axes) / counted)
        return [y]
    if _compiled(node, geo, compute):
        total = output(out, 0, (*x.shape[:2], *geo.out), compute) if compute == x.dtype else None
        if total is None:
            total = np.empty((*x.shape[:2], *geo.out), compute)
        counts = _reciprocal_counts(geo, include_pad, compute)
        pool_2d(np.ascontiguousarray(x, dtype=compute), total, geo, counts, workspace)
        return [deliver(out, 0, total.astype(x.dtype, copy=False))]
    padded = pad_into(geo, x.astype(compute, copy=False), Scratch(workspace))
    summed: np.ndarray | None = None
    for tap in geo.taps():
        source = padded[(..., *geo.tap_slices(tap))]
        if summed is None:
            summed = output(out, 0, source.shape, compute)
            np.copyto(summed, source)
        else:
            summed += source
    assert summed is not None
    summed /= geo.window_counts(include_pad=include_pad).astype(compute)
    return [deliver(out, 0, summed.astype(x.dtype, copy=False))]


@functools.lru_cache(maxsize=256)
def _reciprocal_counts(geo: Geometry, include_pad: bool, dtype: np.dtype) -> np.ndarray:
    """1 / the number of elements each window averages, per output position (read-only; computing it
    took ~30 us a call, half the compiled pool's time on CIFAR-sized maps)."""
    scale = 1.0 / geo.window_counts(include_pad=include_pad).astype(dtype)
    scale.flags.writeable = False
    return scale


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


def _global_pool(reduce: Callable[..., np.ndarray], x: np.ndarray, out: Out, compute: np.dtype) -> np.ndarray:
    """``reduce`` (np.mean, np.max) over the spatial axes into ``[N, C, 1, ...]``, accumulating in
    ``compute``: the pools whose one window is the whole map (ResNet's and GoogLeNet's final 7x7
    AveragePool). The tap loop read every plane once per tap: 31.6 ms for ResNet-50's at batch 16,
    against 1.5 ms for this one pass. A float mean is a product with ``1 / size`` (``_plane_means``)."""
    shape = (*x.shape[:2], *(1,) * (x.ndim - 2))
    if compute != x.dtype:
        return deliver(out, 0, reduce(x, axis=_spatial_axes(x), keepdims=True, dtype=compute).astype(x.dtype))
    y = output(out, 0, shape, x.dtype)
    if reduce is np.mean and x.dtype in (np.float32, np.float64) and x.size and y.flags.c_contiguous:
        return _plane_means(x, y)
    return reduce(x, axis=_spatial_axes(x), keepdims=True, out=y)


def _plane_means(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``y`` (``[N, C, 1, ...]``, contiguous) = each plane's mean, in one compiled pass
    (``jit_pool.plane_means``, the very loop a captured run replays, so that every path gives the same
    bits). numpy's mean reduces plane by plane at a fixed cost each: 41 us for 1280 7x7 planes
    (MobileNetV2's last pool)."""
    plane_means(np.ascontiguousarray(x).reshape(y.size, -1), y.reshape(-1))
    return y


def _prepare_means(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: Workspace
) -> BoundCall | None:
    """A float32 mean over whole planes (GlobalAveragePool, an AveragePool whose one window covers the
    map) bound to the Y the plan placed: called as ``_plane_means``, captured as one plane-means job
    (``jit_pool.plane_means_job``; see ``one_pass``)."""
    x_info = inputs[0]
    if x_info is None or len(x_info.shape) < 3 or not all(isinstance(d, int) and d > 0 for d in x_info.shape):
        return None
    target = float32_target(x_info, out, (*x_info.shape[:2], *(1,) * (len(x_info.shape) - 2)))
    if target is None:
        return None
    return captured_as_one_job(
        lambda arrays: [_plane_means(arrays[0], target)],  # type: ignore[arg-type]
        target,
        lambda x: plane_means_job(x.reshape(target.size, -1), target.reshape(-1)),
    )


@cpu_kernel("GlobalAveragePool", writes_out=True, prepare=_prepare_means)
def global_average_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """Mean over the spatial axes (float16 accumulates in float32, numpy's rule)."""
    x = inputs[0]
    assert x is not None
    return [_global_pool(np.mean, x, out, np.dtype(np.float32) if x.dtype == np.float16 else x.dtype)]


@cpu_kernel("GlobalMaxPool", writes_out=True)
def global_max_pool(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """Maximum over the spatial axes."""
    x = inputs[0]
    assert x is not None
    return [_global_pool(np.max, x, out, x.dtype)]
