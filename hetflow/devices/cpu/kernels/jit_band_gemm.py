"""One image's im2col Conv in bands of output rows on the spinning pool, each band's columns multiplied
by the tile GEMM while they are in the cache, the bias and a clamp activation applied as tiles are stored.

A share of the job is a range of whole output rows, taken a band at a time: the band's columns
``[C*kh*kw, rows*OW]`` are built (``jit_im2col.fill_rows``) into the share's own stretch of a columns
buffer, then every row block of W passes over them (``jit_tile_gemm.columns``), writing the band's
columns of Y ``[K, OH*OW]``. The share's next band reuses the stretch, which is still in the cache.

Why: at batch 1 the first layer of MobileNet v2 (3 -> 32, 3x3 stride 2 on 224x224) took 430 us in a
spinning run as im2col (the columns built on the Python pool beside the spinning worker, BLAS's product
split on the spinning pool, then a pass for the bias and ReLU6), against 250 us for its product alone on
one thread. Columns 27 deep are what the tile GEMM's register tiles stream best, and a band's columns
never leave the cache. That layer took 204 us in-run after, ShuffleNet's 3 -> 24 first layer 380 -> 159
us; whole runs at batch 1 (A/B, alternating processes, minimums): shufflenet and squeezenet 0.91x,
googlenet 0.92x, mobilenetv2 0.95x, inception_v2 0.96x, zfnet512 0.97x, resnet50 0.98x.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels.jit_im2col import fill_rows
from hetflow.devices.cpu.kernels.jit_tile_gemm import ROWS, block_width, columns
from hetflow.devices.cpu.spin_pool import float32_1d, float32_4d, put_arrays, put_values


@numba.njit(nogil=True, cache=True)
def band(x, w, bias, low, high, y, y_start, cols, kernels, kh, kw, sh, sw, dh, dw, pad_top, pad_left,  # noqa: ANN001, ANN201
         out_h, out_w, first_row, last_row, block_bytes):  # fmt: skip
    """Output rows ``first_row .. last_row - 1`` of ``Y [K, OH*OW]`` (from ``y_start`` of the flat ``y``)
    = clamp(W @ columns + bias, low, high) of the one image ``x`` ``[1, C, H, W]``, W the flat ``[K,
    C*kh*kw]``; the band's columns are built at the start of the flat ``cols``."""
    depth = x.shape[1] * kh * kw
    count = (last_row - first_row) * out_w
    fill_rows(x, cols, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w, first_row, last_row)
    blocks = np.int64((kernels + ROWS - 1) // ROWS)
    columns(w, np.int64(depth), cols, np.int64(0), np.int64(count), y, np.int64(y_start + first_row * out_w),
            np.int64(out_h * out_w), np.int64(kernels), bias, y, np.int64(0), np.int64(-1), low, high, np.int64(0),
            np.int64(count), block_width(block_bytes, depth), np.int64(0), blocks)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def rows(x, w, bias, low, high, y, y_start, cols, kernels, kh, kw, sh, sw, dh, dw, pad_top, pad_left,  # noqa: ANN001, ANN201
         out_h, out_w, first_row, last_row, band_rows, block_bytes):  # fmt: skip
    """``band`` over the output rows ``first_row .. last_row - 1``, ``band_rows`` at a time, every band's
    columns built in the same stretch of ``cols`` (so that they stay in the cache)."""
    for top in range(first_row, last_row, band_rows):
        band(x, w, bias, low, high, y, y_start, cols, kernels, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h,
             out_w, top, min(last_row, top + band_rows), block_bytes)  # fmt: skip


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block (``pack_job``): X (4-D), W, the bias, the bounds, Y and the columns
#: (1-D each), then 14 numbers: y_start, kernels, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w,
#: band_rows, block_bytes.
JOB_SLOTS = 29


def new_job_block() -> np.ndarray:
    """An argument block for ``pack_job`` (one job at a time uses it)."""
    return np.zeros(JOB_SLOTS, np.int64)


@numba.njit(nogil=True, cache=True)
def pack_job(block, x, w, bias, bounds, y, cols, numbers):  # noqa: ANN001, ANN201
    """Fill ``block`` for ``job_address()``: ``band``'s arrays, ``bounds`` the float32 (low, high), and
    ``numbers`` (see ``JOB_SLOTS``)."""
    put_values(block, put_arrays(block, 0, (x, w, bias, bounds, y, cols)), numbers)


def _rows_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """Range ``chunk`` of ``chunks`` of the output rows through ``rows`` as a spin-pool job (``pack_job``'s
    block), its bands' columns in stretch ``chunk`` of the columns buffer (``band_rows`` rows' worth each)."""
    x, w, bias = float32_4d(args, 0), float32_1d(args, 5), float32_1d(args, 7)
    bounds, y, cols = float32_1d(args, 9), float32_1d(args, 11), float32_1d(args, 13)
    out_h, out_w, band_rows = args[25], args[26], args[27]
    stretch = x.shape[1] * args[17] * args[18] * band_rows * out_w
    rows(x, w, bias, bounds[0], bounds[1], y, args[15], cols[chunk * stretch : (chunk + 1) * stretch], args[16],
         args[17], args[18], args[19], args[20], args[21], args[22], args[23], args[24], out_h, out_w,
         out_h * chunk // chunks, out_h * (chunk + 1) // chunks, band_rows, args[28])  # fmt: skip


@functools.cache
def job_address() -> int:
    """The address of ``rows`` compiled as a spin-pool job (on first use)."""
    return spin_pool.job(_rows_job)
