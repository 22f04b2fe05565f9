"""Backward passes of 2-D MaxPool and of Relu compiled with numba: one pass over memory each.

The ops' numpy rules (``hetflow.ops.pool.MaxPool.backward``, ``hetflow.ops.activation.Relu``) are
written per window tap over whole arrays: MaxPool's builds the padded input, takes the argmax over a
``[N, C, taps, *out]`` copy of the windows and then scatters dY with one masked pass per tap (82 ms for
the mentee's first 2x2 pool at batch 128 on one core); Relu's writes a boolean mask, then the product.
Here each output element is visited once.

Both give the numpy rules' numbers: MaxPool's winner is the first maximum of each window in row-major
tap order, padding counting as -inf (so a window of -inf values keeps its first tap, as ``argmax``
does), a NaN winning as in ``argmax``; and Relu's gradient is ``dY * (X > 0)`` (so a NaN in dY stays
NaN). One difference in rounding only: where windows overlap, an input that wins several windows sums
their gradients in output order, where the numpy rule sums them in tap order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numba
import numpy as np

from hetflow.devices.cpu.threads import parallel_planes
from hetflow.ops.spatial import Geometry

#: dtypes the compiled loops run (others keep the numpy rules).
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: (kh, kw, sh, sw, dh, dw) -> its compiled MaxPool backward plane loop.
_LOOPS: dict[tuple[int, ...], Callable[..., None]] = {}
_LOOPS_LOCK = threading.Lock()


def max_pool_backward_2d(x: np.ndarray, dy: np.ndarray, geom: Geometry) -> np.ndarray:
    """dX of a 2-D MaxPool over ``geom``'s windows: each window's dY added to the input position of its
    first maximum. ``x`` ``[N, C, H, W]`` and ``dy`` ``[N, C, OH, OW]`` are C-contiguous, one dtype."""
    rows, cols = geom.axes
    dx = np.empty_like(x)
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation)
    pads = (rows.pad_begin, cols.pad_begin)

    loop = _max_pool_loop(window)

    def run(first: int, last: int) -> None:
        loop(x, dy, dx, first, last, *pads)

    parallel_planes(run, x.shape[0] * x.shape[1], int(x.shape[2]) * int(x.shape[3]))
    return dx


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``dY * (X > 0)`` in one pass; ``x`` and ``dy`` C-contiguous, one shape and dtype."""
    dx = np.empty_like(dy)
    flat_x, flat_dy, flat_dx = x.reshape(-1), dy.reshape(-1), dx.reshape(-1)
    # Ranges of whole 4096-element blocks, split over the kernel threads like planes.
    block = 4096
    blocks = -(-flat_x.size // block)

    def run(first: int, last: int) -> None:
        _relu_grad(flat_x, flat_dy, flat_dx, first * block, min(last * block, flat_x.size))

    parallel_planes(run, blocks, block)
    return dx


def relu_masked_chunk(dy: np.ndarray, y: np.ndarray, first: int, count: int, out: np.ndarray) -> None:
    """``out [K, count*P] = dY * (Y > 0)`` of images ``first .. first + count - 1``, laid out for the
    training Conv's GEMMs (``conv_train``): a fused Relu's gradient, taken while the chunk of dY is
    copied into cache. ``dy`` and ``y`` ``[N, K, P]``, ``out`` C-contiguous, one dtype."""
    _relu_mask_chunk(dy, y, first, count, out)


@numba.njit(nogil=True, cache=True)
def _relu_mask_chunk(dy, y, first, count, out):  # noqa: ANN001, ANN202
    kernels, positions = dy.shape[1], dy.shape[2]
    one, zero = out.dtype.type(1), out.dtype.type(0)
    for k in range(kernels):
        for n in range(count):
            grads, values = dy[first + n, k], y[first + n, k]
            target = out[k, n * positions : (n + 1) * positions]
            for p in range(positions):
                # A product, not a select, as the numpy rule: a NaN or inf in dY stays NaN.
                target[p] = grads[p] * (one if values[p] > 0 else zero)


@numba.njit(nogil=True, cache=True)
def _relu_grad(x, dy, dx, start, stop):  # noqa: ANN001, ANN202
    one, zero = dx.dtype.type(1), dx.dtype.type(0)
    for i in range(start, stop):
        dx[i] = dy[i] * (one if x[i] > 0 else zero)


@numba.njit(nogil=True, cache=True, inline="always")
def _first_maximum(source, top, left, kh, kw, dh, dw, interior):  # noqa: ANN001, ANN202
    """(row, column) of the window's first maximum as ``argmax`` finds it, padding reading -inf;
    (-1, -1) when that is a padding position. ``interior``: the window lies inside (no bounds tests)."""
    height, width = source.shape
    best = -np.inf
    best_y, best_x = -1, -1
    for i in range(kh):
        iy = top + i * dh
        for j in range(kw):
            ix = left + j * dw
            inside = interior or (iy >= 0 and iy < height and ix >= 0 and ix < width)
            value = source[iy, ix] if inside else -np.inf
            # Selects, not branches (the winner is data-dependent): a NaN beats any number and the
            # first NaN stays.
            better = (i == 0 and j == 0) or value > best or (value != value and best == best)
            best = value if better else best
            best_y = (iy if inside else -1) if better else best_y
            best_x = ix if better else best_x
    return best_y, best_x


@numba.njit(nogil=True, cache=True)
def _inside(offset, stride, extent, size, out):  # noqa: ANN001, ANN202
    """Output indices ``[lo, hi)`` whose window ``o * stride + offset + [0, extent)`` lies in ``[0, size)``."""
    lo = 0 if offset >= 0 else (-offset + stride - 1) // stride
    hi = 0 if size - extent - offset < 0 else (size - extent - offset) // stride + 1
    lo = min(lo, out)
    return lo, max(lo, min(hi, out))


def _max_pool_loop(window: tuple[int, ...]) -> Callable[..., None]:
    """The compiled plane loop for one window ``(kh, kw, sh, sw, dh, dw)`` (compiled on first use)."""
    loop = _LOOPS.get(window)
    if loop is None:
        with _LOOPS_LOCK:
            loop = _LOOPS.get(window)
            if loop is None:
                loop = _compile_max_pool(*window)
                _LOOPS[window] = loop
    return loop


def _compile_max_pool(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> Callable[..., None]:
    """A plane loop with the window baked in (numba freezes closure variables as constants), so the tap
    loops unroll: measured 3x faster than the same loop reading the window at run time."""

    @numba.njit(nogil=True)
    def planes(x, dy, dx, first, last, pad_top, pad_left):  # noqa: ANN001, ANN202
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        out_h, out_w = dy.shape[2], dy.shape[3]
        rows_lo, rows_hi = _inside(-pad_top, sh, (kh - 1) * dh + 1, height, out_h)
        cols_lo, cols_hi = _inside(-pad_left, sw, (kw - 1) * dw + 1, width, out_w)
        for plane in range(first, last):
            image, channel = plane // channels, plane % channels
            source, grads, target = x[image, channel], dy[image, channel], dx[image, channel]
            for r in range(height):
                for c in range(width):
                    target[r, c] = 0
            for oy in range(out_h):
                for ox in range(out_w):
                    interior = oy >= rows_lo and oy < rows_hi and ox >= cols_lo and ox < cols_hi
                    top, left = oy * sh - pad_top, ox * sw - pad_left
                    row, column = _first_maximum(source, top, left, kh, kw, dh, dw, interior)
                    if row >= 0:
                        target[row, column] += grads[oy, ox]

    return planes
