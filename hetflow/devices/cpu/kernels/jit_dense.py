"""Float32 dense layers: ``Y = act(A @ B + bias)``, A's rows (the examples) read where they lie, B's
columns in the vector lanes, B in panels of 64 columns packed once per weight array.

A fully connected layer at a small batch is a product of a few rows of A by a large B (the weights).
OpenBLAS packs B on every call, and for 16 rows that pass costs more than the product: LeNet's 800 ->
500 layer at batch 16, one core, 294 us in OpenBLAS; ONNX Runtime packs B once per session. Here a tile
is ``ROWS`` rows of A (each element broadcast) by ``VECTORS`` x 16 columns of B: 24 accumulators fed per
k by 4 loads of B and 6 broadcasts, stored finished into Y's rows (the bias added and the activation
applied in the registers). The last vector of a tile is masked, so any N works and nothing past Y's
rows is written.

B is read from panels (``jit_lane_gemm.packed_weights``: panel t holds columns ``64t .. 64t + 63`` as
``[K, 64]``, zero past N), or from a plain row-major ``[K, N]`` (a panel is then 64 columns wide and N
apart a row). Panels matter: read in place, B's rows lie N floats apart and each k of a tile touches a
new row (a page apart for N = 4096), which the prefetchers do not follow: 16 x 9216 x 4096 took 42-62 ms
on one core read in place, 16 in panels.

The depth is taken ``DEPTH_CHUNK`` rows at a time: that chunk of a panel (64 KB) stays in L2 while every
row tile of A passes over it. Between chunks the partial sums wait in Y (a tile's rows of Y stay in L1);
the last chunk adds the bias and applies the activation as it stores.

A share of the work (``dense_share``) is a range of panels over every row of A: each share reads its
own panels of B, once.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_lane_gemm
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.spin_pool import Job, float32_1d, put_arrays, put_values

#: Rows of A (examples) per tile: each element broadcast feeds one FMA per vector of the tile.
ROWS = 6
#: The most vectors of 16 columns per tile (``ROWS * VECTORS`` accumulators, 24 of 32 registers): a panel's.
VECTORS = jit_lane_gemm.KERNEL_VECTORS
#: Columns of B and Y per full tile: one panel (``jit_lane_gemm.TILE_KERNELS``).
TILE_COLUMNS = VECTORS * lv.LANES
#: Rows of B per pass over A's row tiles (64 KB of a full tile's columns).
DEPTH_CHUNK = 256


def _tile_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled tile of ``vectors`` vectors of columns (see ``_tile``'s docstring)."""

    @intrinsic
    def tile(typingctx, a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias, bias_start,
             fresh, final, constants):  # noqa: ANN001, ANN202, E501
        signature = types.void(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias,
                               bias_start, fresh, final, constants)  # fmt: skip

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            (a_v, a_start_v, lda_v, b_v, b_start_v, ldb_v, depth_v, y_v, y_start_v, ldy_v, rows_v, lanes_v,
             bias_v, bias_start_v, fresh_v, final_v, constants_v) = args  # fmt: skip
            a_data = lv.array_data(context, builder, sig.args[0], a_v)
            b_data = lv.array_data(context, builder, sig.args[3], b_v)
            y_data = lv.array_data(context, builder, sig.args[7], y_v)
            bias_data = lv.array_data(context, builder, sig.args[12], bias_v)
            constants_data = lv.array_data(context, builder, sig.args[16], constants_v)
            fma = lv.fused_multiply_add(builder)
            mask = lv.lanes_inside(builder, lv.INT(0), lv.LANES, lanes_v)
            zero = lv.float_vector(lv.LANES, 0.0)
            slots = lv.accumulators(builder, ROWS, vectors)
            # Rows past ``rows`` repeat the last one: they read A where it lies and are never stored.
            last_row = builder.sub(rows_v, lv.INT(1))
            row_index = [builder.select(builder.icmp_signed("<", lv.INT(r), rows_v), lv.INT(r), last_row)
                         for r in range(ROWS)]  # fmt: skip
            a_rows = [builder.add(a_start_v, builder.mul(r, lda_v)) for r in row_index]
            y_rows = [builder.add(y_start_v, builder.mul(r, ldy_v)) for r in row_index]
            with builder.if_then(builder.icmp_signed("==", fresh_v, lv.INT(0))):
                for r, row in enumerate(slots):
                    for v, slot in enumerate(row):
                        at = builder.add(y_rows[r], lv.INT(v * lv.LANES))
                        builder.store(lv.load_lanes(builder, y_data, at, mask if v == vectors - 1 else None, zero), slot)
            with cgutils.for_range(builder, depth_v) as loop:
                k = loop.index
                b_k = builder.add(b_start_v, builder.mul(k, ldb_v))
                weights = [lv.load_lanes(builder, b_data, builder.add(b_k, lv.INT(v * lv.LANES)),
                                 mask if v == vectors - 1 else None, zero) for v in range(vectors)]  # fmt: skip
                for r, row in enumerate(slots):
                    value = lv.load_scalar(builder, a_data, builder.add(a_rows[r], k))
                    lv.multiply_add_broadcast(builder, fma, weights, value, row)
            constants = [lv.broadcast(builder, lv.load_scalar(builder, constants_data, lv.INT(i))) for i in range(3)]
            final = builder.icmp_signed("!=", final_v, lv.INT(0))
            for r, row in enumerate(slots):
                with builder.if_then(builder.icmp_signed("<", lv.INT(r), rows_v)):
                    for v, slot in enumerate(row):
                        last = mask if v == vectors - 1 else None
                        column = lv.INT(v * lv.LANES)
                        total = builder.load(slot)
                        bias = lv.load_lanes(builder, bias_data, builder.add(bias_start_v, column), last, zero)
                        finished = lv.activate(builder, constants, builder.fadd(total, bias))
                        value = builder.select(final, finished, total)
                        lv.store_lanes(builder, value, y_data, builder.add(y_rows[r], column), last)
            return context.get_dummy_value()

        return signature, codegen

    return tile


_TILE_1 = _tile_intrinsic(1)
_TILE_2 = _tile_intrinsic(2)
_TILE_3 = _tile_intrinsic(3)
_TILE_4 = _tile_intrinsic(4)


@numba.njit(nogil=True, cache=True)
def _tile(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, columns, bias, bias_start, fresh, final,
          constants):  # noqa: ANN001, E501
    """One tile: ``rows`` (<= ROWS) rows by ``columns`` (<= TILE_COLUMNS) columns of Y, over ``depth`` rows
    of B (``ldb`` apart, from ``b_start``) and as many columns of A (its rows ``lda`` apart). ``fresh``:
    start from zero, else from the partial sums in Y; ``final``: add the bias and apply the activation
    (``constants``: slope, low, high) as the tile is stored, else store the partial sums."""
    vectors = (columns + 15) // 16
    lanes = columns - (vectors - 1) * 16
    if vectors == 4:
        _TILE_4(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias, bias_start, fresh,
                final, constants)  # fmt: skip
    elif vectors == 3:
        _TILE_3(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias, bias_start, fresh,
                final, constants)  # fmt: skip
    elif vectors == 2:
        _TILE_2(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias, bias_start, fresh,
                final, constants)  # fmt: skip
    else:
        _TILE_1(a, a_start, lda, b, b_start, ldb, depth, y, y_start, ldy, rows, lanes, bias, bias_start, fresh,
                final, constants)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def dense_share(a, lda, b, ldb, panel, y, ldy, bias, constants, m, n, k, share, shares):  # noqa: ANN001, ANN201
    """Share ``share`` of ``shares`` of ``Y[:m, :n] = act(A[:m, :k] @ B[:k, :n] + bias)``: a range of panels
    (64 columns each) over every row. A and Y flat float32 with rows ``lda`` and ``ldy`` apart; B flat
    float32, column ``64t + j`` of row k at ``t * panel + k * ldb + j`` (packed panels: ``panel = 64 k``,
    ``ldb = 64``; a plain ``[K, N]``: ``panel = 64``, ``ldb = N``); ``bias`` float32 ``[n]``; ``constants``
    float32 (slope, low, high) of the activation (``jit_depthwise_lanes.activation_constants``)."""
    tiles = (n + TILE_COLUMNS - 1) // TILE_COLUMNS
    for tile in range(tiles * share // shares, tiles * (share + 1) // shares):
        column = tile * TILE_COLUMNS
        columns = min(TILE_COLUMNS, n - column)
        for k0 in range(0, k, DEPTH_CHUNK):
            size = min(DEPTH_CHUNK, k - k0)
            fresh, final = np.int64(k0 == 0), np.int64(k0 + size >= k)
            for row in range(0, m, ROWS):
                _tile(a, row * lda + k0, lda, b, tile * panel + k0 * ldb, ldb, size, y, row * ldy + column, ldy,
                      np.int64(min(ROWS, m - row)), np.int64(columns), bias, np.int64(column), fresh, final,
                      constants)  # fmt: skip


def packed_panels(w: np.ndarray) -> np.ndarray:
    """The weights ``W [N, K]`` (B transposed: a Gemm's B with ``transB``) as ``dense_share``'s panels."""
    return jit_lane_gemm.packed_weights(w, int(w.shape[0]))


def shares_for(n: int, threads: int) -> int:
    """How many shares a product of ``n`` columns splits into on ``threads`` threads: one per thread, at
    most one per column tile."""
    return max(1, min(threads, -(-n // TILE_COLUMNS)))


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a spin job's argument block (``pack_job``): A, B, Y, bias, constants, then 7 numbers.
JOB_SLOTS = 17


def share_job(a, lda, b, ldb, panel, y, ldy, bias, constants, m, n, k, shares) -> Job:  # noqa: ANN001
    """``dense_share``'s product (A, B, Y flat; see there) as a spin-pool job of ``shares`` chunks, on its
    own block."""
    block = np.zeros(JOB_SLOTS, np.int64)
    pack_job(block, a, lda, b, ldb, panel, y, ldy, bias, constants, m, n, k)
    return Job(job_address(), block, shares, (a, b, y, bias, constants))


@numba.njit(nogil=True, cache=True)
def pack_job(block, a, lda, b, ldb, panel, y, ldy, bias, constants, m, n, k):  # noqa: ANN001, ANN201
    """Fill ``block`` for ``job_address()``: ``dense_share``'s arguments (A, B, Y flat)."""
    slot = put_arrays(block, 0, (a, b, y, bias, constants))
    put_values(block, slot, (lda, ldb, panel, ldy, m, n, k))


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``dense_share`` as a spin-pool job (``pack_job``'s argument block)."""
    dense_share(float32_1d(args, 0), args[10], float32_1d(args, 2), args[11], args[12], float32_1d(args, 4),
                args[13], float32_1d(args, 6), float32_1d(args, 8), args[14], args[15], args[16], chunk,
                chunks)  # fmt: skip


@functools.cache
def job_address() -> int:
    """The address of ``dense_share`` compiled as a spin-pool job (on first use)."""
    return spin_pool.job(_share_job)
