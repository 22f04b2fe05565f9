"""2-D max and average pooling compiled with numba, for any window, stride, dilation and padding.

numpy pools in passes (one per window tap, each reading and writing a whole plane), which left them an
order of magnitude behind ONNX Runtime's pools (GoogLeNet and Inception-v2 spent 8-17% of their time
pooling). Here each input plane is copied once into flat phase planes whose border holds the padding
value (``jit_phases``), and each tap over a block of output rows is one contiguous vector loop into an
L1-sized accumulator, written to Y once (times the reciprocal window counts for an average).

History, measured on one core, per image: numpy's tap passes -> a separable loop compiled per window
(only 2x2 and 3x3 windows, about half a second of compiling each), 3x3/2 max on 64x112x112 2.1 -> 0.9
ms; that loop -> this one (A/B in one process), 3x3/2 max on 192x56x56 1.17 -> 0.58 ms, 3x3/1 max on
480x28x28 1.39 -> 0.94 ms, 2x2/2 max on 832x14x14 0.45 -> 0.23 ms, 3x3/1 average on 256x28x28 0.75 ->
0.28 ms. One generic function now serves every window, compiled once and cached on disk. Its rows are
stored at unsigned flat offsets of Y (``buffers.flat_images``; indexing ``y[n, c, r, j]`` kept the store
loop scalar): 3x3/1 max on 480x28x28 0.79 -> 0.68 ms, 3x3/1 average on 576x14x14 0.22 -> 0.18 ms, 3x3/2
max 5% (one core, A/B in one process; at two threads within this VM's noise).

Max pools whose windows tile X (2x2/2: LeNet, VGG, the mentee) skip the phase planes: copying a plane
into its stride-2 phases is a strided gather that cost more than the taps. ``tile_loop`` (compiled per
window shape) reads each window where it lies; one image, 2x2/2, phases -> tiles: 64x224x224 3.0-3.6 ->
0.75-0.89 ms, 128x112x112 1.3-1.5 -> 0.40-0.42 ms, 512x28x28 0.60 -> 0.38 ms, 50x8x8 13-14 -> 4.4 us.
The training MaxPool's Indices forward uses the same loop (``jit_backward``). 2x2 windows have a loop
of their own whose rows vectorise (``_rows_2x2``: each column's winner, then the pair's): one core,
batch 128, 32x32x32 with Indices 8.5 -> 1.6 ms, without 6.4 -> 0.9 ms.

float32 pools with column stride 1 or 2 (every pool in the zoo) now run
``jit_pool_lanes`` instead: 16-lane vectors of outputs in LLVM IR, each window tap a masked load
straight from X, no phase planes. On small maps the phase planes' copy (a strided gather that ran
scalar) was half the time, and their rows were too short for numba's vector loops. Measured on one core
inside ``blas_threads(1)`` (as a run holds it), the minimum of up to 5000 calls, commit 8b53ca3 and this
tree each in its own process on the same VM, ``pool_2d`` / its compiled loop: cifar10-quick at batch 1,
3x3/2 max on 32x32x32 43.6 / 32.1 -> 11.3 / 7.8 us, 3x3/2 average on 32x16x16 22.8 / 11.9 -> 6.4 / 3.0,
on 64x8x8 21.8 / 11.2 -> 5.3 / 2.2 (part of it Python: ``pool_2d`` calls the loop itself when one
thread is enough, and ``buffers.flat_images`` no longer builds an as_strided view of a contiguous Y,
~4 us); ``pool_2d`` on larger maps: 3x3/2 max on 192x56x56 498 -> 169 us, 3x3/1 max on 480x28x28 745
-> 264, 3x3/1 average on 256x28x28 276 -> 134, 3x3/2 max on 64x112x112 621 -> 203, 3x3/1 max on
1024x7x7 204 -> 61, 3x3/1 average on 576x14x14 193 -> 84, 2x2/2 max on 832x14x14 (a tiling loop
before) 182 -> 40. At two threads: 192x56x56 363 -> 157 us, 480x28x28 465 -> 203. 2x2 max windows over
rows of 16 outputs or more keep the tiling loop (``runs_tiles``); float64 and other column strides keep
the phase planes. Among them, 3x3/1 windows padded by one (Inception's and GoogLeNet's branch pools)
run ``jit_pool_same``'s two separable passes over flat planes, 1.5-5x faster on one core.

Like ``jit_depthwise``, the compiled loops release the GIL and the planes are split over the CPU's
kernel threads.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_pool_lanes
from hetflow.devices.cpu.kernels.buffers import aligned, flat_images, flat_target
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.jit_phases import BLOCK_ELEMENTS, fill_phases, layout, tap_start
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_2d, float32_4d, put_arrays
from hetflow.devices.cpu.threads import (
    MIN_ELEMENTS_PER_PART,
    intra_op_threads,
    parallel_planes,
    spin_parts,
    spin_split,
    split_planes,
)
from hetflow.ops.spatial import Geometry


def compiled_window(geo: Geometry) -> bool:
    """Whether ``geo`` is a 2-D window (the compiled loop takes any of those)."""
    return len(geo.axes) == 2


#: The indices argument of a plain max pool's tiling loop (unwritten).
_NO_INDICES = np.empty(0, np.int64)
#: The scale argument of a max pool (unread; the compiled loop takes an array of X's dtype either way).
_UNUSED_SCALE = {dtype: np.ones((1, 1), dtype) for dtype in COMPILED_DTYPES}


def pool_2d(
    x: np.ndarray, y: np.ndarray, geo: Geometry, scale: np.ndarray | None, workspace: np.ndarray | None = None
) -> None:
    """``y`` = the 2-D pool of ``x`` ``[N, C, H, W]`` (C-contiguous) over ``geo``'s windows, in place.

    ``scale`` None: the maximum (padding never wins; NaN propagates, as with np.maximum). Otherwise the
    sum times ``scale`` ``[OH, OW]`` (the reciprocal window counts: an average), padding adding zero.
    ``workspace``: bytes for the phase planes (``workspace_bytes``); without it, or where it holds fewer
    parts than run at once, they are allocated per call. float32 with column stride 1 or 2 runs
    ``jit_pool_lanes`` (no scratch; 3x3/1 windows padded by one its ``jit_pool_same`` passes); max pools
    whose windows tile X the tiling loop; the rest the phase planes.
    """
    if y.size == 0:
        return
    is_max = scale is None
    if is_max and y.flags.c_contiguous and runs_tiles(geo, x.dtype):
        _pool_tiles(x, y, geo)
        return
    weights = _UNUSED_SCALE[x.dtype] if is_max else np.ascontiguousarray(scale, x.dtype)
    target, flat_y, image_stride = flat_target(y)
    if jit_pool_lanes.applies(geo, x.dtype):
        jit_pool_lanes.pool(x, flat_y, image_stride, geo.out, _window(geo), is_max, weights)
    else:
        _pool_phases(x, flat_y, image_stride, geo, is_max, weights, workspace)
    if target is not y:
        np.copyto(y, target)


class SmallPool:
    """A pool too small ever to split on numba's or the Python pool, bound to its shapes and Y
    (``bind_small_pool``): ``pool(x)`` is the compiled loop, its arguments worked out once (~4 us of
    LeNet's 8 us pool1), or, on a spinning run (``threads.spinning``), the loop split there
    (``threads.spin_split``); ``job(x)`` is the same as a spin-pool job (what a captured run replays)."""

    def __init__(self, x_shape: tuple[int, ...], flat: tuple[np.ndarray, int], geo: Geometry, is_max: bool,
                 weights: np.ndarray):  # fmt: skip
        self.planes = int(x_shape[0]) * int(x_shape[1])
        self.per_plane = geo.out[0] * geo.out[1]
        self.y_flat = flat[0]
        self.head = (flat[0], flat[1], *geo.out, 0, self.planes)
        self.tail = (*_window(geo), is_max, weights)
        self.numbers = _planes_numbers(flat[1], geo, is_max)
        self.weights = weights

    def __call__(self, x: np.ndarray) -> None:
        found = spin_split(self.planes, self.per_plane, (x,))
        if found is not None:
            self._job(x, found[1]).run(found[0])
            return
        jit_pool_lanes.vector_planes(x, *self.head, *self.tail)

    def job(self, x: np.ndarray) -> Job:
        return self._job(x, spin_parts(self.planes, self.per_plane, (x,)))

    def _job(self, x: np.ndarray, parts: int) -> Job:
        return jit_pool_lanes.planes_job(x, self.y_flat, self.numbers, self.weights, parts)


def _planes_numbers(image_stride: int, geo: Geometry, is_max: bool) -> tuple[int, ...]:
    """``jit_pool_lanes.planes_job``'s numbers: Y's image stride, the output's size, the window, is_max."""
    return (image_stride, *geo.out, *_window(geo), int(is_max))


def pool_job(x: np.ndarray, y: np.ndarray, geo: Geometry, scale: np.ndarray | None) -> Job | None:
    """``pool_2d`` of float32 C-contiguous ``x`` into ``y`` as one spin-pool job, split as a spinning run
    splits it (``threads.spin_split``): 2x2 max windows that tile X by the row loop, the windows
    ``jit_pool_lanes`` takes by it; None for the rest (the phase planes, other tiling windows)."""
    is_max = scale is None
    if x.dtype != np.float32 or y.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    parts = spin_parts(x.shape[0] * x.shape[1], geo.out[0] * geo.out[1], (x,))
    if is_max and y.flags.c_contiguous and runs_tiles(geo, y.dtype):
        if (geo.axes[0].kernel, geo.axes[1].kernel) != (2, 2):
            return None
        block = np.zeros(_TILES_BLOCK_SLOTS, np.int64)
        put_arrays(block, 0, (x, y))
        return Job(_tiles_address(), block, parts, (x, y))
    flat = flat_images(y)
    if flat is None or not jit_pool_lanes.applies(geo, y.dtype):
        return None
    weights = _UNUSED_SCALE[y.dtype] if is_max else np.ascontiguousarray(scale, y.dtype)
    return jit_pool_lanes.planes_job(x, flat[0], _planes_numbers(flat[1], geo, is_max), weights, parts)


#: Slots of a 2x2 tiles job's block: X and Y (4-D each).
_TILES_BLOCK_SLOTS = 10


def _tiles_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_rows_2x2`` (no Indices) over the chunk's range of Y's planes, as a spin-pool job."""
    x, y = float32_4d(args, 0), float32_4d(args, 5)
    planes = y.shape[0] * y.shape[1]
    _rows_2x2(x, y, np.empty(0, np.int64), planes * chunk // chunks, planes * (chunk + 1) // chunks, False)


@functools.cache
def _tiles_address() -> int:
    return spin_pool.job(_tiles_job)


def plane_means_job(planes: np.ndarray, y: np.ndarray) -> Job:
    """``y[p]`` = the mean of row p of ``planes`` (``[P, size]``, float32, C-contiguous; ``y`` flat, P long)
    as a spin-pool job of one chunk, what a captured run replays: a network's final pool (1024 planes
    of 49 values in GoogLeNet's) is a few microseconds of work, less than a hand-off."""
    block = np.zeros(_MEANS_BLOCK_SLOTS, np.int64)
    put_arrays(block, 0, (planes, y))
    return Job(_means_address(), block, 1, (planes, y))


#: Slots of a plane-means job's block: the planes (2-D), Y (1-D).
_MEANS_BLOCK_SLOTS = 5


@numba.njit(nogil=True, cache=True, fastmath=True)
def plane_means(planes, y):  # noqa: ANN001, ANN201
    """``y[p]`` = the mean of ``planes[p]`` (summed in the array's dtype, vectorised)."""
    inverse = planes.dtype.type(1.0) / planes.dtype.type(planes.shape[1])
    for p in range(planes.shape[0]):
        total = planes.dtype.type(0.0)
        for i in range(planes.shape[1]):
            total += planes[p, i]
        y[p] = total * inverse


def _means_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    plane_means(float32_2d(args, 0), float32_1d(args, 3))


@functools.cache
def _means_address() -> int:
    return spin_pool.job(_means_job)


def bind_small_pool(
    x_shape: tuple[int, ...], y: np.ndarray, geo: Geometry, scale: np.ndarray | None
) -> SmallPool | None:
    """``pool_2d`` into ``y`` bound once (``SmallPool``), for a pool ``jit_pool_lanes`` runs that has
    under twice ``MIN_ELEMENTS_PER_PART`` outputs; None where ``pool_2d`` decides per call."""
    is_max = scale is None
    dtype = y.dtype
    if not jit_pool_lanes.applies(geo, dtype) or (is_max and y.flags.c_contiguous and runs_tiles(geo, dtype)):
        return None
    flat = flat_images(y)
    outputs = int(x_shape[0]) * int(x_shape[1]) * geo.out[0] * geo.out[1]
    if flat is None or outputs >= 2 * MIN_ELEMENTS_PER_PART:
        return None
    weights = _UNUSED_SCALE[dtype] if is_max else np.ascontiguousarray(scale, dtype)
    return SmallPool(x_shape, flat, geo, is_max, weights)


def runs_tiles(geo: Geometry, dtype: np.dtype) -> bool:
    """Whether ``pool_2d`` runs a max pool over ``geo`` (into a C-contiguous Y) by the tiling loop
    (``tile_loop``): windows that tile X, which ``jit_pool_lanes`` does not run or which are 2x2 over
    rows of ``VECTOR_ROW_2X2`` outputs or more, those ``_rows_2x2`` streams through once in order. One
    core, 2x2/2 on [N, C, H, W], tiles -> lanes: 1x832x14x14 182 -> 40 us, 1x512x28x28 445 -> 88,
    1x20x24x24 16.8 -> 7.4, 1x50x8x8 7.3 -> 5.3, 128x128x8x8 1.21 -> 0.32 ms; but 32x32x32x32 205 -> 250 us
    and 128x32x32x32 0.81 -> 1.0 ms (out of the caches), 1x64x224x224 0.65 ms either way."""
    rows, cols = geo.axes
    short_rows = (rows.kernel, cols.kernel) != (2, 2) or cols.out < VECTOR_ROW_2X2
    if short_rows and jit_pool_lanes.applies(geo, dtype):
        return False
    return tiles_input(geo)


def _window(geo: Geometry) -> tuple[int, ...]:
    """The compiled loops' window arguments: kh, kw, sh, sw, dh, dw, pad_top, pad_left."""
    rows, cols = geo.axes
    return (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation,
            rows.pad_begin, cols.pad_begin)  # fmt: skip


def _pool_tiles(x: np.ndarray, y: np.ndarray, geo: Geometry) -> None:
    """A max pool whose windows tile X (``tile_loop``) into the C-contiguous ``y``."""
    rows, cols = geo.axes
    loop = tile_loop(rows.kernel, cols.kernel, record=False)
    # NOTE: on the Python pool even in numba-pool mode: the loop is compiled per window, and a prange
    # driver would have to take it as an argument.
    parallel_planes(
        lambda first, last: loop(x, y, _NO_INDICES, first, last), y.shape[0] * y.shape[1], rows.out * cols.out
    )


def _pool_phases(
    x: np.ndarray, flat_y: np.ndarray, image_stride: int, geo: Geometry, is_max: bool, weights: np.ndarray,
    workspace: np.ndarray | None,
) -> None:  # fmt: skip
    """The pool by the phase planes' loop (``_planes``) into the flat Y ``flat_y``, its scratch from
    ``workspace``."""
    rows, cols = geo.axes
    out = (image_stride, rows.out, cols.out)
    window = _window(geo)
    parts = _part_buffers(workspace, part_elements(geo), x.dtype)
    free = list(parts)

    def planes(first: int, last: int) -> None:
        # NOTE: list.pop/append are atomic: each running range holds its own part of the workspace.
        try:
            buffer = free.pop()
        except IndexError:  # more ranges at once than parts (a smaller workspace than the cores)
            buffer = np.empty(parts.shape[1], x.dtype)
        try:
            _planes(x, flat_y, *out, first, last, *window, is_max, weights, buffer)
        finally:
            free.append(buffer)

    split_planes(
        planes,
        lambda count: _split(min(count, len(parts)), x, flat_y, *out, *window, is_max, weights, parts),
        x.shape[0] * x.shape[1], rows.out * cols.out,
    )  # fmt: skip


def part_elements(geo: Geometry) -> int:
    """Elements of one part's scratch in the overlapping windows' loop (``_planes``): its phase planes
    (stacked for small maps) and its accumulator."""
    rows, cols = geo.axes
    span, depth, block_rows = layout(rows.out, cols.out, rows.kernel, cols.kernel, rows.stride, cols.stride,
                                     rows.dilation, cols.dilation)  # fmt: skip
    stacked = _stack(depth * span) * depth * span
    return rows.stride * cols.stride * stacked + max(block_rows * span, stacked)


def workspace_bytes(geo: Geometry, dtype: np.dtype, parts: int) -> int:
    """The scratch ``pool_2d`` takes for ``parts`` ranges of planes run at once (0 where
    ``jit_pool_lanes`` runs it or the windows tile X: those loops need none)."""
    if jit_pool_lanes.applies(geo, dtype) or tiles_input(geo):
        return 0
    return aligned(parts * part_elements(geo) * np.dtype(dtype).itemsize)


def _part_buffers(workspace: np.ndarray | None, elements: int, dtype: np.dtype) -> np.ndarray:
    """``[parts, elements]`` of ``dtype``: as many parts as ``workspace`` holds, or one per kernel thread
    allocated here without one."""
    itemsize = np.dtype(dtype).itemsize
    parts = 0 if workspace is None else workspace.nbytes // (elements * itemsize)
    if parts == 0:
        return np.empty((intra_op_threads(), elements), dtype)
    return workspace[: parts * elements * itemsize].view(dtype).reshape(parts, elements)


def tiles_input(geom: Geometry) -> bool:
    """Whether the windows tile the input without overlap, gaps or padding (stride = kernel, no
    dilation, every window inside X): the usual 2x2/2 case, which runs without phase planes
    (``tile_loop``)."""
    return all(
        a.stride == a.kernel and a.dilation == 1 and a.pad_begin == 0 and a.out * a.kernel <= a.size
        for a in geom.axes
    )


#: key -> a loop compiled for one window shape (``compiled_once``).
_LOOPS: dict[tuple[int | str, ...], Callable[..., None]] = {}
_LOOPS_LOCK = threading.Lock()


def compiled_once(
    key: tuple[int | str, ...], compile_loop: Callable[[], Callable[..., None]]
) -> Callable[..., None]:
    """The loop kept under ``key``, compiled by ``compile_loop`` on first use (loops compiled per window
    shape, with the window baked in as constants)."""
    loop = _LOOPS.get(key)
    if loop is None:
        with _LOOPS_LOCK:
            loop = _LOOPS.get(key)
            if loop is None:
                loop = compile_loop()
                _LOOPS[key] = loop
    return loop


def tile_loop(kh: int, kw: int, record: bool = True) -> Callable[..., None]:
    """The compiled plane loop ``loop(x, y, indices, first, last)`` of a max pool whose ``kh`` x ``kw``
    windows tile X (``tiles_input``): Y of output planes ``first .. last - 1``, and their Indices (the
    flat position in X of each window's first maximum) when ``record`` (else ``indices`` is unread).

    The window must be a constant of the compiled code for the tap loops to unroll (with the window
    read at run time the loop ran 1.5-10x slower): 2x2 has its own function, cached on disk like the
    other kernels; any other window is compiled on first use in each process (~1.4 s).
    """
    if (kh, kw) == (2, 2):
        return lambda x, y, indices, first, last: _tiles_2x2(x, y, indices, first, last, record)
    loop = compiled_once(("tile", kh, kw), lambda: _compile_tiles(kh, kw))
    return lambda x, y, indices, first, last: loop(x, y, indices, first, last, record)


# NOTE: no phase planes: each window's taps are read where they lie, at unsigned flat offsets (no array
# views, whose reference counting costs more than a small plane's work), and compared with selects, not
# branches (on data a branch is a coin toss). Measured on one core, batch 128, 2x2/2 on 32x32x32 /
# 64x16x16 / 128x8x8 with Indices: 12.9 / 8.6 / 8.3 ms through the phase planes, 8.8 / 4.6 / 2.5 ms here.
@numba.njit(nogil=True, inline="always")
def _tiles(x, y, indices, first, last, kh, kw, record):  # noqa: ANN001, ANN202
    height, width = x.shape[2], x.shape[3]
    out_h, out_w = y.shape[2], y.shape[3]
    flat_x, flat_y, flat_indices = x.reshape(-1), y.reshape(-1), indices.reshape(-1)
    row_step = np.uint64(width)
    for plane in range(first, last):
        for oy in range(out_h):
            corner_row = np.uint64(plane * height * width + oy * kh * width)
            out_row = np.uint64((plane * out_h + oy) * out_w)
            for ox in range(np.uint64(out_w)):
                corner = corner_row + ox * np.uint64(kw)
                best, won = flat_x[corner], np.int64(corner)
                for i in range(kh):
                    for j in range(kw):
                        at = corner + np.uint64(i) * row_step + np.uint64(j)
                        value = flat_x[at]
                        # A NaN beats any number and the first NaN stays (argmax's rule).
                        better = (value > best) | ((value != value) & (best == best))
                        best = value if better else best
                        won = np.int64(at) if better else won
                flat_y[out_row + ox] = best
                if record:
                    flat_indices[out_row + ox] = won


@numba.njit(nogil=True, cache=True)
def _tiles_2x2(x, y, indices, first, last, record):  # noqa: ANN001, ANN202
    if y.shape[3] >= VECTOR_ROW_2X2 or not record:
        _rows_2x2(x, y, indices, first, last, record)
    else:
        _tiles(x, y, indices, first, last, 2, 2, record)  # inlined, so the window is a constant


#: Output row length from which ``_rows_2x2`` runs a 2x2 max pool that records Indices: shorter rows
#: are too short for its vector loop then (one core, batch 128, with Indices: 32x32x32 8.5 -> 1.6 ms,
#: 16x40x40 6.3 -> 1.2, but 64x16x16 4.2 -> 4.7, 128x8x8 2.2 -> 2.4). Without Indices it is the faster
#: at every size measured (32x32x32 6.4 -> 0.9 ms, 128x8x8 1.6 -> 1.1, 512x4x4 2.0 -> 1.2).
VECTOR_ROW_2X2 = 16


@numba.njit(nogil=True, inline="always")
def _better(value, best):  # noqa: ANN001, ANN202
    """Whether ``value`` replaces ``best`` as a window's maximum: larger, or a NaN over a number."""
    return (value > best) | ((value != value) & (best == best))


@numba.njit(nogil=True, cache=True)
def _rows_2x2(x, y, indices, first, last, record):  # noqa: ANN001, ANN202
    """``_tiles`` for 2x2 windows written so that each output row's loop vectorises: the winner of each
    column of a window (the top on a tie), then of the two columns, with no branch. On a tie between the
    columns the window's first maximum in row-major order wins: the right column only when its winner
    is in the top row and the left's in the bottom."""
    height, width = x.shape[2], x.shape[3]
    out_h, out_w = y.shape[2], y.shape[3]
    flat_x, flat_y, flat_indices = x.reshape(-1), y.reshape(-1), indices.reshape(-1)
    one = np.uint64(1)
    for plane in range(first, last):
        for oy in range(out_h):
            top = np.uint64(plane * height * width + 2 * oy * width)
            bottom = top + np.uint64(width)
            out_row = np.uint64((plane * out_h + oy) * out_w)
            for ox in range(np.uint64(out_w)):
                left = np.uint64(2) * ox
                top_left, top_right = flat_x[top + left], flat_x[top + left + one]
                bottom_left, bottom_right = flat_x[bottom + left], flat_x[bottom + left + one]
                left_low = _better(bottom_left, top_left)
                left_best = bottom_left if left_low else top_left
                right_low = _better(bottom_right, top_right)
                right_best = bottom_right if right_low else top_right
                right = _better(right_best, left_best) | (
                    ~_better(left_best, right_best) & (np.int64(right_low) < np.int64(left_low))
                )
                flat_y[out_row + ox] = right_best if right else left_best
                if record:
                    row = bottom if (right_low if right else left_low) else top
                    flat_indices[out_row + ox] = np.int64(row + left + (one if right else np.uint64(0)))


def _compile_tiles(kh: int, kw: int) -> Callable[..., None]:
    """``_tiles`` with the window baked in (numba freezes closure variables as constants)."""

    @numba.njit(nogil=True)
    def planes(x, y, indices, first, last, record):  # noqa: ANN001, ANN202
        _tiles(x, y, indices, first, last, kh, kw, record)

    return planes


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, y, image_stride, out_h, out_w,  # noqa: ANN001
           kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale, buffers):  # fmt: skip
    """``_planes`` over ``parts`` ranges of Y's planes, run by numba's threads, part p in ``buffers[p]``."""
    planes = x.shape[0] * x.shape[1]
    for part in numba.prange(parts):
        first, last = planes * part // parts, planes * (part + 1) // parts
        _planes(x, y, image_stride, out_h, out_w, first, last,
                kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale, buffers[part])  # fmt: skip


#: Phase planes of up to this many elements (maps up to about 20x20) are stacked ``BLOCK_ELEMENTS //
#: size`` at a time (``_planes``). One core, A/B: 1024x7x7 3x3/1 max 0.27 -> 0.20 ms, average 0.23 -> 0.14
#: ms, 320x14x14 3x3/2 max 0.12 -> 0.11 ms; stacks of four 28x28 planes ran 5-10% slower.
STACK_MAX_PLANE = 512


@numba.njit(nogil=True, cache=True)
def _stack(plane_size):  # noqa: ANN001, ANN202
    """How many phase planes of ``plane_size`` elements ``_planes`` accumulates together."""
    return BLOCK_ELEMENTS // plane_size if plane_size <= STACK_MAX_PLANE else 1


# NOTE: no fastmath here: it would let the compiler assume no NaN, and a max pool must propagate NaN.
@numba.njit(nogil=True, cache=True)
def _planes(x, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001
            kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale, buffer):  # fmt: skip
    """Output planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of the flat Y ``y``
    (images ``image_stride`` elements apart, each ``[C, OH, OW]`` contiguous; ``flat_images``).

    A plane is accumulated a block of rows at a time; planes up to ``STACK_MAX_PLANE`` elements are stacked,
    ``stack`` of them one above the other in the phase planes, and accumulated together, so that each
    tap's loop is long enough to vectorise (a 7x7 plane's 63 elements alone ran scalar). The rows
    between two stacked planes' outputs are computed and dropped. The phase planes and the
    accumulator are carved from ``buffer`` (``part_elements``).
    """
    channels = x.shape[1]
    span, depth, block_rows = layout(out_h, out_w, kh, kw, sh, sw, dh, dw)
    plane_size = depth * span
    stack = _stack(plane_size)
    phase_elements = sh * sw * stack * plane_size
    phases = buffer[:phase_elements].reshape((sh * sw, stack * plane_size))
    acc = buffer[phase_elements:]
    # Padding, written once a call: each plane rewrites only X's part of its section.
    phases[:] = -np.inf if is_max else 0.0
    scale_flat = scale.reshape(-1)
    width = np.uint64(out_w)
    for group in range(first, last, stack):
        planes = min(stack, last - group)
        for g in range(planes):
            plane = group + g
            section = phases[:, g * plane_size : (g + 1) * plane_size]
            fill_phases(x, plane // channels, plane % channels, section, sh, sw, pad_top, pad_left, span, depth)
        if stack == 1:
            image, channel = group // channels, group % channels
            for first_row in range(0, out_h, block_rows):
                rows = min(block_rows, out_h - first_row)
                _accumulate(phases, acc, np.uint64(rows * span), first_row, kh, kw, sh, sw, dh, dw, span, is_max)
                start = np.uint64(image * image_stride + (channel * out_h + first_row) * out_w)
                for r in range(rows):
                    factors = np.uint64((first_row + r) * out_w)
                    _store_row(acc, np.uint64(r * span), y, start + np.uint64(r) * width, width, is_max,
                               scale_flat, factors)  # fmt: skip
        else:
            # The last stacked plane's rows end where its outputs do (the rows after read past the buffer).
            count = np.uint64(((planes - 1) * depth + out_h) * span)
            _accumulate(phases, acc, count, 0, kh, kw, sh, sw, dh, dw, span, is_max)
            for g in range(planes):
                plane = group + g
                start = np.uint64((plane // channels) * image_stride + (plane % channels) * out_h * out_w)
                for r in range(out_h):
                    _store_row(acc, np.uint64((g * depth + r) * span), y, start + np.uint64(r) * width, width,
                               is_max, scale_flat, np.uint64(r * out_w))  # fmt: skip


@numba.njit(nogil=True, cache=True, inline="always")
def _accumulate(phases, acc, count, first_row, kh, kw, sh, sw, dh, dw, span, is_max):  # noqa: ANN001, ANN202
    """``acc[:count]`` = the max or sum over the window taps of the output rows from ``first_row``."""
    for i in range(kh):
        for j in range(kw):
            index, offset = tap_start(i, j, first_row, span, sh, sw, dh, dw)
            if i == 0 and j == 0:
                for p in range(count):
                    acc[p] = phases[index, offset + p]
            elif is_max:
                for p in range(count):
                    acc[p] = np.maximum(acc[p], phases[index, offset + p])
            else:
                for p in range(count):
                    acc[p] += phases[index, offset + p]


@numba.njit(nogil=True, cache=True, inline="always")
def _store_row(acc, base, y, target, width, is_max, scale, factors):  # noqa: ANN001, ANN202
    """One output row: ``y[target:]`` = ``acc[base:]`` (times ``scale[factors:]`` for an average)."""
    if is_max:
        for c in range(width):
            y[target + c] = acc[base + c]
    else:
        for c in range(width):
            y[target + c] = acc[base + c] * scale[factors + c]
