"""The tile GEMM over a batch's images end to end: tiles of positions that run on from one image into the next.

``jit_tile_gemm`` takes one image's positions at a time, so a 7x7 map (49 positions) fills 3 vectors
and 1 lane of a fourth: 49 of its 64 lanes work, every tile of ResNet-50's and MobileNet v2's last
stage. In a batch the images' positions can be taken as one sequence instead (``[K, N*P]`` as if the
images lay side by side): every tile then fills its 64 lanes but the last. X stays where it lies
(``[N, K, P]``): a vector of 16 positions that runs past its image's last position reads its first
lanes from one image and the rest from the next (two masked loads, the second at a fixed
displacement: ``X``'s image stride less P), and its results go back the same way, as does a folded
residual. Everything else is the tile GEMM's: ``ROWS`` kernels by 4 vectors, W's rows broadcast, the
bias, residual and clamp applied as the tile leaves the registers.

Where a tile's vectors start (``spans``) is worked out once per tile of columns, out of the loop over
W's row blocks: for each vector its offsets in X, Y and R and how many of its lanes lie in its first
image.

Measured one core, caches warm (Zen 4 VM, 2026-12-06), batch 16, per-image tiles / images end to end
(X copied side by side, the best this module can do): 2048 x 512 x 49 0.86, 512 x 2048 x 49 0.82,
960 x 160 x 49 0.78, 1280 x 320 x 49 0.78, 256 x 1024 x 196 0.97 of the time.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_tile_gemm
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_tile_gemm import MAX_VECTORS, ROWS, TILE_POSITIONS
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_3d, put_arrays, put_values

#: Slots of a tile's ``spans``: X's, Y's and R's displacement from an image's position to the next
#: image's first, then per vector its offset in X, in Y, in R and the lanes in its first image.
SPAN_SLOTS = 3 + 4 * MAX_VECTORS
#: Positions a map needs for the spans: a vector then runs into at most the next image.
MIN_POSITIONS = lv.LANES
#: The least share of a tile's lanes that per-image tiles must leave empty for the spans to pay. One
#: core, batch 16: 7x7 maps (23% of the lanes empty) 0.79-0.87 of the per-image time, but 14x14 (6%
#: empty; 256 x 1024 x 196) 1.21 times it.
MIN_GAIN = 0.10


def spans_pay(batch: int, positions: int, groups: int) -> bool:
    """Whether a product over ``batch`` images of ``positions`` each runs faster with its images end to
    end: one group, more than one image, a map of at least ``MIN_POSITIONS`` whose per-image tiles leave
    ``MIN_GAIN`` of the lanes empty."""
    if batch < 2 or groups != 1 or positions < MIN_POSITIONS:
        return False
    per_image = -(-positions // lv.LANES) * lv.LANES
    joined = -(-batch * positions // lv.LANES) * lv.LANES / batch
    return 1.0 - joined / per_image >= MIN_GAIN


def _span_tile_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled spanning tile of ``vectors`` vectors (see ``_span_tile``'s docstring)."""

    @intrinsic
    def tile(typingctx, w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias, b_start,
             residual, r_add, r_row, low, high, spans):  # noqa: ANN001, ANN202, E501
        signature = types.void(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias,
                               b_start, residual, r_add, r_row, low, high, spans)  # fmt: skip

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            (w_v, w_start_v, w_row_v, x_v, x_add_v, x_row_v, depth_v, y_v, y_add_v, y_row_v, rows_v, lanes_v,
             bias_v, b_start_v, residual_v, r_add_v, r_row_v, low_v, high_v, spans_v) = args  # fmt: skip
            w_data = lv.array_data(context, builder, sig.args[0], w_v)
            x_data = lv.array_data(context, builder, sig.args[3], x_v)
            y_data = lv.array_data(context, builder, sig.args[7], y_v)
            b_data = lv.array_data(context, builder, sig.args[12], bias_v)
            r_data = lv.array_data(context, builder, sig.args[14], residual_v)
            s_data = lv.array_data(context, builder, sig.args[19], spans_v)
            fma = lv.fused_multiply_add(builder)
            zero = lv.float_vector(lv.LANES, 0.0)
            x_shift, y_shift, r_shift = (lv.load_scalar(builder, s_data, lv.INT(i)) for i in range(3))
            halves = [_halves(builder, s_data, v, vectors, lanes_v) for v in range(vectors)]
            x_at = [builder.add(lv.load_scalar(builder, s_data, lv.INT(3 + 4 * v)), x_add_v) for v in range(vectors)]
            y_at = [builder.add(lv.load_scalar(builder, s_data, lv.INT(4 + 4 * v)), y_add_v) for v in range(vectors)]
            r_at = [builder.add(lv.load_scalar(builder, s_data, lv.INT(5 + 4 * v)), r_add_v) for v in range(vectors)]
            slots = lv.accumulators(builder, ROWS, vectors)
            w_rows = jit_tile_gemm.weight_rows(builder, w_start_v, w_row_v, rows_v)
            with cgutils.for_range(builder, depth_v) as loop:
                x_k = builder.mul(loop.index, x_row_v)
                inputs = [_load_spanning(builder, x_data, builder.add(x_at[v], x_k), x_shift, halves[v], zero,
                                         whole=v < vectors - 1) for v in range(vectors)]  # fmt: skip
                for r in range(ROWS):
                    weight = lv.load_scalar(builder, w_data, builder.add(w_rows[r], loop.index))
                    lv.multiply_add_broadcast(builder, fma, inputs, weight, slots[r])
            _finish(builder, slots, rows_v, b_data, b_start_v, (y_data, y_at, y_row_v, y_shift),
                    (r_data, r_at, r_row_v, r_shift), halves, low_v, high_v)  # fmt: skip
            return context.get_dummy_value()

        return signature, codegen

    return tile


def _halves(builder, s_data, v: int, vectors: int, lanes):  # noqa: ANN001, ANN202
    """Vector ``v``'s two masks: its lanes in its first image, and those in the next (below ``lanes`` on
    the tile's last vector)."""
    split = lv.load_scalar(builder, s_data, lv.INT(6 + 4 * v))
    inside = lv.lanes_inside(builder, lv.INT(0), lv.LANES, lanes if v == vectors - 1 else lv.INT(lv.LANES))
    first = lv.lanes_inside(builder, lv.INT(0), lv.LANES, split)
    return builder.and_(first, inside), builder.and_(builder.not_(first), inside)


def _load_spanning(builder, data, offset, shift, halves, fill, whole=False):  # noqa: ANN001, ANN202
    """The 16 positions from ``offset``: the first half's lanes there, the second's ``shift`` further on.
    ``whole``: the first half read as a whole vector (its other lanes then replaced by the second's), for
    a vector that is not the tile's last, so that what lies past it is X's next row or image."""
    if whole:
        first = lv.load_vector(builder, data, offset)
    else:
        first = lv.masked_load(builder, data, offset, halves[0], fill)
    return lv.masked_load(builder, data, builder.add(offset, shift), halves[1], first)


def _store_spanning(builder, value, data, offset, shift, halves) -> None:  # noqa: ANN001
    """``value`` back as ``_load_spanning`` reads it."""
    lv.masked_store(builder, value, data, offset, halves[0])
    lv.masked_store(builder, value, data, builder.add(offset, shift), halves[1])


def _finish(builder, slots, rows, b_data, b_start, out, res, halves, low, high) -> None:  # noqa: ANN001
    """The accumulators plus the bias (and the residual), clamped, into Y; ``out`` and ``res`` are (data,
    vector offsets, row stride, shift) of Y and R (none when R's row stride < 0)."""
    y_data, y_at, y_row, y_shift = out
    r_data, r_at, r_row, r_shift = res
    low_vector, high_vector = lv.broadcast(builder, low), lv.broadcast(builder, high)
    has_residual = builder.icmp_signed(">=", r_row, lv.INT(0))
    zero = lv.float_vector(lv.LANES, 0.0)
    for r, row in jit_tile_gemm.row_stores(builder, slots, rows):
        b = lv.broadcast(builder, lv.load_scalar(builder, b_data, builder.add(b_start, lv.INT(r))))
        for v, slot in enumerate(row):
            r_offset = builder.add(r_at[v], builder.mul(r_row, lv.INT(r)))
            summed = jit_tile_gemm.add_if(
                builder, builder.fadd(builder.load(slot), b), has_residual,
                lambda r_offset=r_offset, v=v: _load_spanning(builder, r_data, r_offset, r_shift, halves[v], zero),
            )  # fmt: skip
            value = lv.clamp(builder, summed, low_vector, high_vector)
            y_offset = builder.add(y_at[v], builder.mul(y_row, lv.INT(r)))
            _store_spanning(builder, value, y_data, y_offset, y_shift, halves[v])


_SPAN_1 = _span_tile_intrinsic(1)
_SPAN_2 = _span_tile_intrinsic(2)
_SPAN_3 = _span_tile_intrinsic(3)
_SPAN_4 = _span_tile_intrinsic(4)


@numba.njit(nogil=True, cache=True)
def _span_tile(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, positions, bias, b_start,
               residual, r_add, r_row, low, high, spans):  # noqa: ANN001, E501
    """One tile: ``rows`` (<= ROWS) kernels by ``positions`` (<= TILE_POSITIONS) consecutive positions of
    the images end to end, over ``depth`` rows of X; each vector's offsets are ``spans``' plus ``x_add``
    (X), ``y_add`` (Y) and ``r_add`` (R)."""
    vectors = (positions + 15) // 16
    lanes = positions - (vectors - 1) * 16
    if vectors == 4:
        _SPAN_4(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias, b_start, residual,
                r_add, r_row, low, high, spans)  # fmt: skip
    elif vectors == 3:
        _SPAN_3(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias, b_start, residual,
                r_add, r_row, low, high, spans)  # fmt: skip
    elif vectors == 2:
        _SPAN_2(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias, b_start, residual,
                r_add, r_row, low, high, spans)  # fmt: skip
    else:
        _SPAN_1(w, w_start, w_row, x, x_add, x_row, depth, y, y_add, y_row, rows, lanes, bias, b_start, residual,
                r_add, r_row, low, high, spans)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def fill_spans(spans, column, positions, x_image, y_image, r_image):  # noqa: ANN001
    """``spans`` for the tile from column ``column`` of the images end to end (each ``positions`` long,
    X's, Y's and R's images ``x_image``, ``y_image`` and ``r_image`` floats apart)."""
    spans[0], spans[1], spans[2] = x_image - positions, y_image - positions, r_image - positions
    for v in range(MAX_VECTORS):
        image, position = divmod(column + v * lv.LANES, positions)
        spans[3 + 4 * v] = image * x_image + position
        spans[4 + 4 * v] = image * y_image + position
        spans[5 + 4 * v] = image * r_image + position
        spans[6 + 4 * v] = min(lv.LANES, positions - position)


@numba.njit(nogil=True, cache=True)
def span_columns(w, depth, x, y, y_image, kernels, bias, residual, r_image, low, high, first, last, width,
                 first_block, last_block):  # noqa: ANN001, E501
    """Columns ``first .. last - 1`` of the images end to end of ``Y [N, kernels, P]`` in the row blocks
    ``first_block .. last_block - 1``: X ``[N, depth, P]``, Y and R flat with their images ``y_image``
    and ``r_image`` floats apart (``r_image`` < 0: no residual), ``width`` columns at a time, every row
    block over them before the next; deep products in chunks of depth as ``jit_tile_gemm.columns``."""
    positions = x.shape[2]
    flat_x = x.reshape(x.size)
    x_image = depth * positions
    y_row = np.int64(positions)
    r_row = y_row if r_image >= 0 else np.int64(-1)
    opening_spans = np.zeros(SPAN_SLOTS, np.int64)
    later_spans = np.zeros(SPAN_SLOTS, np.int64)
    chunk = jit_tile_gemm.chunk_depth(depth)
    no_bias = jit_tile_gemm.later_chunks_bias(bias, kernels, chunk, depth)
    for start in range(first, last, width):
        count = min(width, last - start)
        for k0 in range(0, depth, chunk):
            size, chunk_low, chunk_high = jit_tile_gemm.depth_chunk(k0, chunk, depth, low, high)
            opening = k0 == 0
            # Later chunks add Y's partial sums back in as their residual, with no bias.
            if opening:
                b, r, r_step, spans = bias, residual, r_row, opening_spans
            else:
                b, r, r_step, spans = no_bias, y, y_row, later_spans
            for tile in range(0, count, TILE_POSITIONS):
                column = start + tile
                tile_positions = np.int64(min(TILE_POSITIONS, count - tile))
                if opening:
                    fill_spans(spans, column, positions, x_image, y_image, max(r_image, 0))
                else:
                    fill_spans(spans, column, positions, x_image, y_image, y_image)
                for block in range(first_block, last_block):
                    row = block * ROWS
                    rows = np.int64(min(ROWS, kernels - row))
                    _span_tile(w, row * depth + k0, depth, flat_x, k0 * positions, positions, size, y,
                               row * positions, y_row, rows, tile_positions, b, np.int64(row), r, row * positions,
                               r_step, chunk_low, chunk_high, spans)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def span_share(w, x, y, y_image, residual, r_image, bias, low, high, kernels, share, shares, row_parts,
               block_bytes):  # noqa: ANN001, E501
    """Share ``share`` of ``shares`` of ``Y[n] = clamp(W @ X[n] + bias [+ R[n]])`` over every image, the
    images end to end: ``shares // row_parts`` runs of whole column tiles by ``row_parts`` ranges of W's
    row blocks (``jit_tile_gemm.gemm_share``'s shares, one group)."""
    column_parts = shares // row_parts
    column_part, row_part = share // row_parts, share % row_parts
    blocks = (kernels + ROWS - 1) // ROWS
    first_block, last_block = blocks * row_part // row_parts, blocks * (row_part + 1) // row_parts
    columns = x.shape[0] * x.shape[2]
    tiles = (columns + TILE_POSITIONS - 1) // TILE_POSITIONS
    first = tiles * column_part // column_parts * TILE_POSITIONS
    last = min(columns, tiles * (column_part + 1) // column_parts * TILE_POSITIONS)
    if last > first:
        width = jit_tile_gemm.block_width(block_bytes, x.shape[1])
        span_columns(w, np.int64(x.shape[1]), x, y, y_image, kernels, bias, residual, r_image, low, high,
                     np.int64(first), np.int64(last), width, np.int64(first_block), np.int64(last_block))  # fmt: skip


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a spin job's argument block (``pack_job``): W, X (3-D), Y, R, bias, bounds, then 5 numbers.
JOB_SLOTS = 19


@numba.njit(nogil=True, cache=True)
def pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, row_parts, block_bytes):  # noqa: ANN001
    """Fill ``block`` for ``job_address()``: ``span_share``'s arguments, ``bounds`` the float32 (low, high)."""
    slot = put_arrays(block, 0, (w, x, y, residual, bias, bounds))
    put_values(block, slot, (y_image, r_image, kernels, row_parts, block_bytes))


def share_job(w, x, y, y_image, residual, r_image, bias, bounds, kernels, row_parts, block_bytes, shares) -> Job:  # noqa: ANN001
    """``span_share``'s product as a spin-pool job of ``shares`` chunks (``jit_tile_gemm.share_job``'s
    arguments, one group)."""
    block = np.zeros(JOB_SLOTS, np.int64)
    pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, row_parts, block_bytes)
    return Job(job_address(), block, shares, (w, x, y, residual, bias, bounds))


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``span_share`` as a spin-pool job (``pack_job``'s argument block)."""
    bounds = float32_1d(args, 12)
    span_share(float32_1d(args, 0), float32_3d(args, 2), float32_1d(args, 6), args[14], float32_1d(args, 8),
               args[15], float32_1d(args, 10), bounds[0], bounds[1], args[16], chunk, chunks, args[17],
               args[18])  # fmt: skip


@functools.cache
def job_address() -> int:
    """The address of ``span_share`` compiled as a spin-pool job (on first use)."""
    return spin_pool.job(_share_job)
