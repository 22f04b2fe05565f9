"""3x3 stride-1 pools padded by one on every side (output the size of the input): the branch pools of
Inception v2 and GoogLeNet, as two separable passes over each flat plane.

Why: ``jit_pool_lanes`` loads all 9 taps of every output and keeps one output row per vector, so a 14x14
map fills 14 of 16 lanes and a 7x7 map two rows of 7; ``jit_pool_rows`` sweeps only rows of 16 outputs
or more. Here a plane is taken as one flat run of H*W floats: first each position's window along its row
(3 taps, those at a row's first or last column reading the padding) into a plane-sized buffer, then each
output's three row results above, at and below it. Each pass is one loop over the whole plane, which LLVM
turns into full 16-lane vectors on any map size, and a sum or a maximum takes 4 operations per output
instead of 8. Both window reductions are separable: a maximum exactly, a sum up to float32 rounding.

Measured on one core, batch 16, the minimum of 30 calls of ``jit_pool_lanes.vector_planes`` (its vector
loop, or its row sweep on 28x28 and 56x56) before -> after, in two processes each, ms: average 576x14x14
1.00 -> 0.28, 1024x7x7 1.11 -> 0.13, 832x14x14 1.71-2.13 -> 0.42, 256x28x28 0.98-1.06 -> 0.53,
480x28x28 3.31-3.57 -> 1.22-1.54, 192x56x56 4.06-4.69 -> 3.82-3.87 (a map past L2: memory decides);
maximum 576x14x14 1.08 -> 0.38, 1024x7x7 0.55 -> 0.17, 832x14x14 1.82-2.54 -> 0.55-0.59, 256x28x28
0.87-0.95 -> 0.68, 480x28x28 2.63-2.83 -> 1.36-1.50, 192x56x56 3.83-4.26 -> 3.77. Whole models, 2
threads, alternating processes (``benchmarks/ab.py``, minimums): batch 16 inception_v2 0.96x the time,
googlenet 0.95x; batch 1 googlenet 0.98x, inception_v2 0.97x (and 1.05x in a first run of 3 rounds:
its 4 pools of 576x14x14 went from 163 to 80 us in the run).

Maximum: NaN propagates as with np.maximum (``_maximum``); the padding is -inf and never wins. Average:
the sum times ``scale`` (the reciprocal window counts), the padding adding zero.
"""

from __future__ import annotations

import numba
import numpy as np

from hetflow.ops.spatial import Geometry

#: The window (both axes) and the padding on every side that this loop takes, at stride 1.
WINDOW = 3
PAD = 1


@numba.njit(nogil=True, cache=True, inline="always")
def takes(kh, kw, sh, sw, dh, dw, pad_top, pad_left, height, width, out_h, out_w):  # noqa: ANN001, ANN201
    """Whether this loop pools the window: 3x3, stride 1, no dilation, padded by one on every side (the
    top and left padding given, the bottom and right implied by an output the size of the input), on maps
    of two rows or more."""
    square = kh == WINDOW and kw == WINDOW and sh == 1 and sw == 1 and dh == 1 and dw == 1
    return square and pad_top == PAD and pad_left == PAD and out_h == height and out_w == width and height >= 2


def takes_geometry(geo: Geometry, dtype: np.dtype) -> bool:
    """``takes`` for a pool's geometry over an X of ``dtype`` (float32: ``jit_pool_lanes`` hands it on)."""
    if len(geo.axes) != 2 or np.dtype(dtype) != np.float32:
        return False
    rows, columns = geo.axes
    return bool(takes(rows.kernel, columns.kernel, rows.stride, columns.stride, rows.dilation, columns.dilation,
                      rows.pad_begin, columns.pad_begin, rows.size, columns.size, rows.out, columns.out))


@numba.njit(nogil=True, cache=True, inline="always")
def _maximum(a, b):  # noqa: ANN001, ANN202
    """The larger of ``a`` and ``b``, NaN where either is (np.maximum's rule): two compares and a select."""
    return a if (a > b or a != a) else b


@numba.njit(nogil=True, cache=True)
def pool_planes(x, y, image_stride, first, last, is_max, scale):  # noqa: ANN001, ANN201
    """Output planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of the flat float32 Y
    ``y`` (images ``image_stride`` floats apart, each ``[C, H, W]`` contiguous) pooled from the
    C-contiguous float32 ``x`` ``[N, C, H, W]``: the maximum of each 3x3 window, or its sum times
    ``scale`` ``[H, W]``. Planes lying end to end in both X and Y are taken ``BLOCK_FLOATS`` at a time."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    size = height * width
    flat_x, flat_scale = x.reshape(-1), scale.reshape(-1)
    block = max(1, min(last - first, -(-BLOCK_FLOATS // size)))
    edges = _edges(block, height, width)
    rows = np.empty(block * size, np.float32)
    scales = np.empty(0, np.float32) if is_max else _tiled(flat_scale, block)
    # A block may run on into the next image only where Y's images lie end to end.
    contiguous = image_stride == channels * size
    plane = first
    while plane < last:
        channel = plane % channels
        count = min(block, last - plane, last - plane if contiguous else channels - channel)
        # NOTE: unsigned offsets: a signed index puts a negative-index branch on every access, and the
        # loops then do not vectorise.
        start = np.uint64(plane * size)
        out = np.uint64((plane // channels) * image_stride + channel * size)
        n, w = np.uint64(count * size), np.uint64(width)
        if is_max:
            _row_maxima(flat_x, start, n, edges, rows)
            _column_maxima(rows, n, w, edges, y, out)
        else:
            _row_sums(flat_x, start, n, edges, rows)
            _column_sums(rows, n, w, edges, scales, y, out)
        plane += count


#: Floats of X's planes taken in one pass: a 7x7 plane alone (49 floats) is shorter than one iteration
#: of the vectorised loop (4 vectors of 16), and would run scalar.
BLOCK_FLOATS = 1024
#: The rows of ``_edges``: which positions have a neighbour to the left, right, above and below.
LEFT, RIGHT, ABOVE, BELOW = 0, 1, 2, 3


@numba.njit(nogil=True, cache=True)
def _edges(planes, height, width):  # noqa: ANN001, ANN201
    """``[4, planes * height * width]`` flags of ``planes`` flat planes end to end: which positions have
    a neighbour inside their plane to the left, right, above and below (``LEFT`` .. ``BELOW``)."""
    size = height * width
    edges = np.ones((4, planes * size), np.bool_)
    edges[LEFT, ::width] = False
    edges[RIGHT, width - 1 :: width] = False
    for plane in range(planes):
        edges[ABOVE, plane * size : plane * size + width] = False
        edges[BELOW, (plane + 1) * size - width : (plane + 1) * size] = False
    return edges


@numba.njit(nogil=True, cache=True)
def _tiled(scale, planes):  # noqa: ANN001, ANN201
    """The flat ``scale`` of one plane repeated for ``planes`` planes end to end."""
    tiled = np.empty(planes * scale.size, np.float32)
    for plane in range(planes):
        tiled[plane * scale.size : (plane + 1) * scale.size] = scale
    return tiled


@numba.njit(nogil=True, cache=True, inline="always")
def _row_maxima(x, start, n, edges, rows):  # noqa: ANN001, ANN202
    lowest, one = np.float32(-np.inf), np.uint64(1)
    for m in range(n):
        at = start + m
        left = x[at - one] if edges[LEFT, m] else lowest
        right = x[at + one] if edges[RIGHT, m] else lowest
        rows[m] = _maximum(_maximum(x[at], left), right)


@numba.njit(nogil=True, cache=True, inline="always")
def _column_maxima(rows, n, w, edges, y, out):  # noqa: ANN001, ANN202
    lowest = np.float32(-np.inf)
    for m in range(n):
        above = rows[m - w] if edges[ABOVE, m] else lowest
        below = rows[m + w] if edges[BELOW, m] else lowest
        y[out + m] = _maximum(_maximum(above, rows[m]), below)


@numba.njit(nogil=True, cache=True, inline="always")
def _row_sums(x, start, n, edges, rows):  # noqa: ANN001, ANN202
    zero, one = np.float32(0.0), np.uint64(1)
    for m in range(n):
        at = start + m
        left = x[at - one] if edges[LEFT, m] else zero
        right = x[at + one] if edges[RIGHT, m] else zero
        rows[m] = left + x[at] + right


@numba.njit(nogil=True, cache=True, inline="always")
def _column_sums(rows, n, w, edges, scales, y, out):  # noqa: ANN001, ANN202
    zero = np.float32(0.0)
    for m in range(n):
        above = rows[m - w] if edges[ABOVE, m] else zero
        below = rows[m + w] if edges[BELOW, m] else zero
        y[out + m] = (above + rows[m] + below) * scales[m]
