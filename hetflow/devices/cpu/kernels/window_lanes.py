"""The vector layout and the window walk shared by the 16-lane 2-D window kernels written in LLVM IR: the
pools (``jit_pool_lanes``) and the depthwise Conv (``jit_depthwise_lanes``).

Layout: one vector holds 16 outputs of one row (rows longer than 8 outputs, in chunks of 16), or two
whole rows of up to 8 outputs, or four of up to 4 (``rows_per_vector``: an 8x8 or 4x4 output would
leave half or three quarters of the lanes idle). Per window tap and output row in the vector, one
masked load of the input row's columns (twice as many at column stride 2, the even ones kept by a
shuffle); lanes whose column or row lies in the padding are never read and take the padding value. A
block of up to ``PLANE_BLOCK`` planes shares the loads' masks and offsets, and its accumulators are
independent chains.

Nothing is copied: each tap is read straight from the flat X, so the kernels need no scratch. An X past
the cache has the rows below a block's vectors prefetched as it goes (``prefetch_rows_below``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
from llvmlite import ir
from numba.core import cgutils

from hetflow.devices.cpu.kernels import llvm_vectors as lv

LANES = lv.LANES
#: Planes accumulated together (each with its own accumulators). One core, 1 / 4 / 8 planes: 3x3/2 max
#: pool on 32x32x32 14.9 / 9.4 / 8.0 us, 3x3/1 max pool on 480x28x28 514 / 305 / 237 us.
PLANE_BLOCK = 8
#: Column strides the kernels read (a stride-2 tap is the even lanes of twice as many floats).
STRIDES = (1, 2)


#: X's floats from which a block of planes prefetches the rows its next vectors read
#: (``prefetch_rows_below``): past half the 32 MiB L3, X streams from memory, and a block's rows are more
#: streams than the hardware prefetcher follows. Two threads, batch 16, minimums: 3x3/2 max pool on
#: 192x56x56 (38 MB) 2.2 -> 1.1 ms, on 128x55x55 0.93 -> 0.71. Maps in cache gain nothing, and prefetches
#: issued inside the vectors' IR (where this flag could not be a constant) cost them up to 40%.
PREFETCH_MIN_FLOATS = 4 << 20


@numba.njit(nogil=True, cache=True, inline="always")
def prefetch_rows_below(flat_x, plane_start, planes, plane_step, top, segments, rows, kh, sh, dh, height, width):  # noqa: ANN001, ANN201, E501
    """Prefetch, for ``planes`` planes ``plane_step`` floats apart from ``plane_start``, the rows of X that
    the vectors of output rows below this block's read first: the ``rows * sh`` rows under the last window
    row of the block's ``segments`` output rows (``row_taps``' ``top``; those inside the map)."""
    bottom = top + (segments - 1) * sh + (kh - 1) * dh
    for row in range(max(bottom + 1, 0), min(bottom + 1 + rows * sh, height)):
        for plane in range(planes):
            start = plane_start + plane * plane_step + row * width
            for column in range(0, width, lv.LINE_FLOATS):
                lv.prefetch_line(flat_x, start + column)


@numba.njit(nogil=True, cache=True)
def rows_per_vector(out_w):  # noqa: ANN001, ANN201
    """Output rows one 16-lane vector holds: 4 rows of up to 4 outputs, 2 of up to 8, else 1."""
    return 4 if out_w <= LANES // 4 else 2 if out_w <= LANES // 2 else 1


@numba.njit(nogil=True, cache=True, inline="always")
def row_taps(oy, rows, out_h, kh, sh, dh, pad_top, height):  # noqa: ANN001, ANN201
    """(segments, top, first_tap, last_tap) of the vectors whose first output row is ``oy``: the output
    rows they hold, the input row of the first one's tap 0, and the window rows that lie in X for some
    of their output rows: from the last row's first to the first row's last (the rows in between are
    masked per output row)."""
    segments = min(rows, out_h - oy)
    top = oy * sh - pad_top
    bottom = top + (segments - 1) * sh
    first_tap = 0 if bottom >= 0 else (dh - 1 - bottom) // dh
    last_tap = kh if top + (kh - 1) * dh < height else max(0, (height - 1 - top) // dh + 1)
    return segments, top, first_tap, last_tap


@dataclass(frozen=True)
class VectorShape:
    """How a compiled body lays out its vector of outputs: fixed in the IR."""

    rows: int  # output rows per vector (rows_per_vector)
    stride: int  # column stride

    @property
    def piece(self) -> int:
        """Floats loaded per tap and output row."""
        return self.stride * LANES // self.rows


@dataclass
class Window:
    """IR values: where one vector of outputs reads its window in the flat X ``x``.

    Output row s < ``segments`` of the vector reads window row i (``first_tap`` <= i < ``last_tap``) from
    X's row ``top + s*row_step + i*dh`` and window column j < ``kw`` from X's columns ``col_start + j*dw +
    stride*lane`` (X's maps ``height`` x ``width``).
    """

    x: Any
    top: Any
    row_step: Any
    segments: Any
    height: Any
    width: Any
    first_tap: Any
    last_tap: Any
    kw: Any
    dh: Any
    dw: Any
    col_start: Any


@dataclass
class Outputs:
    """IR values: where one vector of outputs goes in the flat Y ``y``: output row s of the vector keeps
    its first ``count`` lanes at ``y_start + s*y_row``, plane p ``p*y_plane`` further on."""

    y: Any
    y_start: Any
    y_plane: Any
    y_row: Any
    count: Any


def plane_starts(
    builder: ir.IRBuilder, x_start: ir.Value, planes: ir.Value, plane_step: ir.Value
) -> list[ir.Value]:
    """X's offsets of the block's ``PLANE_BLOCK`` planes, ``plane_step`` apart from ``x_start`` (slots past
    ``planes`` repeat the last plane: computed again, never stored)."""
    return [
        builder.add(x_start, builder.mul(clamped_plane(builder, plane, planes), plane_step))
        for plane in range(PLANE_BLOCK)
    ]


def clamped_plane(builder: ir.IRBuilder, plane: int, planes: ir.Value) -> ir.Value:
    """``plane``, or the block's last plane where the block holds fewer."""
    return builder.select(
        builder.icmp_signed("<", lv.INT(plane), planes), lv.INT(plane), builder.sub(planes, lv.INT(1))
    )


def slot(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A stack slot holding ``value`` (LLVM keeps it in a register)."""
    place = cgutils.alloca_once(builder, value.type)
    builder.store(value, place)
    return place


def walk_taps(
    builder: ir.IRBuilder, shape: VectorShape, window: Window, starts: list[ir.Value], pad: float,
    visit: Callable[[int, ir.Value, ir.Value, ir.Value], None],
) -> None:  # fmt: skip
    """For every window tap (column tap j, row tap i) and plane of the block: ``visit(plane, values, i,
    j)`` with ``values`` the 16 lanes the plane's outputs read at that tap (``pad`` where they lie in the
    padding)."""
    fill = lv.float_vector(shape.piece, pad)
    no_lanes = ir.Constant(ir.VectorType(ir.IntType(1), shape.piece), [0] * shape.piece)
    with cgutils.for_range(builder, window.kw) as column_tap:
        column = builder.add(window.col_start, builder.mul(column_tap.index, window.dw))
        inside = lv.lanes_inside(builder, column, shape.piece, window.width)
        with cgutils.for_range_slice(builder, window.first_tap, window.last_tap, lv.INT(1)) as (row_tap, _):
            offsets, masks = [], []
            for segment in range(shape.rows):
                row = builder.add(
                    builder.add(window.top, builder.mul(lv.INT(segment), window.row_step)),
                    builder.mul(row_tap, window.dh),
                )
                if shape.rows == 1:
                    masks.append(inside)  # the taps' rows all lie in X
                else:
                    read = builder.and_(
                        builder.icmp_unsigned("<", row, window.height),
                        builder.icmp_signed("<", lv.INT(segment), window.segments),
                    )
                    masks.append(builder.select(read, inside, no_lanes))
                offsets.append(builder.add(builder.mul(row, window.width), column))
            for plane, start in enumerate(starts):
                pieces = [
                    lv.masked_load(builder, window.x, builder.add(start, offset), mask, fill)
                    for offset, mask in zip(offsets, masks, strict=True)
                ]
                values = lv.concatenate(builder, pieces)
                if shape.stride == 2:
                    values = lv.every_other(builder, values)
                visit(plane, values, row_tap, column_tap.index)


def row_masks(
    builder: ir.IRBuilder, rows: int, segments: ir.Value, outputs: Outputs
) -> tuple[list[ir.Value], list[ir.Value]]:
    """Per output row of the vector (``segments`` of its ``rows`` hold one): the mask of its kept lanes, and the offset from ``y_start`` of the
    vector's lane 0 as that row stores it (lane s*16/rows of the vector lands on Y's row s)."""
    group = LANES // rows
    masks, shifts = [], []
    for segment in range(rows):
        lanes = lv.lanes_inside(builder, lv.INT(-segment * group), LANES, outputs.count)
        alive = builder.icmp_signed("<", lv.INT(segment), segments)
        masks.append(builder.select(alive, lanes, ir.Constant(lanes.type, [0] * LANES)))
        shifts.append(builder.sub(builder.mul(lv.INT(segment), outputs.y_row), lv.INT(segment * group)))
    return masks, shifts


def store_planes(
    builder: ir.IRBuilder, outputs: Outputs, planes: ir.Value, masks: list[ir.Value], shifts: list[ir.Value],
    values: list[ir.Value],
) -> None:  # fmt: skip
    """Plane p's ``values[p]`` into Y, for the block's ``planes`` planes: one masked store per output row."""
    for plane, value in enumerate(values):
        with builder.if_then(builder.icmp_signed("<", lv.INT(plane), planes)):
            start = builder.add(outputs.y_start, builder.mul(lv.INT(plane), outputs.y_plane))
            for mask, shift in zip(masks, shifts, strict=True):
                lv.masked_store(builder, value, outputs.y, builder.add(start, shift), mask)
