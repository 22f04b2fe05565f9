"""Pieces of LLVM IR for the 16-lane float32 kernels written as numba intrinsics (``jit_direct``,
``jit_direct_grad``): array pointers, vector loads, broadcasts, FMAs and register accumulators.

Why IR: numba's own loops over 16 lanes stay scalar, and a block unrolled in Python-level numba code
spilled its accumulators; in IR the block's accumulators are stack slots that LLVM promotes to
registers carried through the reduction's loops.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

#: float32 lanes of a 512-bit register (where the CPU lacks AVX-512, LLVM splits each operation in two).
LANES = 16
#: float32s per 64-byte cache line (what ``prefetch`` asks for).
LINE_FLOATS = 16

FLOAT = ir.FloatType()
VECTOR = ir.VectorType(FLOAT, LANES)
INT = ir.IntType(64)

_LANE0 = ir.Constant(ir.IntType(32), 0)
_SPLAT = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)
_UNDEFINED = ir.Constant(VECTOR, ir.Undefined)
_ZERO = ir.Constant(VECTOR, [0.0] * LANES)


def array_data(context: Any, builder: ir.IRBuilder, array_type: Any, array: Any) -> ir.Value:
    """The data pointer of a numba array argument."""
    return context.make_array(array_type)(context, builder, array).data


def array_size(context: Any, builder: ir.IRBuilder, array_type: Any, array: Any) -> ir.Value:
    """The element count of a numba array argument (int64)."""
    return context.make_array(array_type)(context, builder, array).nitems


def vector_pointer(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value) -> ir.Value:
    """``base + offset`` (floats) as a pointer to a vector."""
    return builder.bitcast(builder.gep(base, [offset]), VECTOR.as_pointer())


def load_vector(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value) -> ir.Value:
    """The 16 floats at ``base + offset`` (no alignment assumed beyond a float's)."""
    return builder.load(vector_pointer(builder, base, offset), align=4)


def load_scalar(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value) -> ir.Value:
    """The element at ``base + offset``."""
    return builder.load(builder.gep(base, [offset]))


#: ``prefetch`` localities: into L2 (``prefetcht1`` on x86), or into L1 as well (``prefetcht0``).
INTO_L2, INTO_L1 = 2, 3


def prefetch(
    builder: ir.IRBuilder, base: ir.Value, offset: ir.Value, locality: int = INTO_L2, write: bool = False
) -> None:
    """Ask for the cache line holding ``base + offset`` (floats) to be read into L2, or with ``INTO_L1``
    into L1 too, ``write``: to be written (``llvm.prefetch``: never faults, so the address may lie past
    the array)."""
    function = builder.module.declare_intrinsic(
        "llvm.prefetch.p0", fnty=ir.FunctionType(ir.VoidType(), [ir.PointerType(), INT32, INT32, INT32])
    )
    builder.call(function, [builder.gep(base, [offset]), INT32(int(write)), INT32(locality), INT32(1)])  # data


@intrinsic
def prefetch_line(typingctx, x, index):  # noqa: ANN001, ANN202
    """From compiled (numba) code: ``prefetch`` the cache line of the flat float32 ``x`` holding
    ``index``."""
    if not (isinstance(x, types.Array) and x.dtype == types.float32 and x.ndim == 1):
        raise TypingError(f"prefetch_line takes a flat float32 array, not {x}")

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        prefetch(builder, array_data(context, builder, sig.args[0], args[0]), args[1])
        return context.get_dummy_value()

    return types.void(x, types.int64), codegen


def broadcast(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A vector of 16 copies of the float ``value`` (LLVM folds the load into the FMA's operand)."""
    return builder.shuffle_vector(builder.insert_element(_UNDEFINED, value, _LANE0), _UNDEFINED, _SPLAT)


def fused_multiply_add(builder: ir.IRBuilder) -> ir.Function:
    """LLVM's ``fma`` on vectors: ``f(a, b, c) = a * b + c`` lane by lane, one rounding."""
    return builder.module.declare_intrinsic("llvm.fma.v16f32", fnty=ir.FunctionType(VECTOR, [VECTOR] * 3))


def accumulators(builder: ir.IRBuilder, rows: int, columns: int) -> list[list[ir.Value]]:
    """``rows`` x ``columns`` zeroed vector stack slots, promoted by LLVM to registers."""
    slots = [[cgutils.alloca_once(builder, VECTOR) for _ in range(columns)] for _ in range(rows)]
    for row in slots:
        for slot in row:
            builder.store(_ZERO, slot)
    return slots


def load_vectors(builder: ir.IRBuilder, base: ir.Value, offset: ir.Value, count: int) -> list[ir.Value]:
    """``count`` consecutive vectors from ``base + offset``."""
    return [load_vector(builder, base, builder.add(offset, INT(v * LANES))) for v in range(count)]


def multiply_add_broadcast(
    builder: ir.IRBuilder, fma: ir.Function, vectors: list[ir.Value], scalar: ir.Value, slots: list[ir.Value]
) -> None:
    """``slots[v] += vectors[v] * scalar`` for every v: one broadcast, one FMA per vector."""
    values = broadcast(builder, scalar)
    for vector, slot in zip(vectors, slots, strict=True):
        builder.store(builder.call(fma, [vector, values, builder.load(slot)]), slot)


def store_accumulators(
    builder: ir.IRBuilder, rows: list[list[ir.Value]], base: ir.Value, start: ir.Value, row_stride: ir.Value,
    add: bool = False,
) -> None:  # fmt: skip
    """Row r, vector v of ``rows`` to ``base + start + r*row_stride + v*16`` (added to what is there when
    ``add``)."""
    for r, row in enumerate(rows):
        row_start = builder.add(start, builder.mul(row_stride, INT(r)))
        for v, slot in enumerate(row):
            pointer = vector_pointer(builder, base, builder.add(row_start, INT(v * LANES)))
            total = builder.load(slot)
            if add:
                total = builder.fadd(builder.load(pointer, align=4), total)
            builder.store(total, pointer, align=4)


# Masked lanes (the pools' kernel, ``jit_pool_lanes``): vectors of any length n (<n x float>), whose lanes
# outside a row or a map are never read or written. LLVM splits a vector longer than a register.

INT32 = ir.IntType(32)


def float_vector(count: int, value: float) -> ir.Constant:
    """``count`` lanes of the float ``value``."""
    return ir.Constant(ir.VectorType(FLOAT, count), [value] * count)


def splat(builder: ir.IRBuilder, value: ir.Value, count: int = LANES) -> ir.Value:
    """A vector of ``count`` copies of the scalar ``value`` (any element type)."""
    vector = ir.VectorType(value.type, count)
    undefined = ir.Constant(vector, ir.Undefined)
    first = builder.insert_element(undefined, value, _LANE0)
    return builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(INT32, count), [0] * count))


def clamp(builder: ir.IRBuilder, value: ir.Value, low: ir.Value, high: ir.Value) -> ir.Value:
    """``min(max(value, low), high)`` lane by lane, NaN kept (as numpy's clip)."""
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    return builder.select(builder.fcmp_ordered(">", value, high), high, value)


def lanes_inside(builder: ir.IRBuilder, start: ir.Value, count: int, limit: ir.Value) -> ir.Value:
    """The ``count``-lane mask of ``0 <= start + lane < limit`` (``start`` and ``limit`` int64, within
    int32: one unsigned compare, a negative sum wrapping past any limit)."""
    lanes = ir.Constant(ir.VectorType(INT32, count), list(range(count)))
    first = splat(builder, builder.trunc(start, INT32), count)
    bound = splat(builder, builder.trunc(limit, INT32), count)
    return builder.icmp_unsigned("<", builder.add(first, lanes), bound)


def masked_load(
    builder: ir.IRBuilder, base: ir.Value, offset: ir.Value, mask: ir.Value, fill: ir.Value
) -> ir.Value:
    """The floats at ``base + offset`` where ``mask`` is set, ``fill``'s lanes elsewhere (those addresses
    are never read: they may lie outside the array)."""
    vector = fill.type
    function = builder.module.declare_intrinsic(
        f"llvm.masked.load.v{vector.count}f32.p0",
        fnty=ir.FunctionType(vector, [ir.PointerType(), INT32, mask.type, vector]),
    )
    return builder.call(function, [builder.gep(base, [offset]), INT32(4), mask, fill])


def masked_store(
    builder: ir.IRBuilder, value: ir.Value, base: ir.Value, offset: ir.Value, mask: ir.Value
) -> None:
    """``value``'s lanes where ``mask`` is set to ``base + offset + lane`` (the others are never written)."""
    function = builder.module.declare_intrinsic(
        f"llvm.masked.store.v{value.type.count}f32.p0",
        fnty=ir.FunctionType(ir.VoidType(), [value.type, ir.PointerType(), INT32, mask.type]),
    )
    builder.call(function, [value, builder.gep(base, [offset]), INT32(4), mask])


def load_lanes(
    builder: ir.IRBuilder, base: ir.Value, offset: ir.Value, mask: ir.Value | None, fill: ir.Value
) -> ir.Value:
    """The vector at ``base + offset``: whole where ``mask`` is None, else ``masked_load``'s."""
    if mask is None:
        return load_vector(builder, base, offset)
    return masked_load(builder, base, offset, mask, fill)


def store_lanes(builder: ir.IRBuilder, value: ir.Value, base: ir.Value, offset: ir.Value, mask: ir.Value | None) -> None:
    """``value`` to ``base + offset``: whole where ``mask`` is None, else ``masked_store``'s lanes."""
    if mask is None:
        builder.store(value, vector_pointer(builder, base, offset), align=4)
    else:
        masked_store(builder, value, base, offset, mask)


def concatenate(builder: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """One vector of ``vectors`` (all of one length, a power of two of them) end to end."""
    while len(vectors) > 1:
        count = vectors[0].type.count
        order = ir.Constant(ir.VectorType(INT32, 2 * count), list(range(2 * count)))
        vectors = [
            builder.shuffle_vector(a, b, order) for a, b in zip(vectors[::2], vectors[1::2], strict=True)
        ]
    return vectors[0]


def every_other(builder: ir.IRBuilder, vector: ir.Value) -> ir.Value:
    """Lanes 0, 2, 4, ... of ``vector`` (half as many)."""
    count = vector.type.count // 2
    return builder.shuffle_vector(
        vector, vector, ir.Constant(ir.VectorType(INT32, count), list(range(0, 2 * count, 2)))
    )


def activate(builder: ir.IRBuilder, constants: list[ir.Value], value: ir.Value) -> ir.Value:
    """min(max(v < 0 ? v * slope : v, low), high) of a 16-lane ``value``, with ``constants`` (slope, low,
    high) broadcast (``jit_depthwise_lanes.activation_constants``: Relu, Clip, LeakyRelu or none); NaN
    stays."""
    slope, low, high = constants
    zero = float_vector(LANES, 0.0)
    value = builder.select(builder.fcmp_ordered("<", value, zero), builder.fmul(value, slope), value)
    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
    return builder.select(builder.fcmp_ordered(">", value, high), high, value)
