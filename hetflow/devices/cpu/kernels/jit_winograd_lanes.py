"""Winograd's input and output transforms with 16 tiles in the vector lanes, in LLVM IR, for float32.

Why: ``jit_winograd``'s transforms run each plane through loops over its tile rows and their columns;
on small maps those loops are a few tiles long and run scalar. MentorNet's 64 -> 64 layer on 16x16 (16
tiles of F(4,3)) spent 30 us in its input transform and 24 in its output transform beside a 30 us
product, so Winograd, with a quarter of the direct kernel's multiply-adds, ran no faster than it.

Here a call transforms 16 consecutive tiles of one plane at once, one tile a lane, whatever the map's
width: the tiles' a x a inputs are gathered from X (masked: padding and rows or columns past the map
read as zero and are never touched), combined with B^T's coefficients down and across the tile, and
each of the a*a elements stored as 16 consecutive floats of ``V [a*a, C, T]``; on the way out the
products' a*a vectors of 16 tiles are combined with A^T's, the bias added, the activation applied and
each tile's m x m outputs scattered to Y (masked: the tiles' parts past OH or OW are cropped).
The coefficients (small integers) are compiled into the bodies, so zeros cost nothing and +-1 is an
add. Where each tile of the group starts is read from a table made once per layer (``TileTable``):
its lanes' offsets in X or Y (image and first row and column), its first row and its first column.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
from hetflow.devices.cpu.kernels.jit_epilogue import NO_ACTIVATION, activation_code
from hetflow.devices.cpu.spin_pool import Job, SpinPool, argument_block, float32_1d, int32_1d
from hetflow.devices.cpu.threads import parallel_planes, spin_split
from hetflow.ops.activation import FusedActivation

LANES = lv.LANES
_INT32_VECTOR = ir.VectorType(lv.INT32, LANES)
_MASK = ir.VectorType(ir.IntType(1), LANES)

#: B^T (a x a) and A^T (m x a) of F(2,3) and F(4,3), by output tile edge m, as in ``winograd.transforms``
#: (kept here as literals: they are compiled into the IR, and ``test_jit_winograd_lanes`` checks them
#: against the Cook-Toom construction).
INPUT_MATRICES: dict[int, tuple[tuple[float, ...], ...]] = {
    2: ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, -1, 0, 1)),
    4: (
        (4, 0, -5, 0, 1, 0),
        (0, 4, 4, -1, -1, 0),
        (0, -4, 4, 1, -1, 0),
        (0, -2, -1, 2, 1, 0),
        (0, 2, -1, -2, 1, 0),
        (0, 4, 0, -5, 0, 1),
    ),
}
OUTPUT_MATRICES: dict[int, tuple[tuple[float, ...], ...]] = {
    2: ((1, 1, 1, 0), (0, 1, -1, 1)),
    4: ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1)),
}
#: Row or column a table gives the lanes past the last tile: every one of its taps lies outside.
_OUTSIDE = -(2**30)


def tile_table(
    images: int, tiles: tuple[int, int], m: int, starts: tuple[int, int], width: int, image_stride: int
) -> np.ndarray:
    """Where each tile of ``images`` images of ``tiles`` = (tiles_h, tiles_w) tiles of edge ``m`` starts,
    as int32 ``[3, padded]`` (padded to whole groups of 16, flattened): the element of its first row and
    column (tile (i, j): row ``i*m + starts[0]``, column ``j*m + starts[1]``, in planes ``width`` wide,
    images ``image_stride`` elements apart), that row, and that column (negative in the padding;
    ``_OUTSIDE`` past the last tile). Tile t = (image * tiles_h + i) * tiles_w + j, as in V."""
    count = images * tiles[0] * tiles[1]
    padded = -(-count // LANES) * LANES
    image, i, j = np.unravel_index(np.arange(count), (images, *tiles))
    table = np.full((3, padded), _OUTSIDE, np.int64)
    table[1, :count] = i * m + starts[0]
    table[2, :count] = j * m + starts[1]
    table[0, :count] = image * image_stride + table[1, :count] * width + table[2, :count]
    if count and np.abs(table[:, :count]).max() >= 2**31:
        raise ValueError("a Winograd layer too large for 32-bit tile offsets")
    return np.ascontiguousarray(table, np.int32).reshape(-1)


# -- the IR --------------------------------------------------------------------------------------------
def _combine(builder: ir.IRBuilder, coefficients: tuple[float, ...], values: list[ir.Value]) -> ir.Value:
    """sum_k coefficients[k] * values[k], skipping zeros, +-1 as adds and subtracts."""
    total = None
    for coefficient, value in zip(coefficients, values, strict=True):
        if coefficient == 0:
            continue
        if total is None:
            total = value if coefficient == 1 else builder.fmul(value, lv.float_vector(LANES, coefficient))
        elif coefficient == 1:
            total = builder.fadd(total, value)
        elif coefficient == -1:
            total = builder.fsub(total, value)
        else:
            fma = lv.fused_multiply_add(builder)
            total = builder.call(fma, [value, lv.float_vector(LANES, coefficient), total])
    return total if total is not None else lv.float_vector(LANES, 0.0)


def _int_splat(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A vector of 16 int32 copies of the int64 ``value``."""
    return lv.splat(builder, builder.trunc(value, lv.INT32), LANES)


def _int_constant(value: int) -> ir.Constant:
    return ir.Constant(_INT32_VECTOR, [value] * LANES)


def _load_table(builder: ir.IRBuilder, table: ir.Value, padded: ir.Value, t0: ir.Value) -> list[ir.Value]:
    """The group's offsets, first rows and first columns from the flat ``tile_table``."""
    starts = [t0, builder.add(t0, padded), builder.add(t0, builder.add(padded, padded))]
    return [builder.load(builder.bitcast(builder.gep(table, [start]), _INT32_VECTOR.as_pointer()), align=4)
            for start in starts]  # fmt: skip


def _inside(builder: ir.IRBuilder, starts: ir.Value, step: int, limit: ir.Value) -> ir.Value:
    """Lanes where ``0 <= starts + step < limit`` (one unsigned compare)."""
    return builder.icmp_unsigned("<", builder.add(starts, _int_constant(step)), limit)


@functools.cache
def _x86_gathers() -> bool:
    """Whether the host has AVX-512's gathers and scatters of 16 floats by 32-bit indices: LLVM's generic
    ``masked.gather`` needs a vector of 64-bit pointers, which it lowers to two 8-lane gathers and the
    arithmetic on the pointers (twice the time)."""
    return "+avx512f" in llvm_binding.get_host_cpu_features().flatten()


def _pointers(builder: ir.IRBuilder, base: ir.Value, indices: ir.Value) -> ir.Value:
    """The 16 pointers ``base + indices[lane]`` (floats), for LLVM's generic gather and scatter
    (llvmlite builds no GEP over a vector of indices, so as integers)."""
    wide = ir.VectorType(lv.INT, LANES)
    start = lv.splat(builder, builder.ptrtoint(base, lv.INT), LANES)
    bytes_in = builder.mul(builder.sext(indices, wide), ir.Constant(wide, [4] * LANES))
    return builder.inttoptr(builder.add(start, bytes_in), ir.VectorType(ir.PointerType(), LANES))


def _gather(builder: ir.IRBuilder, base: ir.Value, indices: ir.Value, mask: ir.Value) -> ir.Value:
    """``base[indices[lane]]`` where ``mask`` is set, 0 elsewhere (those addresses are never read)."""
    zero = lv.float_vector(LANES, 0.0)
    if _x86_gathers():
        function = builder.module.declare_intrinsic(
            "llvm.x86.avx512.mask.gather.dps.512",
            fnty=ir.FunctionType(lv.VECTOR, [lv.VECTOR, ir.PointerType(), _INT32_VECTOR, _MASK, lv.INT32]),
        )
        return builder.call(function, [zero, base, indices, mask, lv.INT32(4)])
    function = builder.module.declare_intrinsic(
        "llvm.masked.gather.v16f32.v16p0",
        fnty=ir.FunctionType(lv.VECTOR, [ir.VectorType(ir.PointerType(), LANES), lv.INT32, _MASK, lv.VECTOR]),
    )
    return builder.call(function, [_pointers(builder, base, indices), lv.INT32(4), mask, zero])


def _scatter(builder: ir.IRBuilder, value: ir.Value, base: ir.Value, indices: ir.Value, mask: ir.Value) -> None:
    """``base[indices[lane]] = value[lane]`` where ``mask`` is set."""
    if _x86_gathers():
        function = builder.module.declare_intrinsic(
            "llvm.x86.avx512.mask.scatter.dps.512",
            fnty=ir.FunctionType(ir.VoidType(), [ir.PointerType(), _MASK, _INT32_VECTOR, lv.VECTOR, lv.INT32]),
        )
        builder.call(function, [base, mask, indices, value, lv.INT32(4)])
        return
    function = builder.module.declare_intrinsic(
        "llvm.masked.scatter.v16f32.v16p0",
        fnty=ir.FunctionType(ir.VoidType(), [lv.VECTOR, ir.VectorType(ir.PointerType(), LANES), lv.INT32, _MASK]),
    )
    builder.call(function, [value, _pointers(builder, base, indices), lv.INT32(4), mask])


def _input_body(builder: ir.IRBuilder, m: int, x: ir.Value, table: list[ir.Value], limits: list[ir.Value],
                v: ir.Value, v_start: ir.Value, v_step: ir.Value, store_mask: ir.Value) -> None:  # fmt: skip
    """One group: gather the tiles' a x a inputs, ``B^T d B``, store the a*a vectors to V."""
    bt = INPUT_MATRICES[m]
    a = len(bt)
    offsets, rows, cols = table
    height, width = limits
    width_value = builder.trunc(width, lv.INT32)
    wide = _int_splat(builder, width)
    tall = _int_splat(builder, height)
    column_inside = [_inside(builder, cols, q, wide) for q in range(a)]
    across = []  # across[r][j]: B^T's row j across the tile's row r
    for r in range(a):
        row_inside = _inside(builder, rows, r, tall)
        row_offsets = builder.add(offsets, lv.splat(builder, builder.mul(width_value, lv.INT32(r)), LANES))
        inputs = [
            _gather(builder, x, builder.add(row_offsets, _int_constant(q)), builder.and_(row_inside, column_inside[q]))
            for q in range(a)
        ]
        across.append([_combine(builder, bt[j], inputs) for j in range(a)])
    for i in range(a):
        for j in range(a):
            value = _combine(builder, bt[i], [across[r][j] for r in range(a)])
            offset = builder.add(v_start, builder.mul(v_step, lv.INT(i * a + j)))
            lv.store_lanes(builder, value, v, offset, store_mask)


def _output_body(builder: ir.IRBuilder, m: int, products: ir.Value, p_start: ir.Value, p_step: ir.Value,
                 table: list[ir.Value], limits: list[ir.Value], y: ir.Value, bias: ir.Value,
                 constants: list[ir.Value], load_mask: ir.Value | None) -> None:  # fmt: skip
    """One group: load the a*a vectors of products, ``A^T M A`` + bias, activate, scatter to Y."""
    at = OUTPUT_MATRICES[m]
    a = len(at[0])
    offsets, rows, cols = table
    out_h, out_w = limits
    width_value = builder.trunc(out_w, lv.INT32)
    wide = _int_splat(builder, out_w)
    tall = _int_splat(builder, out_h)
    zero = lv.float_vector(LANES, 0.0)
    loaded = [
        lv.load_lanes(builder, products, builder.add(p_start, builder.mul(p_step, lv.INT(e))), load_mask, zero)
        for e in range(a * a)
    ]
    down = [[_combine(builder, at[i], [loaded[r * a + s] for r in range(a)]) for s in range(a)] for i in range(m)]
    column_inside = [_inside(builder, cols, j, wide) for j in range(m)]
    for i in range(m):
        row_inside = _inside(builder, rows, i, tall)
        row_offsets = builder.add(offsets, lv.splat(builder, builder.mul(width_value, lv.INT32(i)), LANES))
        for j in range(m):
            value = builder.fadd(_combine(builder, at[j], down[i]), bias)
            value = lv.activate(builder, constants, value)
            indices = builder.add(row_offsets, _int_constant(j))
            _scatter(builder, value, y, indices, builder.and_(row_inside, column_inside[j]))


def _lanes_below(builder: ir.IRBuilder, count: ir.Value) -> ir.Value:
    """The lanes of a group of ``count`` tiles that hold one (the first ``count``, at most 16)."""
    return lv.lanes_inside(builder, lv.INT(0), LANES, count)


def _check_arrays(name: str, floats: tuple, ints: tuple) -> None:  # noqa: ANN001
    for array in floats:
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"{name} takes flat float32 arrays, not {array}")
    for array in ints:
        if not (isinstance(array, types.Array) and array.dtype == types.int32 and array.ndim == 1):
            raise TypingError(f"{name} takes flat int32 tables, not {array}")


@intrinsic
def _input_group(typingctx, x, x_start, table, padded, t0, height, width, v, v_start, v_step, count, m):  # noqa: ANN001, ANN202
    """Tiles ``t0 .. t0 + 15`` (``tile_table``, ``padded`` a row) of X's plane at ``x_start`` into V from
    ``v_start`` (its a*a elements ``v_step`` apart), the first ``count`` lanes stored; ``m`` (2 or 4)
    picks F(2,3) or F(4,3)."""
    _check_arrays("_input_group", (x, v), (table,))
    signature = types.void(x, x_start, table, padded, t0, height, width, v, v_start, v_step, count, m)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        x_p, table_p, v_p = (lv.array_data(context, builder, sig.args[i], args[i]) for i in (0, 2, 7))
        plane = builder.gep(x_p, [args[1]])
        group = _load_table(builder, table_p, args[3], args[4])
        limits = [args[5], args[6]]
        whole = builder.icmp_signed(">=", args[10], lv.INT(LANES))
        for edge in INPUT_MATRICES:
            with builder.if_then(builder.icmp_signed("==", args[11], lv.INT(edge))):
                with builder.if_else(whole) as (full, part):
                    with full:
                        _input_body(builder, edge, plane, group, limits, v_p, args[8], args[9], None)
                    with part:
                        mask = _lanes_below(builder, args[10])
                        _input_body(builder, edge, plane, group, limits, v_p, args[8], args[9], mask)
        return context.get_dummy_value()

    return signature, codegen


@intrinsic
def _output_group(typingctx, products, p_start, p_step, table, padded, t0, out_h, out_w, y, y_start, bias,  # noqa: ANN001, ANN202
                  bias_at, activation, count, m):  # fmt: skip
    """Tiles ``t0 .. t0 + 15`` of the products from ``p_start`` (a*a elements ``p_step`` apart) into Y's
    plane at ``y_start`` (``tile_table`` placing them), plus ``bias[bias_at]``, then the activation
    (slope, low, high)."""
    _check_arrays("_output_group", (products, y, bias, activation), (table,))
    signature = types.void(products, p_start, p_step, table, padded, t0, out_h, out_w, y, y_start, bias, bias_at,
                           activation, count, m)  # fmt: skip

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        data = [lv.array_data(context, builder, sig.args[i], args[i]) for i in (0, 3, 8, 10, 12)]
        products_p, table_p, y_p, bias_p, activation_p = data
        group = _load_table(builder, table_p, args[4], args[5])
        plane = builder.gep(y_p, [args[9]])
        bias_v = lv.broadcast(builder, lv.load_scalar(builder, bias_p, args[11]))
        constants = [lv.broadcast(builder, lv.load_scalar(builder, activation_p, lv.INT(i))) for i in range(3)]
        whole = builder.icmp_signed(">=", args[13], lv.INT(LANES))
        for edge in OUTPUT_MATRICES:
            with builder.if_then(builder.icmp_signed("==", args[14], lv.INT(edge))):
                with builder.if_else(whole) as (full, part):
                    with full:
                        _output_body(builder, edge, products_p, args[1], args[2], group, [args[6], args[7]], plane,
                                     bias_v, constants, None)  # fmt: skip
                    with part:
                        mask = _lanes_below(builder, args[13])
                        _output_body(builder, edge, products_p, args[1], args[2], group, [args[6], args[7]], plane,
                                     bias_v, constants, mask)  # fmt: skip
        return context.get_dummy_value()

    return signature, codegen


# -- the loops -----------------------------------------------------------------------------------------
@numba.njit(nogil=True, cache=True)
def input_channels(x, table, tiles, channels, height, width, v, first, last, m):  # noqa: ANN001, ANN201
    """V's rows for X's channels ``first .. last - 1``: ``x`` the flat X ``[N, C, H, W]`` (``channels``
    C), ``table`` its ``tile_table`` of ``tiles`` tiles, ``v`` the flat ``V [a*a, C, T]``."""
    padded = table.size // 3
    step = channels * tiles
    plane = height * width
    for channel in range(first, last):
        for t0 in range(0, tiles, LANES):
            _input_group(x, channel * plane, table, padded, t0, height, width, v, channel * tiles + t0, step,
                         tiles - t0, m)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def output_kernels(products, table, tiles, kernels, out_h, out_w, y, bias, activation, first, last, m):  # noqa: ANN001, ANN201
    """Y's planes of kernels ``first .. last - 1`` (of ``kernels``; every image, placed by ``table``, the
    ``tile_table`` of ``tiles`` tiles in the flat ``y``) from the flat ``products [a*a, K, T]``."""
    padded = table.size // 3
    step = kernels * tiles
    plane = out_h * out_w
    for kernel in range(first, last):
        for t0 in range(0, tiles, LANES):
            _output_group(products, kernel * tiles + t0, step, table, padded, t0, out_h, out_w, y, kernel * plane,
                          bias, kernel, activation, tiles - t0, m)  # fmt: skip


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of an input job's block: X, the table, V (flat: 2 slots each), then tiles, channels, H, W, m.
_INPUT_SLOTS = 6 + 5
#: Slots of an output job's block: the products, the table, Y, the bias, the activation (flat), then
#: tiles, kernels, OH, OW, m.
_OUTPUT_SLOTS = 10 + 5


def _input_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of X's channels through ``input_channels``."""
    x, table, v = float32_1d(args, 0), int32_1d(args, 2), float32_1d(args, 4)
    tiles, channels, height, width, m = args[6], args[7], args[8], args[9], args[10]
    input_channels(x, table, tiles, channels, height, width, v, channels * chunk // chunks,
                   channels * (chunk + 1) // chunks, m)  # fmt: skip


def _output_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of Y's kernels through ``output_kernels``."""
    products, table, y = float32_1d(args, 0), int32_1d(args, 2), float32_1d(args, 4)
    bias, activation = float32_1d(args, 6), float32_1d(args, 8)
    tiles, kernels, out_h, out_w, m = args[10], args[11], args[12], args[13], args[14]
    output_kernels(products, table, tiles, kernels, out_h, out_w, y, bias, activation, kernels * chunk // chunks,
                   kernels * (chunk + 1) // chunks, m)  # fmt: skip


@functools.cache
def job_addresses() -> tuple[int, int]:
    """The spin-pool addresses of the input and the output transform's jobs."""
    return spin_pool.job(_input_job), spin_pool.job(_output_job)


def applies(dtype: np.dtype) -> bool:
    """Whether the transforms run here: float32, on a CPU with AVX-512's 16-lane gathers (elsewhere
    ``jit_winograd``'s loops do)."""
    return np.dtype(dtype) == np.float32 and _x86_gathers()


def _shares(planes: int, per_plane: int, arrays: tuple[np.ndarray, ...]) -> tuple[SpinPool | None, int]:
    """(the spinning run's pool or None, the shares) of a transform over ``planes`` channels (kernels, on
    the way out), split as a spinning run splits its per-plane loops."""
    found = spin_split(planes, per_plane, arrays)
    return (None, 1) if found is None else found


def _edge(elements: int) -> int:
    """The output tile edge m of a transform over a*a elements (a = m + 2)."""
    return int(round(elements**0.5)) - 2


def _input_arrays(
    x: np.ndarray, m: int, pads: tuple[int, int], tiles: tuple[int, int], v: np.ndarray
) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]]:
    """An input pass's arrays (X, its tile table, V; flat) and numbers (tiles, channels, H, W, m)."""
    batch, channels, height, width = x.shape
    table = tile_table(batch, tiles, m, (-pads[0], -pads[1]), width, channels * height * width)
    return (x.reshape(-1), table, v.reshape(-1)), (batch * tiles[0] * tiles[1], channels, height, width, m)


def input_job(x: np.ndarray, m: int, pads: tuple[int, int], tiles: tuple[int, int], v: np.ndarray) -> Job:
    """``V [a*a, C, T]`` = ``B^T d B`` of every tile of the C-contiguous float32 ``x [N, C, H, W]`` (tile
    (n, i, j) from padded row ``i*m``, column ``j*m``; ``pads`` = (top, left)) as a spin-pool job, in
    ranges of channels as a spinning run splits it (one without)."""
    arrays, numbers = _input_arrays(x, m, pads, tiles, v)
    shares = _shares(numbers[1], numbers[0] * (m + 2) ** 2, (x, v))[1]
    return Job(job_addresses()[0], argument_block(_INPUT_SLOTS, arrays, numbers), shares, arrays)


def input_transform(x: np.ndarray, m: int, pads: tuple[int, int], tiles: tuple[int, int], v: np.ndarray) -> None:
    """``input_job``'s transform, now: on a spinning run's pool, else over the kernel threads."""
    arrays, numbers = _input_arrays(x, m, pads, tiles, v)
    count, channels, height, width, _ = numbers
    per_channel = count * (m + 2) ** 2
    pool, shares = _shares(channels, per_channel, (x, v))
    if pool is not None:
        Job(job_addresses()[0], argument_block(_INPUT_SLOTS, arrays, numbers), shares, arrays).run(pool)
        return
    flat_x, table, flat_v = arrays

    def run(first: int, last: int) -> None:
        input_channels(flat_x, table, count, channels, height, width, flat_v, first, last, m)

    parallel_planes(run, channels, per_channel)


def _output_arrays(
    products: np.ndarray, bias: np.ndarray, flat: tuple[np.ndarray, int], shape: tuple[int, ...],
    tiles: tuple[int, int], fused: FusedActivation | None,
) -> tuple[tuple[np.ndarray, ...], tuple[int, ...]] | None:  # fmt: skip
    """An output pass's arrays (products, table, Y, bias, activation) and numbers (tiles, kernels, OH,
    OW, m); None for an activation the store does not apply."""
    code, alpha, beta = activation_code(fused)
    if code == NO_ACTIVATION and fused is not None:
        return None
    batch, kernels, out_h, out_w = (int(n) for n in shape)
    m = _edge(products.shape[0])
    table = tile_table(batch, tiles, m, (0, 0), out_w, flat[1])
    activation = activation_constants(code, alpha, beta)
    arrays = (products.reshape(-1), table, flat[0], np.ascontiguousarray(bias, np.float32), activation)
    return arrays, (batch * tiles[0] * tiles[1], kernels, out_h, out_w, m)


def output_job(products: np.ndarray, bias: np.ndarray, flat: tuple[np.ndarray, int], shape: tuple[int, ...],
               tiles: tuple[int, int], fused: FusedActivation | None) -> Job | None:  # fmt: skip
    """Y = ``A^T M A`` + bias of every tile of the float32 ``products [a*a, K, T]``, then ``fused``, into
    Y of ``shape`` (N, K, OH, OW) lying in the flat ``flat[0]`` with its images ``flat[1]`` elements
    apart (``buffers.flat_images``: a Concat's slice), tiles past OH/OW cropped; a spin-pool job in
    ranges of kernels. None when the activation is one the store does not apply (Relu, Clip,
    LeakyRelu and none are)."""
    found = _output_arrays(products, bias, flat, shape, tiles, fused)
    if found is None:
        return None
    arrays, numbers = found
    shares = _shares(numbers[1], int(shape[0]) * numbers[2] * numbers[3], arrays[:1] + arrays[2:4])[1]
    return Job(job_addresses()[1], argument_block(_OUTPUT_SLOTS, arrays, numbers), shares, arrays)


def output_transform(products: np.ndarray, bias: np.ndarray, flat: tuple[np.ndarray, int], shape: tuple[int, ...],
                     tiles: tuple[int, int], fused: FusedActivation | None) -> bool:  # fmt: skip
    """``output_job``'s transform, now (on a spinning run's pool, else over the kernel threads); False,
    with nothing done, where ``output_job`` gives None."""
    found = _output_arrays(products, bias, flat, shape, tiles, fused)
    if found is None:
        return False
    arrays, numbers = found
    per_kernel = int(shape[0]) * numbers[2] * numbers[3]
    pool, shares = _shares(numbers[1], per_kernel, arrays[:1] + arrays[2:4])
    if pool is not None:
        Job(job_addresses()[1], argument_block(_OUTPUT_SLOTS, arrays, numbers), shares, arrays).run(pool)
        return True
    flat_products, table, y, bias32, activation = arrays
    tile_count, kernels, out_h, out_w, m = numbers

    def run(first: int, last: int) -> None:
        output_kernels(flat_products, table, tile_count, kernels, out_h, out_w, y, bias32, activation, first, last, m)

    parallel_planes(run, kernels, per_kernel)
    return True
