"""Float32 GEMM with packed weights and the Conv epilogue in registers: ``Y = clamp(W @ X + b [+ R])``.

The product a 1x1 Conv computes per image: ``W [M, K]`` the layer's weights, ``X [K, N]`` its input
planes as they lie, ``Y [M, N]`` its output planes. OpenBLAS computes the product, then another pass
over Y adds the bias, a folded residual and the activation; here each tile of Y leaves the registers
finished. The weights are packed (``pack_weights``, ``pack_into``) so that a tile's broadcasts read
consecutive floats.

A tile is ``ROWS`` kernels by up to ``4 x 16`` positions: ``ROWS x vectors`` accumulators in vector
registers, fed per k by ``vectors`` loads of X and ``ROWS`` broadcasts of W (6 x 4: 24 FMAs for 10
loads), over the whole depth. X is taken ``BLOCK_BYTES`` of columns at a time, and every row block of W
passes over those columns before the next: the block stays in L2, and each row block writes its rows of
Y from start to end. The last vector of a tile is masked (positions past N are never read or written),
and rows past M are computed on zero weights and not stored.

Measured one core, caches warm, against OpenBLAS's product alone (GMAC/s, one process): 64x256x3136 75
vs 59, 24x144x3136 64 vs 45, 96x16x12544 46 vs 39, 2048x512x49 64 vs 57, but 128x512x784 63 vs 74 and
1024x256x196 73 vs 74: deep products lose the edge, and ``packed.MAX_DEPTH`` leaves them to OpenBLAS.
The epilogue OpenBLAS still needs is extra. Packing X's columns as BLAS does measured no faster inside
networks (resnet50 at batch 16), nor did slicing the depth to keep a tile's columns in L1.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv

#: Kernels (rows of W and Y) per tile: each broadcast weight feeds one FMA per vector of the tile.
ROWS = 6
#: The most vectors of 16 positions per tile (``ROWS * MAX_VECTORS`` accumulators, 24 of 32 registers).
MAX_VECTORS = 4
#: Positions per full tile.
TILE_POSITIONS = MAX_VECTORS * lv.LANES
#: Bytes of X's columns taken at a time: they stay in L2 while every row block of W passes over them.
BLOCK_BYTES = 256 << 10


def packed_shape(kernels: int, depth: int) -> tuple[int, int, int]:
    """The packed weights' shape for ``W [kernels, depth]``: ``[ceil(kernels / ROWS), depth, ROWS]``."""
    return (-(-kernels // ROWS), depth, ROWS)


def pack_weights(w: np.ndarray) -> np.ndarray:
    """``W [M, K]`` packed into a new array (``pack_into``)."""
    packed = np.empty(packed_shape(*w.shape), np.float32)
    pack_into(np.ascontiguousarray(w, np.float32), packed)
    return packed


def _tile_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled tile of ``vectors`` vectors (see ``_tile``'s docstring)."""

    @intrinsic
    def tile(typingctx, wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
             residual, r_start, r_row, low, high):  # noqa: ANN001, ANN202, E501
        signature = types.void(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias,
                               b_start, residual, r_start, r_row, low, high)  # fmt: skip

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            (wp_v, w_start_v, x_v, x_start_v, x_row_v, depth_v, y_v, y_start_v, y_row_v, rows_v, lanes_v,
             bias_v, b_start_v, residual_v, r_start_v, r_row_v, low_v, high_v) = args  # fmt: skip
            w_data = lv.array_data(context, builder, sig.args[0], wp_v)
            x_data = lv.array_data(context, builder, sig.args[2], x_v)
            y_data = lv.array_data(context, builder, sig.args[6], y_v)
            b_data = lv.array_data(context, builder, sig.args[11], bias_v)
            r_data = lv.array_data(context, builder, sig.args[13], residual_v)
            fma = lv.fused_multiply_add(builder)
            mask = lv.lanes_inside(builder, lv.INT(0), lv.LANES, lanes_v)
            zero = lv.float_vector(lv.LANES, 0.0)
            slots = lv.accumulators(builder, ROWS, vectors)
            with cgutils.for_range(builder, depth_v) as loop:
                k = loop.index
                x_k = builder.add(x_start_v, builder.mul(k, x_row_v))
                inputs = [lv.load_vector(builder, x_data, builder.add(x_k, lv.INT(v * lv.LANES)))
                          for v in range(vectors - 1)]  # fmt: skip
                last = builder.add(x_k, lv.INT((vectors - 1) * lv.LANES))
                inputs.append(lv.masked_load(builder, x_data, last, mask, zero))
                w_k = builder.add(w_start_v, builder.mul(k, lv.INT(ROWS)))
                for r in range(ROWS):
                    weight = lv.load_scalar(builder, w_data, builder.add(w_k, lv.INT(r)))
                    lv.multiply_add_broadcast(builder, fma, inputs, weight, slots[r])
            _finish(builder, slots, y_data, y_start_v, y_row_v, rows_v, mask, b_data, b_start_v, r_data,
                    r_start_v, r_row_v, low_v, high_v)  # fmt: skip
            return context.get_dummy_value()

        return signature, codegen

    return tile


def _row_stores(builder: ir.IRBuilder, slots: list[list[ir.Value]], rows: ir.Value):  # noqa: ANN202
    """(r, row slots) for the tile's rows below ``rows``, each yielded inside its guard."""
    for r, row in enumerate(slots):
        with builder.if_then(builder.icmp_signed("<", lv.INT(r), rows)):
            yield r, row


def _store(builder: ir.IRBuilder, value: ir.Value, base: ir.Value, offset: ir.Value, mask: ir.Value | None) -> None:
    if mask is None:
        builder.store(value, lv.vector_pointer(builder, base, offset), align=4)
    else:
        lv.masked_store(builder, value, base, offset, mask)


def _finish(builder, slots, y_data, y_start, y_row, rows, mask, b_data, b_start, r_data, r_start, r_row,
            low, high) -> None:  # noqa: ANN001
    """The accumulators plus the bias (and the residual), clamped, into Y."""
    low_vector = lv.broadcast(builder, low)
    high_vector = lv.broadcast(builder, high)
    has_residual = builder.icmp_signed(">=", r_row, lv.INT(0))
    for r, row in _row_stores(builder, slots, rows):
        b = lv.broadcast(builder, lv.load_scalar(builder, b_data, builder.add(b_start, lv.INT(r))))
        y_r = builder.add(y_start, builder.mul(y_row, lv.INT(r)))
        r_r = builder.add(r_start, builder.mul(r_row, lv.INT(r)))
        for v, slot in enumerate(row):
            offset = lv.INT(v * lv.LANES)
            last = mask if v == len(row) - 1 else None
            value = builder.fadd(builder.load(slot), b)
            value = _add_residual(builder, value, has_residual, r_data, builder.add(r_r, offset), last)
            value = _clamp(builder, value, low_vector, high_vector)
            _store(builder, value, y_data, builder.add(y_r, offset), last)


def _add_residual(builder: ir.IRBuilder, value: ir.Value, has_residual: ir.Value, base: ir.Value,
                  offset: ir.Value, mask: ir.Value | None) -> ir.Value:  # fmt: skip
    """``value + R[offset:offset + 16]`` when ``has_residual``, else ``value`` (R never read then)."""
    before = builder.block
    with builder.if_then(has_residual):
        if mask is None:
            loaded = lv.load_vector(builder, base, offset)
        else:
            loaded = lv.masked_load(builder, base, offset, mask, lv.float_vector(lv.LANES, 0.0))
        added = builder.fadd(value, loaded)
        inside = builder.block
    result = builder.phi(value.type)
    result.add_incoming(value, before)
    result.add_incoming(added, inside)
    return result


def _clamp(builder: ir.IRBuilder, value: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
    """``min(max(value, low), high)`` lane by lane, NaN kept (as numpy's clip)."""
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    return builder.select(builder.fcmp_ordered(">", value, high), high, value)


_TILE_1 = _tile_intrinsic(1)
_TILE_2 = _tile_intrinsic(2)
_TILE_3 = _tile_intrinsic(3)
_TILE_4 = _tile_intrinsic(4)


@numba.njit(nogil=True, cache=True)
def _tile(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, positions, bias, b_start,
          residual, r_start, r_row, low, high):  # noqa: ANN001, E501
    """One tile: ``rows`` (<= ROWS) kernels by ``positions`` (<= TILE_POSITIONS) positions of Y."""
    vectors = (positions + 15) // 16
    lanes = positions - (vectors - 1) * 16
    if vectors == 4:
        _TILE_4(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    elif vectors == 3:
        _TILE_3(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    elif vectors == 2:
        _TILE_2(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip
    else:
        _TILE_1(wp, w_start, x, x_start, x_row, depth, y, y_start, y_row, rows, lanes, bias, b_start,
                residual, r_start, r_row, low, high)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def pack_into(w, packed):  # noqa: ANN001
    """``w [M, K]`` into ``packed [ceil(M / ROWS), K, ROWS]`` (rows past M zero): ``pack_weights`` into a
    given buffer."""
    rows, depth = w.shape
    for block in range(packed.shape[0]):
        for k in range(depth):
            for r in range(ROWS):
                row = block * ROWS + r
                packed[block, k, r] = w[row, k] if row < rows else 0.0


@numba.njit(nogil=True, cache=True)
def _columns(wp, depth, x, x_start, y, y_start, kernels, positions, bias, residual, r_start, r_row, low,
             high, first, last, width):  # noqa: ANN001, E501
    """Columns ``first .. last - 1`` of one image's ``Y [kernels, positions]`` (X ``[depth, positions]``
    at ``x_start`` of the flat ``x``, Y at ``y_start`` of the flat ``y``, R at ``r_start`` when ``r_row``
    >= 0), ``width`` columns at a time, every row block over them before the next."""
    blocks = wp.shape[0] // (depth * ROWS)
    for start in range(first, last, width):
        count = min(width, last - start)
        for block in range(blocks):
            row = block * ROWS
            rows = np.int64(min(ROWS, kernels - row))
            for tile in range(0, count, TILE_POSITIONS):
                column = start + tile
                _tile(wp, np.int64(block * depth * ROWS), x, x_start + column, np.int64(positions),
                      np.int64(depth), y, y_start + row * positions + column, np.int64(positions), rows,
                      np.int64(min(TILE_POSITIONS, count - tile)), bias, np.int64(row), residual,
                      r_start + row * positions + column, r_row, low, high)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def gemm_items(wp, x, y, y_image, residual, r_image, bias, low, high, kernels, positions, items, block_bytes):  # noqa: ANN001, E501
    """``Y[n][:, a:b] = clamp(W @ X[n][:, a:b] + bias [+ R[n][:, a:b]], low, high)`` for every
    ``(n, a, b)`` row of ``items``: X ``[N, depth, positions]`` contiguous, Y and R flat with their
    images ``y_image`` and ``r_image`` floats apart (``r_image`` < 0: no residual), ``wp`` the flat
    ``pack_weights(W)``; ``block_bytes`` of X's columns at a time (at least one tile)."""
    depth = x.shape[1]
    width = max(1, block_bytes // (4 * depth * TILE_POSITIONS)) * TILE_POSITIONS
    flat_x = x.reshape(x.size)
    r_row = np.int64(positions) if r_image >= 0 else np.int64(-1)
    for i in range(items.shape[0]):
        image, first, last = items[i, 0], items[i, 1], items[i, 2]
        _columns(wp, np.int64(depth), flat_x, np.int64(image * depth * positions), y, image * y_image,
                 np.int64(kernels), np.int64(positions), bias, residual, max(image * r_image, 0), r_row,
                 low, high, first, last, np.int64(width))  # fmt: skip
