"""Backward passes of 2-D MaxPool and of Relu compiled with numba: one pass over memory each.

The ops' numpy rules (``hetflow.ops.pool.MaxPool.backward``, ``hetflow.ops.activation.Relu``) are
written per window tap over whole arrays: MaxPool's builds the padded input, takes the argmax over a
``[N, C, taps, *out]`` copy of the windows and then scatters dY with one masked pass per tap (82 ms for
the mentee's first 2x2 pool at batch 128 on one core); Relu's writes a boolean mask, then the product.
Here each output element is visited once.

MaxPool's winners are best found in the forward pass: ``max_pool_indices_2d`` computes Y and ONNX's
Indices (for the Indices output ``hetflow.train.graph.record_pool_indices`` adds; ``hetflow.train.kernels``
runs it) like ``jit_pool``'s maximum, one contiguous vector loop per tap over phase planes
(``jit_phases``), and the backward pass only scatters dY by them (``max_pool_scatter_2d``). Measured on
one core, batch 128, 2x2/2 windows on 32x32x32 / 64x16x16 / 128x8x8 (random data): the Indices forward
15 / 10 / 9 ms through phase planes (``jit_pool``'s max 7 / 5 / 6), 8.8 / 4.6 / 2.5 ms by the loop for
windows that tile X (``jit_pool.tile_loop``, which reads each window where it lies); the scatter
6 / 3 / 1.5 ms; the per-window search (``max_pool_backward_2d``, for a MaxPool without Indices)
32 / 16 / 9 ms. Computing the Indices in the
backward pass instead of that search measured slower on the mentee's ReLU outputs (41 vs 28 ms a step).

Both give the numpy rules' numbers: MaxPool's winner is the first maximum of each window in row-major
tap order, padding counting as -inf (so a window of -inf values keeps its first tap, as ``argmax``
does), a NaN winning as in ``argmax``; and Relu's gradient is ``dY * (X > 0)`` (so a NaN in dY stays
NaN). One difference in rounding only: where windows overlap, an input that wins several windows sums
their gradients in output order, where the numpy rule sums them in tap order.
"""

from __future__ import annotations

from collections.abc import Callable

import numba
import numpy as np

from hetflow.devices.cpu.kernels.buffers import step_empty
from hetflow.devices.cpu.kernels.jit_phases import fill_phases, layout, tap_start
from hetflow.devices.cpu.kernels.jit_pool import compiled_once, tile_loop, tiles_input
from hetflow.devices.cpu.threads import parallel_planes
from hetflow.ops.spatial import Geometry


def max_pool_indices_2d(x: np.ndarray, geom: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """Y and Indices of a 2-D MaxPool over ``geom``'s windows; ``x`` ``[N, C, H, W]`` C-contiguous.

    Indices (int64, Y's shape) are ONNX's with ``storage_order=0``: the flat position in X of each
    window's first maximum. A window whose winner is padding (its first tap, the rest -inf) gets -1.
    """
    rows, cols = geom.axes
    y = step_empty((x.shape[0], x.shape[1], rows.out, cols.out), x.dtype)
    indices = step_empty(y.shape, np.dtype(np.int64))
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation)
    tiled = tile_loop(rows.kernel, cols.kernel) if tiles_input(geom) else None

    def run(first: int, last: int) -> None:
        if tiled is not None:
            tiled(x, y, indices, first, last)
        else:
            _winner_planes(x, y, indices, first, last, *window, rows.pad_begin, cols.pad_begin)

    parallel_planes(run, x.shape[0] * x.shape[1], rows.out * cols.out)
    return y, indices


def max_pool_scatter_2d(indices: np.ndarray, dy: np.ndarray, x_shape: tuple[int, ...]) -> np.ndarray:
    """dX of a 2-D MaxPool: each output's dY added at its ``indices`` (``max_pool_indices_2d``'s; -1:
    dropped), in output order. ``indices`` and ``dy`` ``[N, C, OH, OW]``, C-contiguous."""
    dx = step_empty(x_shape, dy.dtype)

    def run(first: int, last: int) -> None:
        _scatter_planes(indices, dy, dx, first, last)

    parallel_planes(run, int(x_shape[0]) * int(x_shape[1]), int(x_shape[2]) * int(x_shape[3]))
    return dx


def max_pool_backward_2d(x: np.ndarray, dy: np.ndarray, geom: Geometry) -> np.ndarray:
    """dX of a 2-D MaxPool over ``geom``'s windows: each window's dY added to the input position of its
    first maximum. ``x`` ``[N, C, H, W]`` and ``dy`` ``[N, C, OH, OW]`` are C-contiguous, one dtype."""
    rows, cols = geom.axes
    dx = step_empty(x.shape, x.dtype)
    window = (rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation, cols.dilation)
    pads = (rows.pad_begin, cols.pad_begin)

    loop = _max_pool_loop(window)

    def run(first: int, last: int) -> None:
        loop(x, dy, dx, first, last, *pads)

    parallel_planes(run, x.shape[0] * x.shape[1], int(x.shape[2]) * int(x.shape[3]))
    return dx


def relu_backward(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """``dY * (X > 0)`` in one pass; ``x`` and ``dy`` C-contiguous, one shape and dtype."""
    dx = step_empty(dy.shape, dy.dtype)
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
    return compiled_once(("backward", *window), lambda: _compile_max_pool(*window))


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


# NOTE: as jit_pool's loop, plus the winning tap's offset in the plane, carried beside the maximum:
# selects on both keep the tap loop one vector loop.
@numba.njit(nogil=True, cache=True)
def _winner_planes(x, y, indices, first, last, kh, kw, sh, sw, dh, dw, pad_top, pad_left):  # noqa: ANN001, ANN202
    """Y and Indices of output planes ``first .. last - 1`` (plane p = image p // C, channel p % C)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    out_h, out_w = y.shape[2], y.shape[3]
    span, depth, block_rows = layout(out_h, out_w, kh, kw, sh, sw, dh, dw)
    phases = np.full((sh * sw, depth * span), -np.inf, x.dtype)  # padding, written once
    best = np.empty(block_rows * span, x.dtype)
    won = np.empty(block_rows * span, np.int64)  # the winner's offset from the window's corner
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        fill_phases(x, image, channel, phases, sh, sw, pad_top, pad_left, span, depth)
        plane_start = plane * height * width
        for first_row in range(0, out_h, block_rows):
            rows = min(block_rows, out_h - first_row)
            count = np.uint64(rows * span)
            for i in range(kh):
                for j in range(kw):
                    index, offset = tap_start(i, j, first_row, span, sh, sw, dh, dw)
                    shift = np.int64(i * dh * width + j * dw)
                    if i == 0 and j == 0:
                        for p in range(count):
                            best[p] = phases[index, offset + p]
                            won[p] = shift
                    else:
                        for p in range(count):
                            value, current = phases[index, offset + p], best[p]
                            # A NaN beats any number and the first NaN stays (argmax's rule).
                            better = (value > current) | ((value != value) & (current == current))
                            best[p] = value if better else current
                            won[p] = shift if better else won[p]
            for r in range(rows):
                base = np.uint64(r * span)
                row = first_row + r
                corner = plane_start + (row * sh - pad_top) * width - pad_left
                for c in range(out_w):
                    y[image, channel, row, c] = best[base + c]
                    indices[image, channel, row, c] = corner + c * sw + won[base + c]
                for c in range(out_w):
                    if best[base + c] == -np.inf:
                        # The winner may be padding (whose offset says nothing): search the window.
                        top, left = row * sh - pad_top, c * sw - pad_left
                        at_y, at_x = _first_maximum(x[image, channel], top, left, kh, kw, dh, dw, False)
                        found = plane_start + at_y * width + at_x
                        indices[image, channel, row, c] = found if at_y >= 0 else -1


@numba.njit(nogil=True, cache=True)
def _scatter_planes(indices, dy, dx, first, last):  # noqa: ANN001, ANN202
    """dX planes ``first .. last - 1``: zeroed, then each output's dY added at its index."""
    plane_size = dx.shape[2] * dx.shape[3]
    outputs = dy.shape[2] * dy.shape[3]
    flat_dx, flat_dy, flat_indices = dx.reshape(-1), dy.reshape(-1), indices.reshape(-1)
    for plane in range(first, last):
        start = plane * plane_size
        for k in range(plane_size):
            flat_dx[start + k] = 0
        for k in range(plane * outputs, (plane + 1) * outputs):
            at = flat_indices[k]
            if at >= 0:
                flat_dx[at] += flat_dy[k]
