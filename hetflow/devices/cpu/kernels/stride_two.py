"""One input row read for 16 windows at column stride 2, in LLVM IR: each window column's 16 taps from
three loads and a few shuffles, shared by the kernels that sweep such windows (the depthwise Conv and the
pools of ``row_sweep``, the 3x3/2 pools of ``jit_pool_strided``, the stems of ``jit_direct_stems``).

Output lane k's window starts at column ``first + 2k``, so window column j reads columns ``first + 2k +
j``: the even (j even) or odd lanes of the row's 48 floats from ``first``, shifted by j // 2 lanes. The
48 floats are three plain loads wherever they lie inside the flat array (masked loads only at its ends),
and the columns outside the row take the op's padding value after the shuffles, under masks worked out
once per strip of 16 outputs (``column_masks``). Why not one masked 32-float load per window column: on
Zen 4 those need two mask registers each, LLVM worked the masks out again before every load for want of
registers, and a load behind a mask worked out just before it costs twice a plain one (s57); the
depthwise 3x3/2 sweep spent 36 cycles a vector of outputs on one core, 2.2 us a 112x112 plane.
"""

from __future__ import annotations

from llvmlite import ir

from hetflow.devices.cpu.kernels import llvm_vectors as lv

LANES = lv.LANES
#: Floats loaded per row: enough for window columns up to ``MAX_TAPS - 1`` at 16 outputs.
LOADED = 3 * LANES
#: The widest window whose columns a row's loads cover.
MAX_TAPS = LOADED - 2 * (LANES - 1)
_INT32 = ir.IntType(32)
_EVEN = ir.Constant(ir.VectorType(_INT32, LANES), list(range(0, 2 * LANES, 2)))
_ODD = ir.Constant(ir.VectorType(_INT32, LANES), list(range(1, 2 * LANES, 2)))


def column_masks(builder: ir.IRBuilder, first: ir.Value, width: ir.Value, taps: int) -> list[ir.Value]:
    """Per window column j < ``taps``, the 16-lane mask of ``0 <= first + 2k + j < width``."""
    start = lv.splat(builder, builder.trunc(first, _INT32), LANES)
    limit = lv.splat(builder, builder.trunc(width, _INT32), LANES)
    masks = []
    for j in range(taps):
        lanes = ir.Constant(ir.VectorType(_INT32, LANES), [2 * lane + j for lane in range(LANES)])
        masks.append(builder.icmp_unsigned("<", builder.add(start, lanes), limit))
    return masks


def load_row(
    builder: ir.IRBuilder, data: ir.Value, size: ir.Value, row_at: ir.Value, first: ir.Value, width: ir.Value,
    fill: ir.Value, valid: ir.Value | None = None,
) -> tuple[ir.Value, ir.Value, ir.Value]:  # fmt: skip
    """The ``LOADED`` floats from column ``first`` of the row at ``row_at`` of the flat array at ``data``
    (``size`` floats; the row ``width`` long), as three vectors: plain loads where they lie in the array
    (and, given ``valid``, the row is read at all), else masked loads of the row's own columns (``fill``
    elsewhere; every lane ``fill`` where not ``valid``)."""
    start = builder.add(row_at, first)
    inside = builder.and_(
        builder.icmp_signed(">=", start, lv.INT(0)), builder.icmp_signed("<=", builder.add(start, lv.INT(LOADED)), size)
    )
    if valid is not None:
        inside = builder.and_(valid, inside)
    loads: list[tuple[list[ir.Value], ir.Block]] = []
    with builder.if_else(inside, likely=True) as (plain, masked):
        with plain:
            parts = [lv.load_vector(builder, data, builder.add(start, lv.INT(p * LANES))) for p in range(3)]
            loads.append((parts, builder.block))
        with masked:
            parts = []
            for p in range(3):
                column = builder.add(first, lv.INT(p * LANES))
                mask = lv.lanes_inside(builder, column, LANES, width)
                if valid is not None:
                    mask = builder.and_(mask, lv.splat(builder, valid, LANES))
                parts.append(lv.masked_load(builder, data, builder.add(row_at, column), mask, fill))
            loads.append((parts, builder.block))
    joined = []
    for p in range(3):
        value = builder.phi(lv.VECTOR)
        for parts, block in loads:
            value.add_incoming(parts[p], block)
        joined.append(value)
    return joined[0], joined[1], joined[2]


class WindowColumns:
    """The window columns of a row ``load_row`` read: ``column(j)`` is lanes ``2k + j`` of its floats, each
    made where it is asked for (a kernel asks just before the FMAs that use it: LLVM keeps the order, and
    making every column first cost the depthwise sweep 1.3-2x at stride 1, for want of mask registers)."""

    def __init__(self, builder: ir.IRBuilder, row: tuple[ir.Value, ir.Value, ir.Value]):
        low, high, rest = row
        self.builder = builder
        self.halves = (builder.shuffle_vector(low, high, _EVEN), builder.shuffle_vector(low, high, _ODD))
        self.beyond = (builder.shuffle_vector(rest, rest, _EVEN), builder.shuffle_vector(rest, rest, _ODD))

    def column(self, j: int) -> ir.Value:
        assert j < MAX_TAPS
        shift, parity = divmod(j, 2)
        if shift == 0:
            return self.halves[parity]
        order = ir.Constant(ir.VectorType(_INT32, LANES), list(range(shift, shift + LANES)))
        return self.builder.shuffle_vector(self.halves[parity], self.beyond[parity], order)


def window_columns(builder: ir.IRBuilder, row: tuple[ir.Value, ir.Value, ir.Value], taps: int) -> list[ir.Value]:
    """Window columns 0 .. ``taps`` - 1 of a row ``load_row`` read, made at once (``WindowColumns``)."""
    columns = WindowColumns(builder, row)
    return [columns.column(j) for j in range(taps)]
