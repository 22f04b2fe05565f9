"""Inference im2col for 2-D convolutions, compiled with numba: any stride, dilation and padding, straight
from X (no padded copy), in either of the two column layouts the Conv kernels multiply.

numpy builds the columns by copying the 6-D windows view of a padded copy of X, and that copy runs at
1-2 ns an element on the short rows of small feature maps. Here each column row is written run by run:
for one tap and one output row, the output columns whose input lies inside X are one copy (contiguous
at stride 1), and only the columns that fall on the padding are zeroed. Measured on one core against
the numpy copy (interleaved minimums, batch 1 unless noted): LeNet's 20x12x12 5x5 layer 38 -> 20 us,
cifar10-quick's 32x16x16 5x5 pad 2 layer 127 -> 100 us, AlexNet's 11x11 stride-4 first layer 730 -> 486
us, ZFNet's 96x55x55 5x5 stride-2 layer 967 -> 660 us, GoogLeNet's 64x56x56 3x3 layer 783 -> 527 us;
ratios 0.3-0.8 on 15 zoo layers, AlexNet's 64x27x27 5x5 layer at batch 16 0.8.

The training Conv keeps ``jit_columns``' single-pass loop, which measured faster on its 8-32 wide maps
at stride 1 (each row one vector loop with the padding test inside) and 2-2.5x slower than this one at
strides 2 and 4 (a gather with a test per element).

Layouts (rows ordered ``(c, i, j)`` like W's flattening, ``P = OH*OW``):

* image-major ``[n, C*kh*kw, P]``: each image's columns are the right operand of its own GEMM;
* channel-major ``[C*kh*kw, n*P]``: one GEMM over a chunk of images (``hetflow.ops.conv.channel_columns``).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_4d
from hetflow.devices.cpu.threads import spin_split, split_planes
from hetflow.ops.spatial import Geometry


def im2col(x: np.ndarray, geom: Geometry, cols: np.ndarray, channel_major: bool = False) -> None:
    """Fill ``cols`` with the columns of every image of ``x`` (``[n, C, H, W]``, C-contiguous, float) over
    ``geom``'s 2-D windows: ``[n, C*kh*kw, P]``, or ``[C*kh*kw, n*P]`` when ``channel_major``.

    ``cols`` must be C-contiguous; its contents on entry do not matter. Large copies are split by input
    channel over the kernel threads (the loop releases the GIL).
    """
    count, channels, height, width = x.shape
    strides, window, per_channel = _layout(x, geom, channel_major)
    flat_x, flat_cols = x.reshape(-1), cols.reshape(-1)
    if _spin_fill(x, flat_cols, (*strides, *window), channels, per_channel):
        return
    shape = (count, channels, height, width, *strides)
    split_planes(
        lambda first, last: _fill(flat_x, flat_cols, first, last, *shape, *window, 0, geom.axes[0].out),
        lambda parts: _split(parts, flat_x, flat_cols, *shape, *window),
        channels, per_channel,
    )  # fmt: skip


def _layout(x: np.ndarray, geom: Geometry, channel_major: bool) -> tuple[tuple[int, int], tuple[int, ...], int]:
    """The columns' (row stride, image stride), the window's ten numbers, and the columns' elements per
    input channel."""
    count, channels = x.shape[:2]
    rows, columns = geom.axes
    positions = rows.out * columns.out
    taps = rows.kernel * columns.kernel
    strides = (count * positions, positions) if channel_major else (positions, channels * taps * positions)
    window = (
        rows.kernel, columns.kernel, rows.stride, columns.stride,
        rows.dilation, columns.dilation, rows.pad_begin, columns.pad_begin, rows.out, columns.out,
    )  # fmt: skip
    return strides, window, taps * count * positions


def im2col_rows(x: np.ndarray, geom: Geometry, cols: np.ndarray, first_row: int, last_row: int) -> None:
    """Fill ``cols`` (C-contiguous, ``[C*kh*kw, (last_row - first_row) * OW]``) with the columns of the
    output rows ``first_row .. last_row - 1`` of the one image ``x`` (``[1, C, H, W]``), on the calling
    thread: a band of an image's columns, small enough to stay in cache for the GEMM that reads it."""
    rows, columns = geom.axes
    fill_rows(x, cols.reshape(-1), rows.kernel, columns.kernel, rows.stride, columns.stride, rows.dilation,
              columns.dilation, rows.pad_begin, columns.pad_begin, rows.out, columns.out, first_row, last_row)


@numba.njit(nogil=True, cache=True)
def fill_rows(x, cols, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, first_row, last_row):  # noqa: ANN001, ANN201
    """``im2col_rows`` in compiled code: the flat ``cols`` ``[C*kh*kw, (last_row - first_row) * out_w]``
    of the one image ``x`` ``[1, C, H, W]``, for its output rows ``first_row .. last_row - 1``."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    _fill(x.reshape(-1), cols, 0, channels, 1, channels, height, width, (last_row - first_row) * out_w, 0,
          kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, first_row, last_row)  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, cols, count, channels, height, width, row_stride, image_stride,  # noqa: ANN001
           kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w):  # fmt: skip
    """``_fill`` over ``parts`` ranges of input channels, run by numba's threads."""
    for part in numba.prange(parts):
        first, last = channels * part // parts, channels * (part + 1) // parts
        _fill(x, cols, first, last, count, channels, height, width, row_stride, image_stride,
              kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, 0, out_h)  # fmt: skip


# NOTE: indices are unsigned sums on flat arrays: numba tests a signed index for wraparound, and that
# test keeps the copy loops from vectorising (see jit_phases).
@numba.njit(nogil=True, cache=True)
def _fill(x, cols, first, last, count, channels, height, width, row_stride, image_stride,  # noqa: ANN001
          kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, first_oy, last_oy):  # fmt: skip
    """Column rows of input channels ``first .. last - 1``, for output rows ``first_oy .. last_oy - 1``
    (output row ``first_oy`` at the start of each column row)."""
    step = np.uint64(sw)
    plane_size = height * width
    for c in range(first, last):
        for i in range(kh):
            for j in range(kw):
                row = np.uint64(((c * kh + i) * kw + j) * row_stride)
                shift = j * dw - pad_left
                # Output columns lo .. hi - 1 read inside X: 0 <= ox*sw + shift < width.
                lo = 0 if shift >= 0 else min(out_w, (-shift + sw - 1) // sw)
                hi = max(lo, min(out_w, (width - shift + sw - 1) // sw))
                for n in range(count):
                    plane = (n * channels + c) * plane_size
                    for oy in range(first_oy, last_oy):
                        target = row + np.uint64(n * image_stride + (oy - first_oy) * out_w)
                        iy = oy * sh + i * dh - pad_top
                        if iy < 0 or iy >= height:
                            for ox in range(np.uint64(out_w)):
                                cols[target + ox] = 0
                            continue
                        for ox in range(np.uint64(lo)):
                            cols[target + ox] = 0
                        source = np.uint64(plane + iy * width + lo * sw + shift)
                        start = target + np.uint64(lo)
                        for t in range(np.uint64(hi - lo)):
                            cols[start + t] = x[source + t * step]
                        for ox in range(np.uint64(hi), np.uint64(out_w)):
                            cols[target + ox] = 0


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a spin job's argument block: X (4-D), the flat columns (1-D), then the row and image
#: strides and the window's ten numbers (``im2col``'s ``window``).
_SPIN_SLOTS = 5 + 2 + 2 + 10


def _spin_fill(x: np.ndarray, flat_cols: np.ndarray, numbers: tuple[int, ...], channels: int,
               per_channel: int) -> bool:  # fmt: skip
    """``_fill`` by ranges of input channels on a spinning run's pool; False where it does not split there.

    Why: a spinning run (one image) has no core for the Python pool's thread beside its spinning
    worker, so there the columns were built on one thread: ResNet-50's 512x7x7 3x3 layer spent 171 us
    of its ~800 on its 903 KB of columns while the other core waited for the product."""
    found = spin_split(channels, per_channel, (x, flat_cols))
    if found is None:
        return False
    pool, shares = found
    _bound_fill(x, flat_cols, numbers, shares).run(pool)
    return True


def im2col_job(x: np.ndarray, geom: Geometry, cols: np.ndarray, channel_major: bool = False) -> Job:
    """``im2col`` (float32, C-contiguous arrays; image-major, or channel-major) as a spin-pool job, what a
    captured run replays: by ranges of input channels as a spinning run splits it (``spin_split``), else
    one chunk."""
    strides, window, per_channel = _layout(x, geom, channel_major)
    flat_cols = cols.reshape(-1)
    found = spin_split(x.shape[1], per_channel, (x, flat_cols))
    return _bound_fill(x, flat_cols, (*strides, *window), 1 if found is None else found[1])


def _bound_fill(x: np.ndarray, flat_cols: np.ndarray, numbers: tuple[int, ...], shares: int) -> Job:
    return Job(_fill_address(), argument_block(_SPIN_SLOTS, (x, flat_cols), numbers), shares, (x, flat_cols))


def _fill_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of input channels through ``_fill`` (``_spin_fill``'s block)."""
    x, cols = float32_4d(args, 0), float32_1d(args, 5)
    count, channels, height, width = x.shape
    first, last = channels * chunk // chunks, channels * (chunk + 1) // chunks
    _fill(x.reshape(x.size), cols, first, last, count, channels, height, width, args[7], args[8],
          args[9], args[10], args[11], args[12], args[13], args[14], args[15], args[16], args[17], args[18],
          0, args[17])  # fmt: skip


@functools.cache
def _fill_address() -> int:
    return spin_pool.job(_fill_job)
