"""Training Conv on the CPU: forward and backward a few images at a time, the columns kept in cache.

A training step runs every Conv over the whole batch. Whole-batch im2col columns (150 MB for a 32x32x32
layer with a 3x3 window at batch 128) are written to memory and read back by the GEMM, which then runs
at the memory's pace: measured on one core, ``W [32, 288] @ cols`` ran at 26 GFLOP/s over the whole
batch and at 57 GFLOP/s over one image's columns (1.2 MB, in the L2 cache). So every pass here walks the
batch in chunks of ``CHUNK_BYTES`` of columns: build the chunk's columns (``jit_columns`` for 2-D, else
``channel_columns``), use them at once, and reuse the buffer for the next chunk.

* forward: ``Y_chunk = W @ cols`` (one GEMM per group), bias added while the products are laid out
  and a fused Relu applied to the chunk while it is in cache (the training graph's Conv + Relu); from
  ``POSITION_MAJOR_CHANNELS`` input channels (2-D, one group) ``products = cols^T @ W^T`` on
  position-major columns instead, laid out into Y with the bias and Relu in one compiled pass;
* dW: ``dW^T += cols @ dY_chunk^T`` (the form OpenBLAS runs fast; see ``hetflow.ops.conv.Conv.backward``),
  and dB summed from the same chunk of dY;
* dX: ``dcols = W^T @ dY_chunk`` then col2im (compiled for 2-D), in the same pass as dW;
* a fused Relu's mask ``Y > 0`` applied to each chunk of dY as it is copied into the GEMMs' layout.

float32 2-D layers of stride 1 and one group run their forward and dX on ``jit_direct``'s direct kernel
instead (dX as dY correlated with the flipped weights, the Relu's mask applied as dY's planes are
copied): no columns at all, and at batch 128 on one core 1.4-2x faster than these chunks on the
mentee's 32- and 64-channel layers (32 -> 32 at 32x32: forward 37.6 -> 20.4 ms) and 2x on its 3 -> 32
first layer (on maps of 8x8 and smaller, ``jit_direct_lanes``'s variant of it, which computes no
position in vain: 64 -> 128 at 8x8 104 -> 133 GFLOP/s on one core). Their dW and dB come from
``jit_direct_grad`` (kernels as the vector lanes, X read from its padded planes): on 2 threads at
batch 128, 32 -> 32 at 32x32 22.2 -> 11.7 ms, 64 -> 64 at 16x16 15.6 -> 10.3 ms against these chunks.

The chunks are split over the CPU's kernel threads, each thread with its own buffers and BLAS held at
one thread meanwhile (whole images per thread scale better than splitting these small GEMMs).

The numbers are the same sums as the numpy rule's (``hetflow.ops.conv.Conv.backward``); only dW's and
dB's reductions over the batch are added up chunk by chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from hetflow.devices.cpu.kernels import jit_direct, jit_direct_grad, jit_direct_lanes
from hetflow.devices.cpu.kernels.buffers import step_empty
from hetflow.devices.cpu.kernels.jit_backward import relu_masked_chunk
from hetflow.devices.cpu.kernels.jit_columns import (
    col2im_2d,
    im2col_2d,
    pixel_scratch,
    planes_from_products,
    position_columns_2d,
)
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.threads import blas_threads, intra_op_threads, parallel_for
from hetflow.ops.conv import ConvAttrs, channel_col2im, channel_columns, conv_window
from hetflow.ops.spatial import Geometry, geometry

#: Bytes of columns per chunk: about half the L2 cache of the reference machine's cores (2 MB), so the
#: columns, the chunk's products and its share of X stay there between being written and read.
CHUNK_BYTES = 1 << 20
#: Output positions per image from which the forward multiplies each image of a chunk by its own GEMM,
#: written straight into Y, rather than the whole chunk by one GEMM and a transposing copy into Y:
#: measured on one core (A/B in one process, minimum of 12), the mentee's first layer (3 -> 32 channels,
#: 32x32) 15.3 -> 10.4 ms at batch 128, 32 -> 64 channels at 16x16 (256 positions) 20.2 -> 18.5 ms;
#: at 8x8 (64 positions) the single GEMM measured faster.
PER_IMAGE_POSITIONS = 256
#: Input channels from which a 2-D forward (group 1) multiplies position-major columns,
#: ``[n*P, taps*C] @ W^T``, instead of ``W @ [C*taps, n*P]``: the GEMM with K = 32 or 64 rows of output
#: runs faster with them as its short side, and each column row is ``kh`` x ``kw`` copies of C contiguous
#: values. Measured on one core (A/B in one process, minimum of 10, batch 128, 3x3 pad 1, fused Relu):
#: 32 -> 32 channels at 32x32 71.8 -> 64.6 ms, 32 -> 64 at 16x16 25.7 -> 24.0, 64 -> 64 at 16x16
#: 49.7 -> 47.8, 64 -> 128 at 8x8 25.7 -> 20.8; but 3 -> 32 at 32x32 13.1 -> 22.5 (3-value copies).
POSITION_MAJOR_CHANNELS = 16


@dataclass(frozen=True)
class ConvLayout:
    """How a Conv of concrete shapes is computed in chunks.

    Attributes:
        geom: the windows over X's spatial axes.
        group: the ``group`` attribute.
        batch, channels, kernels: N, C and K.
        taps: window taps (``prod(kernel)``).
        positions: output positions per image (``prod(out)``).
        images: images per chunk.
    """

    geom: Geometry
    group: int
    batch: int
    channels: int
    kernels: int
    taps: int
    positions: int
    images: int

    @property
    def rows(self) -> int:
        """Rows of the columns: ``C * taps`` (``per_group`` per group)."""
        return self.channels * self.taps

    @property
    def per_group(self) -> int:
        """The GEMM's reduction length per group: ``C/group * taps``."""
        return self.rows // self.group


def conv_layout(
    attrs: ConvAttrs, x_shape: tuple[int, ...], w_shape: tuple[int, ...], itemsize: int
) -> ConvLayout:
    """The chunked computation of a Conv with ``attrs`` on X ``x_shape`` and W ``w_shape``."""
    geom = geometry(conv_window(attrs, w_shape), x_shape[2:])
    taps = math.prod(geom.kernel)
    positions = math.prod(geom.out)
    image_bytes = max(int(x_shape[1]) * taps * positions * itemsize, 1)
    images = max(1, min(int(x_shape[0]), CHUNK_BYTES // image_bytes))
    return ConvLayout(
        geom, attrs.group, int(x_shape[0]), int(x_shape[1]), int(w_shape[0]), taps, positions, images
    )


def conv_forward(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, attrs: ConvAttrs) -> np.ndarray:
    """``Y = W * X + B`` (any rank, group, stride, padding, dilation), X and W C-contiguous, one dtype;
    ``max(Y, 0)`` when ``attrs.fused`` is a Relu (the only fused activation accepted)."""
    relu = fused_relu(attrs)
    layout = conv_layout(attrs, x.shape, w.shape, x.itemsize)
    if _direct(layout, x.dtype):
        y = step_empty((layout.batch, layout.kernels, *layout.geom.out), x.dtype)
        bounds = jit_direct.RELU_BOUNDS if relu else jit_direct.NO_BOUNDS
        return jit_direct_lanes.direct_conv2d(x, w, bias, layout.geom, bounds, y)
    y = step_empty((layout.batch, layout.kernels, layout.positions), x.dtype)
    if _position_major(layout, x.dtype):
        _over_images(_position_major_forward(x, w, bias, relu, layout, y), layout)
    else:
        _over_images(_channel_major_forward(x, w, bias, relu, layout, y), layout)
    return y.reshape(layout.batch, layout.kernels, *layout.geom.out)


def _direct(layout: ConvLayout, dtype: np.dtype) -> bool:
    """Whether the Conv runs ``jit_direct``'s kernel (2-D, float32, stride 1, group 1)."""
    return jit_direct.supports(layout.geom, layout.group, dtype) is None


def _position_major(layout: ConvLayout, dtype: np.dtype) -> bool:
    """Whether the forward multiplies position-major columns (``jit_columns.position_columns_2d``)."""
    return _compiled(layout, dtype) and layout.group == 1 and layout.channels >= POSITION_MAJOR_CHANNELS


def _position_major_forward(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, relu: bool, layout: ConvLayout, y: np.ndarray
) -> Callable[[int, int], None]:
    """The body for ``_over_images`` of ``products = cols @ W^T`` on position-major columns, laid out
    into Y ``[N, K, P]`` with the bias and Relu."""
    # W's rows ordered (i, j, c) like the columns; its transpose is a view BLAS reads as such.
    w_t = np.ascontiguousarray(np.moveaxis(w, 1, -1)).reshape(layout.kernels, layout.rows).T
    offsets = np.zeros(layout.kernels, x.dtype) if bias is None else bias.astype(x.dtype, copy=False)

    def run(first: int, last: int) -> None:
        scratch = pixel_scratch(x.shape, layout.geom, x.dtype)
        cols_buffer = _buffer(layout.rows * layout.images * layout.positions, x.dtype)
        products_buffer = _buffer(layout.kernels * layout.images * layout.positions, x.dtype)
        for start in range(first, last, layout.images):
            count = min(layout.images, last - start)
            cols = _view(cols_buffer, (count * layout.positions, layout.rows))
            position_columns_2d(x, start, count, layout.geom, cols, scratch)
            products = _view(products_buffer, (count * layout.positions, layout.kernels))
            np.matmul(cols, w_t, out=products)
            planes_from_products(products, offsets, relu, y, start, count)

    return run


def _channel_major_forward(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, relu: bool, layout: ConvLayout, y: np.ndarray
) -> Callable[[int, int], None]:
    """The body for ``_over_images`` of ``Y = W @ cols`` on channel-major columns (``_columns``)."""
    weights = w.reshape(layout.group, layout.kernels // layout.group, layout.per_group)
    bias_column = None if bias is None else bias.astype(x.dtype, copy=False).reshape(layout.kernels, 1)

    per_image = layout.images == 1 or layout.positions >= PER_IMAGE_POSITIONS

    def run(first: int, last: int) -> None:
        cols_buffer = _buffer(layout.rows * layout.images * layout.positions, x.dtype)
        products_buffer = (
            None if per_image else _buffer(layout.kernels * layout.images * layout.positions, x.dtype)
        )
        for start in range(first, last, layout.images):
            count = min(layout.images, last - start)
            cols = _columns(x, start, count, layout, cols_buffer)
            if products_buffer is None or count == 1:
                # One GEMM per image, straight into its output (each image's columns are a block of cols).
                for image in range(count):
                    part = slice(image * layout.positions, (image + 1) * layout.positions)
                    _grouped_matmul(weights, cols[:, part], y[start + image], layout.group)
                    if bias_column is not None:
                        y[start + image] += bias_column
            else:
                # NOTE: one GEMM over the chunk, laid out into Y by a transposing copy.
                products = _view(products_buffer, (layout.kernels, count * layout.positions))
                _grouped_matmul(weights, cols, products, layout.group)
                spread = products.reshape(layout.kernels, count, layout.positions).transpose(1, 0, 2)
                if bias_column is None:
                    np.copyto(y[start : start + count], spread)
                else:
                    np.add(spread, bias_column, out=y[start : start + count])
            if relu:
                # While the chunk's Y is still in cache: no separate Relu pass over the batch.
                np.maximum(y[start : start + count], 0, out=y[start : start + count])

    return run


class ConvGrads(NamedTuple):
    """The gradients ``conv_backward`` computed (None where not wanted)."""

    x: np.ndarray | None
    w: np.ndarray | None
    b: np.ndarray | None


def conv_backward(
    x: np.ndarray,
    w: np.ndarray,
    dy: np.ndarray,
    attrs: ConvAttrs,
    want_x: bool,
    want_w: bool,
    want_b: bool = False,
    y: np.ndarray | None = None,
) -> ConvGrads:
    """dX, dW and dB of ``Y = W * X + B`` from dY, in one pass over the batch.

    X, W and dY are C-contiguous and of one dtype. Per chunk: ``dW^T += cols @ dY^T``, ``dB += sum(dY)``
    (while the chunk's dY is in cache) and ``dcols = W^T @ dY`` scattered back by col2im. ``y``: the
    output of a fused Relu (C-contiguous, dY's shape); dY is then taken as ``dY * (y > 0)``, chunk by
    chunk as it is laid out for the GEMMs.

    float32 stride-1 2-D layers of one group take dX from ``jit_direct`` (a correlation of the masked dY
    with the flipped weights, where every pad is within the window's reach) and dW with dB from
    ``jit_direct_grad``; only dB alone (no dW wanted) is summed here.

    NOTE: as GEMMs on im2col columns, that correlation measured slower than these chunks (32x32x32: 46 vs
    40 ms; 64x16x16: 34 vs 31 ms on one core); the direct kernel has no columns (32x32x32: 24 ms).
    """
    layout = conv_layout(attrs, x.shape, w.shape, x.itemsize)
    dx = dw = db = None
    if want_x and _direct(layout, x.dtype):
        gradient_geom = jit_direct.input_gradient_geometry(layout.geom)
        if gradient_geom is not None:
            dx = jit_direct_lanes.direct_conv2d(
                dy, jit_direct.flipped_weights(w), None, gradient_geom, jit_direct.NO_BOUNDS, step_empty(x.shape, x.dtype), mask=y
            )
            want_x = False
    if want_w and _direct(layout, x.dtype):
        dw, db = jit_direct_grad.weight_gradient(x, dy, layout.geom, mask=y)
        db = db if want_b else None
        want_w = want_b = False
    if not (want_x or want_w or want_b):
        return ConvGrads(dx, dw, db)
    group, kernels, positions = layout.group, layout.kernels, layout.positions
    per_kernel = kernels // group
    dy_images = dy.reshape(layout.batch, kernels, positions)
    y_images = None if y is None else y.reshape(layout.batch, kernels, positions)
    weights = w.reshape(group, per_kernel, layout.per_group)
    if want_x:
        dx = step_empty(x.shape, x.dtype)
    # Per thread, its dW^T and dB sums over its images (added up at the end).
    partials: list[tuple[np.ndarray, np.ndarray]] = []

    def run(first: int, last: int) -> None:
        chunk = layout.images * positions
        cols_buffer = _buffer(layout.rows * chunk, x.dtype)
        dy_buffer = _buffer(kernels * chunk, x.dtype)
        product = np.empty((group, layout.per_group, per_kernel), x.dtype)
        dw_sum, db_sum = np.zeros_like(product), np.zeros(kernels, x.dtype)
        for start in range(first, last, layout.images):
            count = min(layout.images, last - start)
            grads = _chunk_grads(dy_images, y_images, start, count, dy_buffer)
            if want_b:
                db_sum += grads.sum(axis=1)
            if want_w:
                cols = _columns(x, start, count, layout, cols_buffer)
                for g in range(group):
                    rows = slice(g * layout.per_group, (g + 1) * layout.per_group)
                    np.matmul(cols[rows], grads[g * per_kernel : (g + 1) * per_kernel].T, out=product[g])
                dw_sum += product
            if want_x:
                assert dx is not None
                # The columns' buffer is free again: it takes their gradients.
                dcols = _view(cols_buffer, (layout.rows, count * positions))
                for g in range(group):
                    rows = slice(g * layout.per_group, (g + 1) * layout.per_group)
                    np.matmul(weights[g].T, grads[g * per_kernel : (g + 1) * per_kernel], out=dcols[rows])
                _col2im(dcols, layout, dx, start, count)
        partials.append((dw_sum, db_sum))

    _over_images(run, layout)
    if want_w:
        dw_sum = _sum_over_threads([part[0] for part in partials])
        dw = np.ascontiguousarray(dw_sum.transpose(0, 2, 1)).reshape(w.shape)
    if want_b:
        db = _sum_over_threads([part[1] for part in partials])
    return ConvGrads(dx, dw, db)


def _sum_over_threads(parts: list[np.ndarray]) -> np.ndarray:
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _chunk_grads(
    dy_images: np.ndarray, y_images: np.ndarray | None, start: int, count: int, buffer: np.ndarray
) -> np.ndarray:
    """dY of images ``start .. start + count - 1`` as ``[K, count * P]`` (one image's is a view), masked
    by ``y_images > 0`` (a fused Relu's output) when given."""
    kernels, positions = dy_images.shape[1:]
    if y_images is not None:
        grads = _view(buffer, (kernels, count * positions))
        relu_masked_chunk(dy_images, y_images, start, count, grads)
        return grads
    if count == 1:
        return dy_images[start]
    grads = _view(buffer, (kernels, count, positions))
    np.copyto(grads, dy_images[start : start + count].transpose(1, 0, 2))
    return grads.reshape(kernels, count * positions)


def fused_relu(attrs: ConvAttrs) -> bool:
    """Whether ``attrs`` fuse a Relu into the Conv.

    Raises:
        ValueError: another activation is fused (the training Conv computes only Relu).
    """
    if attrs.fused is None:
        return False
    if attrs.fused.op_type != "Relu":
        raise ValueError(f"the training Conv fuses only Relu, not {attrs.fused.op_type}")
    return True


def _grouped_matmul(weights: np.ndarray, cols: np.ndarray, out: np.ndarray, group: int) -> None:
    """``out[g rows] = weights[g] @ cols[g rows]`` for every group."""
    per_kernel, per_group = weights.shape[1:]
    for g in range(group):
        np.matmul(
            weights[g],
            cols[g * per_group : (g + 1) * per_group],
            out=out[g * per_kernel : (g + 1) * per_kernel],
        )


def _columns(x: np.ndarray, start: int, count: int, layout: ConvLayout, buffer: np.ndarray) -> np.ndarray:
    """The columns ``[C * taps, count * P]`` of images ``start .. start + count - 1``, in ``buffer``."""
    cols = _view(buffer, (layout.rows, count * layout.positions))
    if _compiled(layout, x.dtype):
        im2col_2d(x, start, count, layout.geom, cols)
    else:
        shape = (layout.channels, layout.taps, count, *layout.geom.out)
        channel_columns(x[start : start + count], layout.geom, out=cols.reshape(shape))
    return cols


def _col2im(dcols: np.ndarray, layout: ConvLayout, dx: np.ndarray, start: int, count: int) -> None:
    """Images ``start .. start + count - 1`` of dX from their columns' gradients."""
    if _compiled(layout, dx.dtype):
        col2im_2d(dcols, layout.geom, dx, start, count)
    else:
        part = dx[start : start + count]
        part[...] = channel_col2im(dcols, layout.geom, part.shape)


def _compiled(layout: ConvLayout, dtype: np.dtype) -> bool:
    return len(layout.geom.axes) == 2 and dtype in COMPILED_DTYPES


def _buffer(elements: int, dtype: np.dtype) -> np.ndarray:
    return np.empty(elements, dtype)


def _view(buffer: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The first ``prod(shape)`` elements of a flat buffer, C-contiguous in ``shape``."""
    return buffer[: math.prod(shape)].reshape(shape)


def _over_images(body: Callable[[int, int], None], layout: ConvLayout) -> None:
    """Run ``body(first, last)`` over contiguous ranges of whole chunks of images, one per kernel thread,
    with BLAS held at one thread while more than one range runs."""
    chunks = -(-layout.batch // layout.images)
    threads = max(1, min(intra_op_threads(), chunks))
    if threads == 1:
        body(0, layout.batch)
        return
    bounds = [min(layout.batch, chunks * part // threads * layout.images) for part in range(threads + 1)]
    with blas_threads(1):
        parallel_for(lambda part: body(bounds[part], bounds[part + 1]), threads, threads)
