"""Float32 GEMM with the kernels in the vector lanes, for products whose positions waste lanes:
``Y = clamp(W @ X + b [+ R])`` as ``jit_tile_gemm`` computes it, turned sideways.

``jit_tile_gemm`` puts 16 consecutive positions of Y in a vector, so a map of 49 positions (7x7: every
3x3 and 1x1 layer of ResNet-50's last stage) fills 3 vectors and 1 lane of a fourth: 49 of 64 lanes work.
Here a vector holds 16 kernels of one position: a tile is ``POSITIONS`` positions (each a scalar of X
broadcast) by ``KERNEL_VECTORS`` x 16 kernels (vectors of the packed weights), the same 10 loads per 24
FMAs, and only the kernels past the last whole 64 compute in vain (none for 512 or 2048 kernels).

W is packed once per weight array (``packed_weights``): kernel tile t's weights ``[depth, 64]`` from
``t * depth * 64``, kernels past K zero. The depth is taken ``DEPTH_CHUNK`` rows at a time: the chunk
of one kernel tile's weights (64 KB) stays in L2 while every position tile of the image passes over it,
its accumulators kept between chunks in a position-major scratch ``[positions, 64]`` (L1-sized for the
maps this serves). After the last chunk each of the tile's kernels is copied out of that scratch into
its row of Y with the bias, a folded residual and the clamp.

A share of the work (``lane_share``) is a range of kernel tiles over every image, or where the tiles do
not share out evenly over the threads, of parts of them: a tile's positions in one part a thread
(``position_parts``).

Measured (2026-11-24, Zen 5 VM). Products alone on one core, lane / tile GEMM time: 512 x 4608 x 49 (a
3x3 layer's columns on 7x7) 0.86, 512 x 2048 x 49 0.88, 2048 x 512 x 49 0.90, 1000 x 1024 x 1 0.29
(``own_gemm.lanes_pay`` has the rest). Inside ResNet-50 at batch 1 the weights come from DRAM: without
the prefetch the 3x3 layers ran 5% slower than on the tiles; with it (in-run, 2 threads) 512 -> 512 3x3
on 7x7 ~935 -> ~860 us and 2048 -> 512 ~345 -> ~291, 512 -> 2048 unchanged. Whole runs (A/B, alternating
processes, 5 rounds x 30, minimums): resnet50 0.97, densenet121 0.99, inception_v2 1.00 at batch 1;
resnet50 0.99 at batch 16.
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

#: Vectors of 16 kernels per tile.
KERNEL_VECTORS = 4
#: Kernels per tile (the packed weights' row length).
TILE_KERNELS = KERNEL_VECTORS * lv.LANES
#: Positions per tile: ``POSITIONS x KERNEL_VECTORS`` accumulators (24 of 32 registers), 6 broadcasts.
POSITIONS = 6
#: Depth rows per pass over an image's position tiles (64 KB of a kernel tile's packed weights).
DEPTH_CHUNK = 256
#: Passes that prefetch (each one line of the next chunk per depth row): a depth row of packed weights is
#: this many lines, so the first passes over a chunk cover the next chunk whole.
PREFETCHING_PASSES = TILE_KERNELS // lv.LINE_FLOATS


@intrinsic
def _tile(typingctx, w, w_start, x, x_start, x_row, depth, acc, acc_start, count, fresh, ahead):  # noqa: ANN001, ANN202
    """``acc[acc_start + i*64 + 16*v ...] (+)= sum_k W[w_start + k*64 + 16*v ...] * X[x_start + k*x_row +
    i]`` for the tile's positions i < ``count`` (later ones repeat the last; their rows are ignored),
    starting from zero when ``fresh``; from ``ahead`` >= 0, one cache line of W a k is prefetched
    (``lane_share``)."""
    signature = types.void(w, w_start, x, x_start, x_row, depth, acc, acc_start, count, fresh, ahead)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        w_v, w_start_v, x_v, x_start_v, x_row_v, depth_v, acc_v, acc_start_v, count_v, fresh_v, ahead_v = args
        w_data = lv.array_data(context, builder, sig.args[0], w_v)
        x_data = lv.array_data(context, builder, sig.args[2], x_v)
        acc_data = lv.array_data(context, builder, sig.args[6], acc_v)
        fma = lv.fused_multiply_add(builder)
        slots = lv.accumulators(builder, POSITIONS, KERNEL_VECTORS)
        with builder.if_then(builder.icmp_signed("==", fresh_v, lv.INT(0))):
            for i, row in enumerate(slots):
                row_start = builder.add(acc_start_v, lv.INT(i * TILE_KERNELS))
                for vector, slot in zip(lv.load_vectors(builder, acc_data, row_start, KERNEL_VECTORS), row, strict=True):
                    builder.store(vector, slot)
        last = builder.sub(count_v, lv.INT(1))
        columns = [builder.add(x_start_v, builder.select(builder.icmp_signed("<", lv.INT(i), count_v), lv.INT(i), last))
                   for i in range(POSITIONS)]  # fmt: skip
        prefetching = builder.icmp_signed(">=", ahead_v, lv.INT(0))
        with cgutils.for_range(builder, depth_v) as loop:
            k = loop.index
            with builder.if_then(prefetching):
                lv.prefetch(builder, w_data, builder.add(ahead_v, builder.mul(k, lv.INT(lv.LINE_FLOATS))))
            weights = lv.load_vectors(builder, w_data, builder.add(w_start_v, builder.mul(k, lv.INT(TILE_KERNELS))),
                                      KERNEL_VECTORS)  # fmt: skip
            x_k = builder.mul(k, x_row_v)
            for i, row in enumerate(slots):
                value = lv.load_scalar(builder, x_data, builder.add(columns[i], x_k))
                lv.multiply_add_broadcast(builder, fma, weights, value, row)
        lv.store_accumulators(builder, slots, acc_data, acc_start_v, lv.INT(TILE_KERNELS))
        return context.get_dummy_value()

    return signature, codegen


def packed_weights(w: np.ndarray, kernels: int) -> np.ndarray:
    """W ``[kernels, depth]`` (any shape with ``kernels`` rows) packed for ``lane_share``: flat, kernel
    tile t's ``[depth, 64]`` from ``t * depth * 64``, kernels past ``kernels`` zero."""
    rows = np.ascontiguousarray(w, np.float32).reshape(kernels, -1)
    return panels_from_rows(lambda start, stop: rows[start:stop], kernels, rows.shape[1], True)


#: About the bytes of W read per block while packing it (``panels_from_rows``).
PACK_BLOCK_BYTES = 4 << 20


def panels_from_rows(read_rows: Callable[[int, int], np.ndarray], columns: int, depth: int,
                     transposed: bool) -> np.ndarray:  # fmt: skip
    """``packed_weights``'s panels of a ``depth`` x ``columns`` product operand (the dense kernel's B, the
    lane GEMM's W transposed), read a block of its stored rows at a time: ``read_rows(start, stop)``
    returns stored rows ``start .. stop - 1`` as a 2-D array, of ``[columns, depth]`` where
    ``transposed`` (a Gemm's B with ``transB``, a Conv's W), else of ``[depth, columns]``. Only the panels
    and one block are held at once (the rows may be read from a file as they are packed)."""
    tiles = -(-columns // TILE_KERNELS)
    panels = np.zeros((tiles, depth, TILE_KERNELS), np.float32)
    if transposed:  # a block is whole panels: TILE_KERNELS stored rows each
        per_block = max(1, PACK_BLOCK_BYTES // (TILE_KERNELS * depth * 4))
        for first in range(0, tiles, per_block):
            start, stop = first * TILE_KERNELS, min(columns, (first + per_block) * TILE_KERNELS)
            _put_columns(panels, first, read_rows(start, stop).T)
        return panels.reshape(-1)
    per_block = max(1, PACK_BLOCK_BYTES // (columns * 4))  # a block is whole stored rows
    for start in range(0, depth, per_block):
        stop = min(depth, start + per_block)
        _put_columns(panels[:, start:stop], 0, read_rows(start, stop))
    return panels.reshape(-1)


def _put_columns(panels: np.ndarray, first: int, block: np.ndarray) -> None:
    """Copy ``block`` (depth rows, its columns from panel ``first``'s first) into ``panels [tiles, rows, 64]``."""
    whole, rest = divmod(block.shape[1], TILE_KERNELS)
    rows = block.shape[0]
    if whole:
        panels[first : first + whole] = block[:, : whole * TILE_KERNELS].reshape(rows, whole, TILE_KERNELS).transpose(1, 0, 2)
    if rest:
        panels[first + whole, :, :rest] = block[:, whole * TILE_KERNELS :]


_ADDRESSES = ir.VectorType(lv.INT, lv.LANES)
_POINTERS = ir.VectorType(ir.PointerType(), lv.LANES)
_MASK = ir.VectorType(ir.IntType(1), lv.LANES)
_LANE_NUMBERS = ir.Constant(_ADDRESSES, list(range(lv.LANES)))


def _column_pointers(builder: ir.IRBuilder, base: ir.Value, start: ir.Value, rows: ir.Value, row: ir.Value,
                     column: ir.Value) -> ir.Value:  # fmt: skip
    """The addresses of ``base[start + (rows + lane) * row + column]`` for the 16 lanes."""
    offsets = builder.add(builder.mul(builder.add(lv.splat(builder, rows), _LANE_NUMBERS), lv.splat(builder, row)),
                          lv.splat(builder, builder.add(start, column)))  # fmt: skip
    addresses = builder.add(lv.splat(builder, builder.ptrtoint(base, lv.INT)), builder.shl(offsets, lv.splat(builder, lv.INT(2))))
    return builder.inttoptr(addresses, _POINTERS)


@intrinsic
def _finish(typingctx, acc, y, y_start, kernel0, kernels, positions, first, last, bias, residual, r_start, r_row, low,
            high):  # noqa: ANN001, ANN202
    """Kernels ``kernel0 ..`` (up to 64, below ``kernels``) of one image from the position-major ``acc``
    into their rows of Y (``positions`` apart, from ``y_start``), positions ``first .. last - 1``, with the
    bias, the residual (rows ``r_row`` apart from ``r_start``; ``r_row`` < 0: none) and the clamp: each
    position's vector of 16 kernels scattered down its column of Y (numba's scalar copy took twice as
    long: 53 against 28 us for a 2048-kernel 7x7 layer's 100 K outputs)."""
    signature = types.void(acc, y, y_start, kernel0, kernels, positions, first, last, bias, residual, r_start, r_row,
                           low, high)  # fmt: skip

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        (acc_v, y_v, y_start_v, kernel0_v, kernels_v, positions_v, first_v, last_v, bias_v, r_v, r_start_v, r_row_v,
         low_v, high_v) = args  # fmt: skip
        acc_data = lv.array_data(context, builder, sig.args[0], acc_v)
        y_data = lv.array_data(context, builder, sig.args[1], y_v)
        b_data = lv.array_data(context, builder, sig.args[8], bias_v)
        r_data = lv.array_data(context, builder, sig.args[9], r_v)
        scatter = builder.module.declare_intrinsic(
            "llvm.masked.scatter.v16f32.v16p0",
            fnty=ir.FunctionType(ir.VoidType(), [lv.VECTOR, _POINTERS, lv.INT32, _MASK]),
        )
        gather = builder.module.declare_intrinsic(
            "llvm.masked.gather.v16f32.v16p0", fnty=ir.FunctionType(lv.VECTOR, [_POINTERS, lv.INT32, _MASK, lv.VECTOR])
        )
        zero = lv.float_vector(lv.LANES, 0.0)
        low_vector, high_vector = lv.broadcast(builder, low_v), lv.broadcast(builder, high_v)
        has_residual = builder.icmp_signed(">=", r_row_v, lv.INT(0))
        for v in range(KERNEL_VECTORS):
            rows = builder.add(kernel0_v, lv.INT(v * lv.LANES))
            mask = lv.lanes_inside(builder, rows, lv.LANES, kernels_v)
            b = lv.masked_load(builder, b_data, rows, mask, zero)
            with cgutils.for_range(builder, builder.sub(last_v, first_v)) as loop:
                p = builder.add(first_v, loop.index)
                value = builder.fadd(lv.load_vector(builder, acc_data, builder.add(builder.mul(p, lv.INT(TILE_KERNELS)),
                                                                                   lv.INT(v * lv.LANES))), b)  # fmt: skip
                before = builder.block
                with builder.if_then(has_residual):
                    r_pointers = _column_pointers(builder, r_data, r_start_v, rows, r_row_v, p)
                    added = builder.fadd(value, builder.call(gather, [r_pointers, lv.INT32(4), mask, zero]))
                    inside = builder.block
                summed = builder.phi(lv.VECTOR)
                summed.add_incoming(value, before)
                summed.add_incoming(added, inside)
                value = lv.clamp(builder, summed, low_vector, high_vector)
                pointers = _column_pointers(builder, y_data, y_start_v, rows, positions_v, p)
                builder.call(scatter, [value, pointers, lv.INT32(4), mask])
        return context.get_dummy_value()

    return signature, codegen


@numba.njit(nogil=True, cache=True)
def lane_share(w, x, y, y_image, residual, r_image, bias, low, high, kernels, parts, share, shares):  # noqa: ANN001, ANN201
    """Share ``share`` of ``shares`` of ``Y[n] = clamp(W @ X[n] + bias [+ R[n]], low, high)`` for every image
    n of X ``[N, depth, positions]`` (contiguous): a range of units, a unit one of ``parts`` ranges of
    positions (whole position tiles) of one kernel tile. W: ``packed_weights``; Y and R flat with images
    ``y_image`` and ``r_image`` floats apart (``r_image`` < 0: no residual), rows ``positions`` apart."""
    count, depth, positions = x.shape
    tiles = (kernels + TILE_KERNELS - 1) // TILE_KERNELS
    units = tiles * parts
    position_tiles = (positions + POSITIONS - 1) // POSITIONS
    flat_x = x.reshape(x.size)
    image_slots = position_tiles * POSITIONS * TILE_KERNELS
    acc = np.empty(count * image_slots, np.float32)
    r_row = positions if r_image >= 0 else -1
    for unit in range(units * share // shares, units * (share + 1) // shares):
        tile, part = unit // parts, unit % parts
        first = position_tiles * part // parts * POSITIONS
        last = min(positions, position_tiles * (part + 1) // parts * POSITIONS)
        for k0 in range(0, depth, DEPTH_CHUNK):
            chunk = min(DEPTH_CHUNK, depth - k0)
            w_start = (tile * depth + k0) * TILE_KERNELS
            # The next chunk of W (next in memory, whether this tile's or the next tile's) is prefetched
            # a line a k over the first passes, while this one is read from L2: read only as the next
            # pass starts, it came from DRAM at a pace that left the FMAs waiting.
            after = w_start + chunk * TILE_KERNELS
            passes = 0
            for image in range(count):
                x_start = (image * depth + k0) * positions
                for p0 in range(first, last, POSITIONS):
                    ahead = after + passes * chunk * lv.LINE_FLOATS
                    _tile(w, w_start, flat_x, x_start + p0, positions, chunk, acc,
                          image * image_slots + p0 * TILE_KERNELS, min(POSITIONS, positions - p0), k0 == 0,
                          ahead if passes < PREFETCHING_PASSES else -1)  # fmt: skip
                    passes += 1
        for image in range(count):
            _finish(acc[image * image_slots:], y, image * y_image, tile * TILE_KERNELS, kernels, positions, first,
                    last, bias, residual, max(image * r_image, 0), r_row, low, high)  # fmt: skip


def position_parts(kernels: int, positions: int, threads: int) -> int:
    """Parts of a kernel tile's positions ``lane_share`` makes units of on ``threads`` threads: one where the
    kernel tiles share out evenly, else one a thread (positions allowing), so that every thread gets as
    many units. MobileNet v2's 960 -> 320 on 7x7 (5 tiles) had the tiles 3:2 between two threads."""
    tiles = -(-kernels // TILE_KERNELS)
    if tiles % threads == 0:
        return 1
    return max(1, min(threads, -(-positions // POSITIONS)))


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a spin job's argument block (``pack_job``): W, X (3-D), Y, R, bias, bounds, then 4 numbers.
JOB_SLOTS = 18


def new_job_block() -> np.ndarray:
    """An argument block for ``pack_job`` (one job at a time uses it)."""
    return np.zeros(JOB_SLOTS, np.int64)


@numba.njit(nogil=True, cache=True)
def pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, parts):  # noqa: ANN001, ANN201
    """Fill ``block`` for ``job_address()``: ``lane_share``'s arguments, ``bounds`` the float32 (low, high)."""
    slot = put_arrays(block, 0, (w, x, y, residual, bias, bounds))
    put_values(block, slot, (y_image, r_image, kernels, parts))



def share_job(w, x, y, y_image, residual, r_image, bias, bounds, kernels, parts, shares) -> Job:  # noqa: ANN001
    """``lane_share``'s product as a spin-pool job of ``shares`` chunks, on its own block (``pack_job``'s)."""
    block = new_job_block()
    pack_job(block, w, x, y, y_image, residual, r_image, bias, bounds, kernels, parts)
    return Job(job_address(), block, shares, (w, x, y, residual, bias, bounds))


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``lane_share`` as a spin-pool job (``pack_job``'s argument block)."""
    bounds = float32_1d(args, 12)
    lane_share(float32_1d(args, 0), float32_3d(args, 2), float32_1d(args, 6), args[14], float32_1d(args, 8),
               args[15], float32_1d(args, 10), bounds[0], bounds[1], args[16], args[17], chunk, chunks)  # fmt: skip


@functools.cache
def job_address() -> int:
    """The address of ``lane_share`` compiled as a spin-pool job (on first use)."""
    return spin_pool.job(_share_job)
