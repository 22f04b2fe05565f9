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
0.28 ms. One generic function now serves every window, compiled once and cached on disk.

Like ``jit_depthwise``, the compiled loop releases the GIL and the planes are split over the CPU's
kernel threads.
"""

from __future__ import annotations

import numba
import numpy as np

from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.jit_phases import fill_phases, layout, tap_start
from hetflow.devices.cpu.threads import split_planes
from hetflow.ops.spatial import Geometry


def compiled_window(geo: Geometry) -> bool:
    """Whether ``geo`` is a 2-D window (the compiled loop takes any of those)."""
    return len(geo.axes) == 2


#: The scale argument of a max pool (unread; the compiled loop takes an array of X's dtype either way).
_UNUSED_SCALE = {dtype: np.ones((1, 1), dtype) for dtype in COMPILED_DTYPES}


def pool_2d(x: np.ndarray, y: np.ndarray, geo: Geometry, scale: np.ndarray | None) -> None:
    """``y`` = the 2-D pool of ``x`` ``[N, C, H, W]`` (C-contiguous) over ``geo``'s windows, in place.

    ``scale`` None: the maximum (padding never wins; NaN propagates, as with np.maximum). Otherwise the
    sum times ``scale`` ``[OH, OW]`` (the reciprocal window counts: an average), padding adding zero.
    """
    if y.size == 0:
        return
    rows, cols = geo.axes
    is_max = scale is None
    weights = _UNUSED_SCALE[x.dtype] if is_max else np.ascontiguousarray(scale, x.dtype)
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation)

    pads = (rows.pad_begin, cols.pad_begin)
    split_planes(
        lambda first, last: _planes(x, y, first, last, *window, *pads, is_max, weights),
        lambda parts: _split(parts, x, y, *window, *pads, is_max, weights),
        y.shape[0] * y.shape[1], rows.out * cols.out,
    )  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, y, kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # noqa: ANN001
    """``_planes`` over ``parts`` ranges of Y's planes, run by numba's threads."""
    planes = y.shape[0] * y.shape[1]
    for part in numba.prange(parts):
        first, last = planes * part // parts, planes * (part + 1) // parts
        _planes(x, y, first, last, kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale)


# NOTE: no fastmath here: it would let the compiler assume no NaN, and a max pool must propagate NaN.
@numba.njit(nogil=True, cache=True)
def _planes(x, y, first, last, kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # noqa: ANN001
    """Output planes ``first .. last - 1`` (plane p = image p // C, channel p % C)."""
    channels = x.shape[1]
    out_h, out_w = y.shape[2], y.shape[3]
    span, depth, block_rows = layout(out_h, out_w, kh, kw, sh, sw, dh, dw)
    phases = np.full((sh * sw, depth * span), -np.inf if is_max else 0.0, x.dtype)  # padding, written once
    acc = np.empty(block_rows * span, x.dtype)
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        fill_phases(x, image, channel, phases, sh, sw, pad_top, pad_left, span, depth)
        for first_row in range(0, out_h, block_rows):
            rows = min(block_rows, out_h - first_row)
            count = np.uint64(rows * span)
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
            for r in range(rows):
                base = np.uint64(r * span)
                row = first_row + r
                if is_max:
                    for c in range(out_w):
                        y[image, channel, row, c] = acc[base + c]
                else:
                    for c in range(out_w):
                        y[image, channel, row, c] = acc[base + c] * scale[row, c]
