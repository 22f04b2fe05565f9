"""2-D im2col and its adjoint (col2im) compiled with numba, for a range of images at a time.

The training Conv (``conv_train``) multiplies a few images' columns at a time so that they stay in the
core's L2 cache between being written and being read by the GEMM. numpy builds them with one strided
copy per kernel tap (plus a padded copy of the input), whose call overheads dominate at that size:
measured on one core over batch 128, one image at a time, 32x32x32 with a 3x3 window 36.5 -> 13.9 ms,
64x8x8 19.2 -> 5.5 ms. Here each column row is filled in one pass, with the padding written as zeros
instead of read from a padded copy.

Layout, as ``hetflow.ops.conv.channel_columns`` (channel-major): ``cols [C*kh*kw, n*OH*OW]``, rows
ordered ``(c, i, j)`` like W's flattening, columns ``(image, oy, ox)``, for the images
``first .. first + n - 1`` of X ``[N, C, H, W]``.

Second layout, position-major (``position_columns_2d``): ``[n*OH*OW, kh*kw*C]``, rows ``(image, oy, ox)``,
columns ``(i, j, c)`` (W's flattening after moving its channel axis last). Each row is ``kh*kw`` runs of
``C`` contiguous values read from a zero-bordered ``[H', W', C]`` copy of the image (``pixel_scratch``),
so no bounds are tested per value. The forward GEMM on it, ``cols @ W^T``, makes ``[n*OH*OW, K]`` products,
which ``planes_from_products`` lays out as Y's ``[K, OH*OW]`` planes with the bias and a Relu.
"""

from __future__ import annotations

import numba
import numpy as np

from hetflow.ops.spatial import Geometry


def im2col_2d(x: np.ndarray, first: int, count: int, geom: Geometry, cols: np.ndarray) -> None:
    """Fill ``cols`` (``[C*kh*kw, count*OH*OW]``, C-contiguous) with the columns of images
    ``first .. first + count - 1`` of ``x`` (``[N, C, H, W]``) over ``geom``'s 2-D windows."""
    rows, columns = geom.axes
    _im2col(x, first, count, cols, *_window(geom), rows.out, columns.out)


def col2im_2d(cols: np.ndarray, geom: Geometry, dx: np.ndarray, first: int, count: int) -> None:
    """The adjoint of ``im2col_2d``: add every column entry into the input position it was read from,
    into images ``first .. first + count - 1`` of ``dx`` (``[N, C, H, W]``, C-contiguous). Entries read
    from the padding are dropped. Each position's contributions are added in tap order, as
    ``hetflow.ops.conv.channel_col2im`` adds them."""
    rows, columns = geom.axes
    _col2im(cols, dx, first, count, *_window(geom), rows.out, columns.out)


def _window(geom: Geometry) -> tuple[int, ...]:
    """(kh, kw, sh, sw, dh, dw, pad_top, pad_left) of a 2-D geometry."""
    rows, columns = geom.axes
    return (
        rows.kernel, columns.kernel, rows.stride, columns.stride,
        rows.dilation, columns.dilation, rows.pad_begin, columns.pad_begin,
    )  # fmt: skip


def pixel_scratch(x_shape: tuple[int, ...], geom: Geometry, dtype: np.dtype) -> np.ndarray:
    """The zeroed ``[H', W', C]`` buffer ``position_columns_2d`` copies one image at a time into: X's
    image placed after the leading pads, the padding left zero."""
    rows, columns = geom.axes
    return np.zeros((rows.padded, columns.padded, int(x_shape[1])), dtype)


def position_columns_2d(
    x: np.ndarray, first: int, count: int, geom: Geometry, cols: np.ndarray, scratch: np.ndarray
) -> None:
    """Fill ``cols`` (``[count*OH*OW, kh*kw*C]``, C-contiguous) with the position-major columns of images
    ``first .. first + count - 1`` of ``x`` (``[N, C, H, W]``), through ``scratch`` (``pixel_scratch``'s,
    whose border must still be zero)."""
    rows, columns = geom.axes
    _position_columns(x, first, count, cols, scratch, *_window(geom), rows.out, columns.out)


def planes_from_products(
    products: np.ndarray, bias: np.ndarray, relu: bool, y: np.ndarray, first: int, count: int
) -> None:
    """``y[first + n, k, p] = products[n*P + p, k] + bias[k]`` (then ``max(., 0)`` when ``relu``) for the
    ``count`` images; ``products`` ``[count*P, K]`` and ``y`` ``[N, K, P]`` C-contiguous."""
    _planes_from_products(products, bias, relu, y, first, count)


# NOTE: the loops index a 1-D view of one column row per image and a 2-D view of one input plane with
# offsets from 0: indexing the whole arrays with a running offset added measured 2.5x slower (the
# compiler no longer vectorises the copy), as did splitting each row into its padding and interior runs.
@numba.njit(nogil=True, cache=True)
def _im2col(x, first, count, cols, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w):  # noqa: ANN001
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    positions = out_h * out_w
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(count):
                    plane = x[first + n, c]
                    target = cols[row, n * positions : (n + 1) * positions]
                    for oy in range(out_h):
                        iy = oy * sh + i * dh - pad_top
                        base = oy * out_w
                        if iy < 0 or iy >= height:
                            for ox in range(out_w):
                                target[base + ox] = 0
                            continue
                        for ox in range(out_w):
                            ix = ox * sw + j * dw - pad_left
                            if ix >= 0 and ix < width:
                                target[base + ox] = plane[iy, ix]
                            else:
                                target[base + ox] = 0


@numba.njit(nogil=True, cache=True)
def _col2im(cols, dx, first, count, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w):  # noqa: ANN001
    channels, height, width = dx.shape[1], dx.shape[2], dx.shape[3]
    positions = out_h * out_w
    for n in range(first, first + count):
        dx[n] = 0
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(count):
                    plane = dx[first + n, c]
                    source = cols[row, n * positions : (n + 1) * positions]
                    for oy in range(out_h):
                        iy = oy * sh + i * dh - pad_top
                        if iy < 0 or iy >= height:
                            continue
                        base = oy * out_w
                        for ox in range(out_w):
                            ix = ox * sw + j * dw - pad_left
                            if ix >= 0 and ix < width:
                                plane[iy, ix] += source[base + ox]


# NOTE: the image is copied one input row at a time, channel by channel, so that both the row read and
# the [W', C] block written stay in L1; copying channel plane by channel plane measured 2.3x slower for
# 32x32x32 (the writes, C apart, then span the whole 150 KB copy).
@numba.njit(nogil=True, cache=True)
def _position_columns(x, first, count, cols, scratch, kh, kw, sh, sw, dh, dw, pad_top, pad_left, out_h, out_w):  # noqa: ANN001
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    positions = out_h * out_w
    for n in range(count):
        for iy in range(height):
            target = scratch[iy + pad_top]
            for c in range(channels):
                line = x[first + n, c, iy]
                for ix in range(width):
                    target[ix + pad_left, c] = line[ix]
        for oy in range(out_h):
            for ox in range(out_w):
                row = cols[n * positions + oy * out_w + ox]
                for i in range(kh):
                    source = scratch[oy * sh + i * dh]
                    for j in range(kw):
                        pixel = source[ox * sw + j * dw]
                        base = (i * kw + j) * channels
                        for c in range(channels):
                            row[base + c] = pixel[c]


@numba.njit(nogil=True, cache=True)
def _planes_from_products(products, bias, relu, y, first, count):  # noqa: ANN001
    kernels, positions = y.shape[1], y.shape[2]
    for n in range(count):
        block = products[n * positions : (n + 1) * positions]
        for k in range(kernels):
            plane = y[first + n, k]
            offset = bias[k]
            for p in range(positions):
                value = block[p, k] + offset
                if relu and value < 0:
                    value = 0
                plane[p] = value
