"""Float32 GEMM in register tiles with the Conv epilogue: ``Y = clamp(W @ X + b [+ R])``.

The product a 1x1 Conv computes per image: ``W [M, K]`` the layer's weights, ``X [K, N]`` its input
planes as they lie, ``Y [M, N]`` its output planes. OpenBLAS computes the product, then another pass
over Y adds the bias, a folded residual and the activation; here each tile of Y leaves the registers
finished.

A tile is ``ROWS`` kernels by up to ``4 x 16`` positions: ``ROWS x vectors`` accumulators in vector
registers, fed per k by ``vectors`` loads of X and ``ROWS`` broadcasts of W (6 x 4: 24 FMAs for 10
loads), over the whole depth, the tile's columns of X ``PREFETCH_ROWS`` rows ahead prefetched into L1.
W is read where it lies, its ``ROWS`` rows as six sequential streams (a tile past M reads the last row
again and stores none of the extra rows). X is taken ``BLOCK_BYTES`` of
columns at a time, and every row block of W passes over those columns before the next: the block stays
in L2, and each row block writes its rows of Y from start to end. The last vector of a tile is masked
(positions past N are never read or written).

A share of the work (``gemm_share``, the spinning pool's job) is a run of whole tiles of columns (of
whole vectors on small maps, ``share_unit``) by a range of row blocks, so that a 7x7 map (one tile) still
splits over the threads, by its kernels.

Measured one core, caches warm, against OpenBLAS's product alone (GMAC/s, one process, weights then
packed in ``ROWS``-row panels): 64x256x3136 75 vs 59, 24x144x3136 64 vs 45, 96x16x12544 46 vs 39,
2048x512x49 64 vs 57, but 128x512x784 63 vs 74 and 1024x256x196 73 vs 74: deep products lose the edge,
and ``own_gemm.MAX_DEPTH`` leaves them to OpenBLAS. Reading W unpacked measured the same at batch 16
(mobilenetv2 and resnet50, alternating processes) and saved the packing pass (2048x512: 340 us warm,
about 4.5 ms a resnet50 run): one thread at batch 1 resnet50 73.7 -> 70.9 ms, mobilenetv2 8.2 -> 7.8.
Packing X's columns as BLAS does measured no faster inside networks (resnet50 at batch 16), nor did
slicing the depth to keep a tile's columns in L1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_3d, put_arrays, put_values

#: Kernels (rows of W and Y) per tile: each broadcast weight feeds one FMA per vector of the tile.
ROWS = 6
#: The most vectors of 16 positions per tile (``ROWS * MAX_VECTORS`` accumulators, 24 of 32 registers).
MAX_VECTORS = 4
#: Positions per full tile.
TILE_POSITIONS = MAX_VECTORS * lv.LANES
#: Bytes of X's columns taken at a time: they stay in L2 while every row block of W passes over them.
BLOCK_BYTES = 256 << 10
#: Rows of X ahead of the one being multiplied whose tile columns are prefetched into L1. A tile's rows
#: of X lie a whole row of positions apart (12.5 KB on a 56x56 map), each on a page of its own, beyond
#: what the hardware prefetchers follow. One core, the tile GEMM alone, interleaved (Xeon VM with
#: AVX-512, 2026-12-02), GMAC/s without / with 4 rows ahead: 64x256x3136 61 / 75, 128x256x3136 62 /
#: 74, 128x512x784 67 / 80, 512x128x784 76 / 81, 256x1024x196 73 / 76, 512x2048x49 64 / 67; 2 to 6 rows
#: ahead measured alike; into L2 only, no gain.
PREFETCH_ROWS = 4


def _tile_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled tile of ``vectors`` vectors (see ``_tile``'s docstring)."""

    @intrinsic
    def tile(typingctx, w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias,
             b_start, residual, r_start, r_row, low, high):  # noqa: ANN001, ANN202, E501
        signature = types.void(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias,
                               b_start, residual, r_start, r_row, low, high)  # fmt: skip

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            (w_v, w_start_v, w_row_v, x_v, x_start_v, x_row_v, depth_v, y_v, y_start_v, y_row_v, rows_v, lanes_v,
             bias_v, b_start_v, residual_v, r_start_v, r_row_v, low_v, high_v) = args  # fmt: skip
            w_data = lv.array_data(context, builder, sig.args[0], w_v)
            x_data = lv.array_data(context, builder, sig.args[3], x_v)
            y_data = lv.array_data(context, builder, sig.args[7], y_v)
            b_data = lv.array_data(context, builder, sig.args[12], bias_v)
            r_data = lv.array_data(context, builder, sig.args[14], residual_v)
            fma = lv.fused_multiply_add(builder)
            mask = lv.lanes_inside(builder, lv.INT(0), lv.LANES, lanes_v)
            zero = lv.float_vector(lv.LANES, 0.0)
            slots = lv.accumulators(builder, ROWS, vectors)
            w_rows = weight_rows(builder, w_start_v, w_row_v, rows_v)
            ahead = builder.mul(lv.INT(PREFETCH_ROWS), x_row_v)
            _prefetch_outputs(builder, y_data, y_start_v, y_row_v, r_data, r_start_v, r_row_v, vectors)
            with cgutils.for_range(builder, depth_v) as loop:
                k = loop.index
                x_k = builder.add(x_start_v, builder.mul(k, x_row_v))
                x_ahead = builder.add(x_k, ahead)
                for v in range(vectors):
                    lv.prefetch(builder, x_data, builder.add(x_ahead, lv.INT(v * lv.LANES)), lv.INTO_L1)
                inputs = [lv.load_vector(builder, x_data, builder.add(x_k, lv.INT(v * lv.LANES)))
                          for v in range(vectors - 1)]  # fmt: skip
                last = builder.add(x_k, lv.INT((vectors - 1) * lv.LANES))
                inputs.append(lv.masked_load(builder, x_data, last, mask, zero))
                for r in range(ROWS):
                    weight = lv.load_scalar(builder, w_data, builder.add(w_rows[r], k))
                    lv.multiply_add_broadcast(builder, fma, inputs, weight, slots[r])
            _finish(builder, slots, y_data, y_start_v, y_row_v, rows_v, mask, b_data, b_start_v, r_data,
                    r_start_v, r_row_v, low_v, high_v)  # fmt: skip
            return context.get_dummy_value()

        return signature, codegen

    return tile


def _prefetch_outputs(builder: ir.IRBuilder, y_data: ir.Value, y_start: ir.Value, y_row: ir.Value,
                      r_data: ir.Value, r_start: ir.Value, r_row: ir.Value, vectors: int) -> None:  # fmt: skip
    """Ask for the tile's lines of Y (to be written) and of the residual (to be read, where there is one)
    before the depth loop, so that they arrive while the tile multiplies: the finish otherwise waited on
    them from memory, ``ROWS`` rows a whole plane apart."""
    has_residual = builder.icmp_signed(">=", r_row, lv.INT(0))
    for r in range(ROWS):
        y_r = builder.add(y_start, builder.mul(y_row, lv.INT(r)))
        for v in range(vectors):
            lv.prefetch(builder, y_data, builder.add(y_r, lv.INT(v * lv.LANES)), lv.INTO_L2, write=True)
    with builder.if_then(has_residual):
        for r in range(ROWS):
            r_r = builder.add(r_start, builder.mul(r_row, lv.INT(r)))
            for v in range(vectors):
                lv.prefetch(builder, r_data, builder.add(r_r, lv.INT(v * lv.LANES)), lv.INTO_L2)


def weight_rows(builder: ir.IRBuilder, w_start: ir.Value, w_row: ir.Value, rows: ir.Value) -> list[ir.Value]:
    """Where each of the tile's ``ROWS`` rows of W starts (``w_row`` apart); rows from ``rows`` on read the
    last one again."""
    last = builder.sub(rows, lv.INT(1))
    starts = []
    for r in range(ROWS):
        row = builder.select(builder.icmp_signed("<", lv.INT(r), rows), lv.INT(r), last)
        starts.append(builder.add(w_start, builder.mul(row, w_row)))
    return starts


def row_stores(builder: ir.IRBuilder, slots: list[list[ir.Value]], rows: ir.Value):  # noqa: ANN202
    """(r, row slots) for the tile's rows below ``rows``, each yielded inside its guard."""
    for r, row in enumerate(slots):
        with builder.if_then(builder.icmp_signed("<", lv.INT(r), rows)):
            yield r, row


def _finish(builder, slots, y_data, y_start, y_row, rows, mask, b_data, b_start, r_data, r_start, r_row,
            low, high) -> None:  # noqa: ANN001
    """The accumulators plus the bias (and the residual), clamped, into Y."""
    low_vector = lv.broadcast(builder, low)
    high_vector = lv.broadcast(builder, high)
    has_residual = builder.icmp_signed(">=", r_row, lv.INT(0))
    for r, row in row_stores(builder, slots, rows):
        b = lv.broadcast(builder, lv.load_scalar(builder, b_data, builder.add(b_start, lv.INT(r))))
        y_r = builder.add(y_start, builder.mul(y_row, lv.INT(r)))
        r_r = builder.add(r_start, builder.mul(r_row, lv.INT(r)))
        for v, slot in enumerate(row):
            offset = lv.INT(v * lv.LANES)
            last = mask if v == len(row) - 1 else None
            value = builder.fadd(builder.load(slot), b)
            value = _add_residual(builder, value, has_residual, r_data, builder.add(r_r, offset), last)
            value = lv.clamp(builder, value, low_vector, high_vector)
            lv.store_lanes(builder, value, y_data, builder.add(y_r, offset), last)


def _add_residual(builder: ir.IRBuilder, value: ir.Value, has_residual: ir.Value, base: ir.Value,
                  offset: ir.Value, mask: ir.Value | None) -> ir.Value:  # fmt: skip
    """``value + R[offset:offset + 16]`` when ``has_residual``, else ``value`` (R never read then)."""
    fill = lv.float_vector(lv.LANES, 0.0)
    return add_if(builder, value, has_residual, lambda: lv.load_lanes(builder, base, offset, mask, fill))


def add_if(builder: ir.IRBuilder, value: ir.Value, condition: ir.Value, load: Callable[[], ir.Value]) -> ir.Value:
    """``value + load()`` where ``condition`` holds, else ``value``: what ``load`` emits runs only then."""
    before = builder.block
    with builder.if_then(condition):
        added = builder.fadd(value, load())
        inside = builder.block
    result = builder.phi(value.type)
    result.add_incoming(value, before)
    result.add_incoming(added, inside)
    return result


_TILE_1 = _tile_intrinsic(1)
_TILE_2 = _tile_intrinsic(2)
_TILE_3 = _tile_intrinsic(3)
_TILE_4 = _tile_intrinsic(4)


@numba.njit(nogil=True, cache=True)
def _tile(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, positions, bias, b_start,
          residual, r_start, r_row, low, high):  # noqa: ANN001, E501
    """One tile: ``rows`` (<= ROWS) kernels by ``positions`` (<= TILE_POSITIONS) positions of Y, over
    ``depth`` rows of X and as many columns of W (its rows ``w_row`` apart)."""
    vectors = (positions + 15) // 16
    lanes = positions - (vectors - 1) * 16
    if vectors == 4:
        _TILE_4(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    elif vectors == 3:
        _TILE_3(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    elif vectors == 2:
        _TILE_2(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    else:
        _TILE_1(w, w_start, w_row, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def columns(w, depth, x, x_start, x_row, y, y_start, y_row, kernels, bias, residual, r_start, r_row, low, high,
            first, last, width, first_block, last_block):  # noqa: ANN001, E501
    """Columns ``first .. last - 1`` of ``Y [kernels, *]`` in the row blocks ``first_block .. last_block -
    1``: X ``[depth, *]`` from ``x_start`` of the flat ``x`` (rows ``x_row`` apart), Y from ``y_start`` of
    the flat ``y`` (rows ``y_row`` apart), R from ``r_start`` (rows ``r_row`` apart; none when ``r_row`` <
    0), ``width`` columns at a time, every row block over them before the next.

    A product deeper than ``DEPTH_CHUNK`` goes through ``chunk_depth`` rows of X at a time: the first
    chunk stores its sums with the bias (and the residual) unclamped, each later one adds Y's partial
    sums back in as its residual, and the last clamps."""
    r_step = max(r_row, 0)
    chunk = chunk_depth(depth)
    no_bias = later_chunks_bias(bias, kernels, chunk, depth)
    for start in range(first, last, width):
        count = min(width, last - start)
        for k0 in range(0, depth, chunk):
            size, chunk_low, chunk_high = depth_chunk(k0, chunk, depth, low, high)
            opening = k0 == 0
            # Later chunks add Y's partial sums back in as their residual, with no bias.
            if opening:
                b, r, r_begin, r_rows, r_stride = bias, residual, r_start, r_step, r_row
            else:
                b, r, r_begin, r_rows, r_stride = no_bias, y, y_start, y_row, y_row
            for block in range(first_block, last_block):
                row = block * ROWS
                rows = np.int64(min(ROWS, kernels - row))
                for tile in range(0, count, TILE_POSITIONS):
                    column = start + tile
                    positions = np.int64(min(TILE_POSITIONS, count - tile))
                    _tile(w, row * depth + k0, depth, x, x_start + k0 * x_row + column, x_row, size, y,
                          y_start + row * y_row + column, y_row, rows, positions, b, np.int64(row), r,
                          r_begin + row * r_rows + column, r_stride, chunk_low, chunk_high)  # fmt: skip


#: Products deeper than this go through their depth in equal chunks (``columns``): a tile over the whole
#: depth of ResNet-50's 512 -> 512 3x3 layers (4608) reads a block of X's columns (1.2 MB, past L2) once
#: per 6 kernels. One core, 512 x 4608 x 441 (those layers' product at batch 16, 9 images): 10.9 -> 8.4
#: ms in chunks of 1536; 256 x 2304 x 196 1.05 -> 0.99; chunks of 512 made 128 x 1152 x 784 5% slower.
DEPTH_CHUNK = 2048


@numba.njit(nogil=True, cache=True, inline="always")
def chunk_depth(depth):  # noqa: ANN001, ANN202
    """Rows of X a pass of ``columns`` takes: the whole depth up to ``DEPTH_CHUNK``, else equal chunks."""
    if depth <= DEPTH_CHUNK:
        return depth
    chunks = (depth + DEPTH_CHUNK - 1) // DEPTH_CHUNK
    return (depth + chunks - 1) // chunks


@numba.njit(nogil=True, cache=True, inline="always")
def later_chunks_bias(bias, kernels, chunk, depth):  # noqa: ANN001, ANN202
    """The bias of a product's later depth chunks (zeros: the first chunk added the bias), allocated only
    for a product in chunks (``bias`` itself, never read so, for one in a single pass): made on every
    call, it was most of what a steady run allocated (lstm-gesture at batch 16: 4.5 KB a step)."""
    return bias if chunk == depth else np.zeros(kernels, np.float32)


@numba.njit(nogil=True, cache=True, inline="always")
def depth_chunk(k0, chunk, depth, low, high):  # noqa: ANN001, ANN202
    """(rows, low, high) of the chunk of depth from row ``k0``: its clamp the product's on the last chunk,
    none before (the partial sums stay unclamped)."""
    size = min(chunk, depth - k0)
    if k0 + size >= depth:
        return size, low, high
    return size, np.float32(-np.inf), np.float32(np.inf)


@numba.njit(nogil=True, cache=True, inline="always")
def block_width(block_bytes, depth):  # noqa: ANN001, ANN202
    """Columns of X in ``block_bytes`` (whole tiles, at least one) of a chunk of ``depth`` rows."""
    return max(1, block_bytes // (4 * chunk_depth(depth) * TILE_POSITIONS)) * TILE_POSITIONS


@numba.njit(nogil=True, cache=True)
def _plane(w, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, groups, image, group,
           first, last, width, first_block, last_block):  # noqa: ANN001, E501
    """Columns ``first .. last - 1`` of group ``group`` of image ``image`` (``columns``), in the row
    blocks ``first_block .. last_block - 1`` of that group."""
    depth = x.shape[1] // groups
    per_group = kernels // groups
    r_row = np.int64(positions) if r_image >= 0 else np.int64(-1)
    rows_before = group * per_group * positions
    row = np.int64(positions)
    columns(w[group * per_group * depth:], np.int64(depth), x.reshape(x.size),
            np.int64((image * groups + group) * depth * positions), row, y, image * y_image + rows_before, row,
            np.int64(per_group), bias[group * per_group:], residual, max(image * r_image, 0) + rows_before,
            r_row, low, high, first, last, width, first_block, last_block)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def gemm_items(w, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, groups, items,
               block_bytes):  # noqa: ANN001, E501
    """``Y[n][:, a:b] = clamp(W @ X[n][:, a:b] + bias [+ R[n][:, a:b]], low, high)`` for every
    ``(n, a, b)`` row of ``items``, in ``groups`` groups (group g: W's and Y's g-th ``kernels / groups``
    rows, X's g-th ``depth / groups`` channels): W the flat ``[kernels, depth / groups]``, X
    ``[N, depth, positions]`` contiguous, Y and R flat with their images ``y_image`` and ``r_image``
    floats apart (``r_image`` < 0: no residual); ``block_bytes`` of X's columns at a time."""
    width = block_width(block_bytes, x.shape[1] // groups)
    blocks = np.int64((kernels // groups + ROWS - 1) // ROWS)
    for i in range(items.shape[0]):
        for group in range(groups):
            _plane(w, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, groups,
                   items[i, 0], group, items[i, 1], items[i, 2], width, np.int64(0), blocks)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def gemm_share(w, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, groups, share, shares,
               row_parts, block_bytes):  # noqa: ANN001, E501
    """Share ``share`` of ``shares`` of ``gemm_items``' work over every image and group of ``x``. The
    shares are ``shares // row_parts`` runs of whole column tiles or vectors (``share_unit``; each image's
    groups' units taken in order) by ``row_parts`` ranges of each group's row blocks."""
    column_parts = shares // row_parts
    column_part, row_part = share // row_parts, share % row_parts
    blocks = (kernels // groups + ROWS - 1) // ROWS
    first_block, last_block = blocks * row_part // row_parts, blocks * (row_part + 1) // row_parts
    planes = x.shape[0] * groups
    unit = share_unit(planes, positions, column_parts)
    per_plane = (positions + unit - 1) // unit
    total = planes * per_plane
    first, last = total * column_part // column_parts, total * (column_part + 1) // column_parts
    width = block_width(block_bytes, x.shape[1] // groups)
    for plane in range(first // per_plane, (last + per_plane - 1) // per_plane):
        start = max(first, plane * per_plane) - plane * per_plane
        stop = min(last, (plane + 1) * per_plane) - plane * per_plane
        if stop > start:
            _plane(w, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, groups,
                   plane // groups, plane % groups, np.int64(start * unit), np.int64(min(positions, stop * unit)),
                   width, np.int64(first_block), np.int64(last_block))  # fmt: skip


#: Column shares are runs of whole tiles where the planes hold at least this many tiles per share, else
#: runs of whole vectors: a 14x14 map's 196 positions are 3 full tiles and one of 4 positions, so four
#: shares of whole tiles left one thread 8 of the 13 vectors.
TILES_PER_SHARE = 2


@numba.njit(nogil=True, cache=True, inline="always")
def share_unit(planes, positions, column_parts):  # noqa: ANN001, ANN202
    """Positions per unit of a column share (``gemm_share``): a whole tile, or one vector on small maps."""
    tiles = planes * ((positions + TILE_POSITIONS - 1) // TILE_POSITIONS)
    return TILE_POSITIONS if tiles >= TILES_PER_SHARE * column_parts else lv.LANES


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a spin job's argument block (``pack_job``): W, X (3-D), Y, R, bias, bounds, then 7 numbers.
JOB_SLOTS = 21


def new_job_block() -> np.ndarray:
    """An argument block for ``pack_job`` (one job at a time uses it)."""
    return np.zeros(JOB_SLOTS, np.int64)


@numba.njit(nogil=True, cache=True)
def pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, positions, groups, row_parts,
             block_bytes):  # noqa: ANN001, E501
    """Fill ``block`` for ``job_address()``: ``gemm_share``'s arguments, ``bounds`` the float32 (low, high)."""
    slot = put_arrays(block, 0, (w, x, y, residual, bias, bounds))
    put_values(block, slot, (y_image, r_image, kernels, positions, groups, row_parts, block_bytes))



def share_job(w, x, y, y_image, residual, r_image, bias, bounds, kernels, positions, groups, row_parts, block_bytes, shares) -> Job:  # noqa: ANN001
    """``gemm_share``'s product as a spin-pool job of ``shares`` chunks, on its own block (``pack_job``'s)."""
    block = new_job_block()
    pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, positions, groups, row_parts, block_bytes)
    return Job(job_address(), block, shares, (w, x, y, residual, bias, bounds))


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``gemm_share`` as a spin-pool job (``pack_job``'s argument block)."""
    bounds = float32_1d(args, 12)
    gemm_share(float32_1d(args, 0), float32_3d(args, 2), float32_1d(args, 6), args[14], float32_1d(args, 8),
               args[15], float32_1d(args, 10), bounds[0], bounds[1], args[16], args[17], args[18], chunk, chunks,
               args[19], args[20])  # fmt: skip


@functools.cache
def job_address() -> int:
    """The address of ``gemm_share`` compiled as a spin-pool job (on first use)."""
    return spin_pool.job(_share_job)
