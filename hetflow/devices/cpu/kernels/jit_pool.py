"""2-D max and average pooling compiled with numba, separably: along each row, then down the columns.

numpy pools in passes (one per window tap, each reading and writing a whole plane), which left them an
order of magnitude behind ONNX Runtime's pools (GoogLeNet and Inception-v2 spent 8-17% of their time
pooling). Here each input plane is copied once into a buffer whose border holds the padding value;
then every padded row is reduced across the window's columns at the output's column starts, and every
output row across the window's rows of those partial results: (kw - 1) + (kh - 1) operations per output
instead of kh*kw - 1, all in cache.

The loops are compiled per window with the kernel and stride as compile-time constants, so the tap
loops unroll and the stride-2 gathers vectorise; the same loop reading the window at run time measured
no faster than numpy's per-tap passes (3x3/2 max pool of a 113x113 plane, one core: 29-55 us compiled
generic, ~33 us numpy, 4.6 us specialised). So only the windows CNNs use (``COMMON_WINDOWS``) are
compiled, each on first use in a process (about half a second); other windows keep the numpy path.
Measured on one core (3x3/2 max pool): 64x112x112 2.1 -> 0.9 ms, 192x56x56 1.7 -> 0.9 ms.

Like ``jit_depthwise``, the compiled loops release the GIL and the planes are split over the CPU's
kernel threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numba
import numpy as np

from hetflow.devices.cpu.threads import parallel_planes
from hetflow.ops.spatial import Geometry

#: dtypes the compiled loops run (MaxPool's integer types keep the numpy path).
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: (kh, kw, sh, sw) of the windows that get a compiled loop (dilation 1): 2x2 and 3x3, stride 1 or 2.
COMMON_WINDOWS = frozenset((k, k, s, s) for k in (2, 3) for s in (1, 2))

#: (window, "max" | "sum") -> its compiled plane loop.
_LOOPS: dict[tuple[tuple[int, ...], str], Callable[..., None]] = {}
_LOOPS_LOCK = threading.Lock()


def compiled_window(geo: Geometry) -> bool:
    """Whether ``geo``'s 2-D window has a compiled loop (see ``COMMON_WINDOWS``)."""
    if len(geo.axes) != 2:
        return False
    rows, cols = geo.axes
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride)
    return window in COMMON_WINDOWS and rows.dilation == cols.dilation == 1


def pool_2d(x: np.ndarray, y: np.ndarray, geo: Geometry, scale: np.ndarray | None) -> None:
    """``y`` = the 2-D pool of ``x`` ``[N, C, H, W]`` (C-contiguous) over ``geo``'s windows, in place
    (``compiled_window(geo)`` must hold).

    ``scale`` None: the maximum (padding never wins; NaN propagates, as with np.maximum). Otherwise the
    sum times ``scale`` ``[OH, OW]`` (the reciprocal window counts: an average), padding adding zero.
    """
    rows, cols = geo.axes
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation)
    loop = _loop(window, "max" if scale is None else "sum")
    padded = (rows.out - 1) * rows.stride + (rows.kernel - 1) * rows.dilation + 1
    weights = np.ones((1, 1), x.dtype) if scale is None else np.ascontiguousarray(scale, x.dtype)
    fill = -np.inf if scale is None else 0.0
    width = (cols.out - 1) * cols.stride + (cols.kernel - 1) * cols.dilation + 1

    def run(first: int, last: int) -> None:
        buffer = np.full((padded, width), fill, x.dtype)  # one per thread: its border keeps the padding
        partial = np.empty((padded, cols.out), x.dtype)
        loop(x, y, first, last, rows.pad_begin, cols.pad_begin, buffer, partial, weights)

    parallel_planes(run, y.shape[0] * y.shape[1], rows.out * cols.out)


def _loop(window: tuple[int, ...], reduction: str) -> Callable[..., None]:
    """The compiled plane loop for one window and reduction (compiled on first use)."""
    key = (window, reduction)
    loop = _LOOPS.get(key)
    if loop is None:
        with _LOOPS_LOCK:
            loop = _LOOPS.get(key)
            if loop is None:
                loop = _compile(*window, reduction == "max")
                _LOOPS[key] = loop
    return loop


def _compile(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int, is_max: bool) -> Callable[..., None]:
    """A plane loop with the window baked in (numba freezes closure variables as constants)."""

    @numba.njit(nogil=True, inline="always")
    def combine(a, b):  # noqa: ANN001, ANN202
        if is_max:
            return a if (a > b or a != a) else b  # NaN wins, as in np.maximum
        return a + b

    @numba.njit(nogil=True)
    def planes(x, y, first, last, pad_top, pad_left, buffer, partial, scale):  # noqa: ANN001, ANN202
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        out_h, out_w = y.shape[2], y.shape[3]
        copy_rows = max(0, min(height, buffer.shape[0] - pad_top))
        copy_cols = max(0, min(width, buffer.shape[1] - pad_left))
        for plane in range(first, last):
            image, channel = plane // channels, plane % channels
            # The interior is overwritten per plane; the border keeps the padding value.
            buffer[pad_top : pad_top + copy_rows, pad_left : pad_left + copy_cols] = (
                x[image, channel, :copy_rows, :copy_cols]
            )
            for r in range(buffer.shape[0]):
                line = buffer[r]
                row = partial[r]
                for c in range(out_w):
                    value = line[c * sw]
                    for j in range(1, kw):
                        value = combine(line[c * sw + j * dw], value)
                    row[c] = value
            target = y[image, channel]
            for r in range(out_h):
                out = target[r]
                out[:] = partial[r * sh]
                for i in range(1, kh):
                    source = partial[r * sh + i * dh]
                    for c in range(out_w):
                        out[c] = combine(source[c], out[c])
                if not is_max:
                    weights = scale[r]
                    for c in range(out_w):
                        out[c] *= weights[c]

    return planes
