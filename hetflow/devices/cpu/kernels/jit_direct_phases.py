"""Direct 2-D convolution with strides: ``jit_direct``'s kernel on the input's phase planes.

A network's first layer (7x7 stride 2 on 3 channels in GoogLeNet, ResNet-50 and Inception v2) went
through im2col: with 3 channels, its columns (147 x 12544 floats at 224x224, 7.4 MB) are written and read
back for a GEMM only 147 deep. Here the strided window becomes ``jit_direct``'s stride-1 loop, with no
tap computed in vain:

Each zero-bordered input plane is split into its ``sh x sw`` phases (phase (qr, qc) holds the padded
plane's rows ``qr::sh`` and columns ``qc::sw``), each ``phase_size`` long with rows ``width`` apart, and a
channel's phases lie one after another. Output (r, c) reads tap (i, j) in phase ((i*dh) % sh, (j*dw) % sw)
at row ``r + (i*dh)//sh``, column ``c + (j*dw)//sw``: at flat position ``q = r*width + c`` plus an offset
that depends only on the tap. So every tap of 16 consecutive positions is one contiguous vector load, as in
``jit_direct``, whose FMA blocks (``multiply_blocks``) and copy into Y (``crop_products``, bias and Relu)
run unchanged; only the planes are filled differently (``fill_phase_planes``). Which strided layers run
here: ``hetflow.ops.conv._direct_takes_strided``.

Measured on one core of the 2-core reference VM, batch 1, 3 -> 64 7x7/2 at 224x224: phases 38 us,
products 904 us (130 GMAC/s), copy-out 64 us: 1.0 ms, against ONNX Runtime's 0.97 ms on one thread
and hetflow's im2col kernel's 1.29 ms (BLAS at one thread). The phase planes, filled by column pairs
since (``fill_phase_planes``), take 23 us there (2026-12-06).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels.jit_direct import (
    KERNEL_BLOCK,
    SPAN_POSITIONS,
    X_SLOT,
    BlockSplit,
    Bounds,
    PartBuffers,
    block_shares,
    blocked_weights,
    bounds_word,
    call_parts,
    chunk_parts,
    crop_products,
    fit_buffers,
    image_of,
    job_image_shape_3d,
    multiply_blocks,
    output_images,
    round_up,
    share_job,
    spin_chunks,
    split_threads,
    word_bounds,
)
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_3d, float32_4d, int64_1d
from hetflow.devices.cpu.threads import parallel_for
from hetflow.ops.spatial import Geometry


@dataclass(frozen=True)
class PhaseLayout:
    """Where a strided 2-D Conv's phase planes lie (see the module docstring).

    Attributes:
        width: a phase's row length (the padded width over the column stride, rounded up).
        phase_size: elements of one phase (every tap of every block stays inside it).
        plane: elements of one channel's phases.
        span: output positions computed per plane (``OH * width`` rounded up to whole blocks).
        window: int64 ``[pad top, pad left, row stride, column stride, phase_size]`` for the compiled loops.
        offset_array: each tap's offset from its output position, int64, in kernel order.
    """

    width: int
    phase_size: int
    plane: int
    span: int
    window: np.ndarray = field(compare=False, repr=False)
    offset_array: np.ndarray = field(compare=False, repr=False)


@functools.lru_cache(maxsize=1024)
def phase_layout(geom: Geometry) -> PhaseLayout:
    """The phase planes of a 2-D Conv over ``geom``'s windows."""
    rows, columns = geom.axes
    width = -(-columns.padded // columns.stride)
    depth = -(-rows.padded // rows.stride)
    span = round_up(rows.out * width, SPAN_POSITIONS)
    taps = [(i * rows.dilation, j * columns.dilation) for i in range(rows.kernel) for j in range(columns.kernel)]
    inside = [(di // rows.stride) * width + dj // columns.stride for di, dj in taps]
    phase_size = max(span + max(inside), depth * width)
    offsets = [
        ((di % rows.stride) * columns.stride + dj % columns.stride) * phase_size + offset
        for (di, dj), offset in zip(taps, inside)
    ]
    window = np.array([rows.pad_begin, columns.pad_begin, rows.stride, columns.stride, phase_size], np.int64)
    phases = rows.stride * columns.stride
    return PhaseLayout(width, phase_size, phases * phase_size, span, window, np.array(offsets, np.int64))


def computed_products(batch: int, channels: int, kernels: int, geom: Geometry) -> int:
    """Multiply-adds ``conv2d`` carries out, the dropped ones included: every flat position of the span
    (the columns past OW too) for every kernel of whole blocks."""
    rows, columns = geom.axes
    return batch * phase_layout(geom).span * round_up(kernels, KERNEL_BLOCK) * channels * rows.kernel * columns.kernel


def buffer_shapes(channels: int, kernels: int, geom: Geometry) -> tuple[tuple[int, int], tuple[int, int]]:
    """One part's scratch: its phase planes ``(C, plane)`` and the products of one kernel block
    ``(KERNEL_BLOCK, span)`` (``_images`` copies each block out before the next)."""
    layout = phase_layout(geom)
    return (channels, layout.plane), (KERNEL_BLOCK, layout.span)


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geom: Geometry,
    bounds: Bounds,
    y: np.ndarray,
    mask: np.ndarray | None = None,
    wt: np.ndarray | None = None,
    buffers: PartBuffers | None = None,
) -> np.ndarray:
    """``jit_direct.conv2d`` for windows of any stride: same arguments and results, but no ``mask``
    (a Relu's backward reads its input through one only at stride 1). The images are split over the
    kernel threads (with fewer images than threads, each image's kernel blocks are)."""
    if mask is not None:
        raise ValueError("the strided direct Conv reads X as it is: no mask")
    layout = phase_layout(geom)
    wt = blocked_weights(w) if wt is None else wt
    bias = np.zeros(w.shape[0], np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    batch, channels, kernels = int(x.shape[0]), int(x.shape[1]), int(w.shape[0])
    blocks = int(wt.shape[0])
    threads = split_threads(computed_products(batch, channels, kernels, geom), batch, blocks)
    threads, buffers = fit_buffers(threads, buffers, buffer_shapes(channels, kernels, geom))
    shares, parts = call_parts(batch, threads)
    images = output_images(y) if shares > 1 else None

    def run(part: int) -> None:
        if images is None:
            first, last = batch * part // parts, batch * (part + 1) // parts
            _images(x, first, last, layout.window, layout.width, layout.offset_array, wt, 0, blocks, bias, bounds, y,
                    buffers.planes[part], buffers.products[part])  # fmt: skip
        else:
            _share(part, shares, x, layout.window, layout.width, layout.offset_array, wt, bias, bounds, images.flat,
                   images.stride, images.shape, buffers.planes[part], buffers.products[part])  # fmt: skip

    parallel_for(run, parts, threads)
    return y


def bind_one_part(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    """``jit_direct.bind_one_part`` for strided windows: ``run(x, wt, bias, y)``, one thread, the
    scratch's first part."""
    layout = phase_layout(geom)
    batch, planes, products = int(x_shape[0]), buffers.planes[0], buffers.products[0]
    blocks = round_up(kernels, KERNEL_BLOCK) // KERNEL_BLOCK

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray) -> None:
        _images(x, 0, batch, layout.window, layout.width, layout.offset_array, wt, 0, blocks, bias, bounds, y, planes,
                products)  # fmt: skip

    return run


def bind_block_split(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> BlockSplit:
    """``jit_direct.bind_block_split`` for strided windows: each image's kernel blocks shared out over
    ``parts`` parts of ``buffers`` (each share fills its own phase planes; a batch's images on the
    spinning pool), run by numba's threads or as a spin-pool job."""
    layout = phase_layout(geom)
    batch = int(x_shape[0])

    def native(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> None:
        shares = block_shares(parts, batch, buffers)
        assert batch * shares <= buffers.planes.shape[0], "more images than parts of the scratch"
        images = output_images(y)
        _split_blocks(shares, x, layout.window, layout.width, layout.offset_array, wt, bias, bounds, images.flat,
                      images.stride, images.shape, buffers.planes, buffers.products)  # fmt: skip

    def job(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> Job:
        shares = block_shares(parts, batch, buffers)
        images = output_images(y)
        return share_job(_share_address(), (shares, bounds_word(bounds), layout.width, 0, 0, *images.numbers), x,
                         (layout.window, layout.offset_array), wt, bias, images.flat, buffers.planes,
                         buffers.products, spin_chunks(parts, batch, shares, buffers))  # fmt: skip

    return BlockSplit(native, job)


@numba.njit(parallel=True, nogil=True, cache=True)
def _split_blocks(shares, x, window, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, planes, products):  # noqa: ANN001
    """Every image's kernel blocks in ``shares`` shares (``_share``), the parts run by numba's threads."""
    for part in numba.prange(x.shape[0] * shares):
        _share(part, shares, x, window, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, planes[part],
               products[part])  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _share(part, shares, x, window, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, xp, yb):  # noqa: ANN001
    """Part ``part``: image ``part // shares``, its kernel-block share ``part % shares``, its phase planes
    in ``xp`` and its products in ``yb`` (one part of the scratch); Y as ``jit_direct.OutputImages``."""
    blocks = wt.shape[0]
    image, share = part // shares, part % shares
    first, last = blocks * share // shares, blocks * (share + 1) // shares
    _image(x, image, window, width, offsets, wt, first, last, bias, bounds, image_of(y_flat, y_stride, y_shape, image),
           xp, yb)  # fmt: skip


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_share`` over chunk ``chunk``'s run of parts as a spin-pool job (``pack_share``'s block, the
    window before the offsets), in the chunk's part of the scratch."""
    x, planes, products = float32_4d(args, X_SLOT), float32_3d(args, 27), float32_3d(args, 31)
    stride, shape = job_image_shape_3d(args)
    first, last = chunk_parts(x.shape[0] * args[0], chunk, chunks)
    for part in range(first, last):
        _share(part, args[0], x, int64_1d(args, 14), args[2], int64_1d(args, 16), float32_4d(args, 18),
               float32_1d(args, 23), word_bounds(args[1]), float32_1d(args, 25), stride, shape, planes[chunk],
               products[chunk])  # fmt: skip


@functools.cache
def _share_address() -> int:
    return spin_pool.job(_share_job)


@numba.njit(nogil=True, cache=True)
def _images(x, first, last, window, width, offsets, wt, block_first, block_last, bias, bounds, y, xp, yb):  # noqa: ANN001
    """Images ``first .. last - 1`` (``_image``) into ``y``."""
    for image in range(first, last):
        _image(x, image, window, width, offsets, wt, block_first, block_last, bias, bounds, y[image], xp, yb)


@numba.njit(nogil=True, cache=True)
def _image(x, image, window, width, offsets, wt, block_first, block_last, bias, bounds, y_image, xp, yb):  # noqa: ANN001
    """Image ``image``: fill its phase planes into ``xp``, then each of the kernel blocks ``block_first ..
    block_last - 1`` multiplied into ``yb`` and cropped into ``y_image``. A block at a time, so the
    products take one block's scratch (0.4 MB for a 224x224 stem, against 3.3 MB for its 64 kernels:
    measured as fast, the copy-out reading them from L2)."""
    fill_phase_planes(x, image, window, width, xp)
    for block in range(block_first, block_last):
        multiply_blocks(xp, xp.shape[1], offsets, wt, block, block + 1, yb.shape[1], yb)
        crop_products(yb, block * KERNEL_BLOCK, width, bias, bounds, y_image)


@numba.njit(nogil=True, cache=True)
def fill_phase_planes(x, image, window, width, xp):  # noqa: ANN001
    """Image ``image`` of X into its phase planes ``xp [C, plane]`` (``window``: pad top, pad left, row
    stride, column stride, phase size), zeros everywhere else. Each phase row is written once, its
    padding and all: rows with no input row are zeroed; at column stride 2 both column phases of an
    input row come from one loop over its column pairs (``_paired_phase_rows``); at other strides each
    phase's row is a strided copy (``_phase_row``).

    Why the pairs: a stride-2 copy into one phase ran scalar, and the planes took 51 us of a 3x3/2 stem
    on 224x224 (one core), as much as one of its four blocks of kernels; paired, 17-22 us.
    """
    channels, height = x.shape[1], x.shape[2]
    top, left, row_stride, column_stride, phase_size = window[0], window[1], window[2], window[3], window[4]
    flat = xp.reshape(xp.size)
    rows = phase_size // width
    for channel in range(channels):
        for qr in range(row_stride):
            phases = channel * xp.shape[1] + qr * column_stride * phase_size
            for pr in range(rows):
                r = pr * row_stride + qr - top
                row = phases + pr * width
                if r < 0 or r >= height:
                    for qc in range(column_stride):
                        _zero(flat, row + qc * phase_size, row + qc * phase_size + width)
                elif column_stride == 2:
                    _paired_phase_rows(flat, row, row + phase_size, x[image, channel, r], width, left)
                else:
                    for qc in range(column_stride):
                        _phase_row(flat, row + qc * phase_size, x[image, channel, r], width, column_stride, qc, left)
            for qc in range(column_stride):
                start = phases + qc * phase_size
                _zero(flat, start + rows * width, start + phase_size)


@numba.njit(nogil=True, cache=True, inline="always")
def _zero(flat, first, last):  # noqa: ANN001, ANN202
    """``flat[first:last]`` = 0."""
    zero = np.float32(0)
    for t in range(np.uint64(first), np.uint64(last)):
        flat[t] = zero


@numba.njit(nogil=True, cache=True, inline="always")
def _phase_row(flat, row, source, width, column_stride, qc, left):  # noqa: ANN001, ANN202
    """One phase row from ``row`` of ``flat``: column pc holds ``source[pc * column_stride + qc - left]``
    where that lies in the input row ``source``, zero elsewhere."""
    columns = source.shape[0]
    lo = min(width, max(0, (left - qc + column_stride - 1) // column_stride))
    hi = max(lo, min(width, (columns - 1 - qc + left) // column_stride + 1))
    _zero(flat, row, row + lo)
    step, first, start = np.uint64(column_stride), np.uint64(lo * column_stride + qc - left), np.uint64(row + lo)
    for t in range(np.uint64(hi - lo)):
        flat[start + t] = source[first + t * step]
    _zero(flat, row + hi, row + width)


@numba.njit(nogil=True, cache=True, inline="always")
def _paired_phase_rows(flat, even, odd, source, width, left):  # noqa: ANN001, ANN202
    """Both column phases of the input row ``source`` at column stride 2, phase 0's row from ``even`` and
    phase 1's from ``odd`` of ``flat``: column pc holds ``source[2 pc - left]`` and ``source[2 pc + 1 -
    left]``, zero outside the row. Where both lie inside, one loop reads each pair and writes both (LLVM
    makes it vector loads and shuffles); the few columns at the ends go one at a time."""
    columns, zero = source.shape[0], np.float32(0)
    lo = min(width, (left + 1) // 2)
    hi = max(lo, min(width, (columns + left) // 2))
    for pc in range(lo):
        for qc, row in ((0, even), (1, odd)):
            c = 2 * pc + qc - left
            flat[row + pc] = source[c] if 0 <= c < columns else zero
    first, a, b = np.uint64(2 * lo - left), np.uint64(even + lo), np.uint64(odd + lo)
    two, one = np.uint64(2), np.uint64(1)
    for t in range(np.uint64(hi - lo)):
        flat[a + t] = source[first + two * t]
        flat[b + t] = source[first + two * t + one]
    # NOTE: the edges written here, not by a helper of their own: one made the pair loop 1.7x slower.
    for pc in range(hi, width):
        for qc, row in ((0, even), (1, odd)):
            c = 2 * pc + qc - left
            flat[row + pc] = source[c] if 0 <= c < columns else zero
