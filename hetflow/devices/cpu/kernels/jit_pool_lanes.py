"""The float32 2-D pools of ``jit_pool`` with column strides 1 and 2, over 16-lane vectors of outputs.

Why: the phase-plane loop (``jit_pool._planes``) copies each input plane into its phases first, a
strided gather that ran scalar, and on small maps its rows are too short for numba's vector loops.
cifar10-quick at batch 1, one core: 3x3/2 max on 32x32x32 spent 17 of its 32 us copying. Here nothing
is copied: each window tap is read straight from X by masked vector loads (LLVM IR, as ``jit_direct``),
and no scratch is needed.

Layout: one vector holds 16 outputs of one row (rows longer than 8 outputs, in chunks of 16), or two
whole rows of up to 8 outputs, or four of up to 4 (``rows_per_vector``: an 8x8 or 4x4 output would
leave half or three quarters of the lanes idle). Per window tap and output row in the vector, one
masked load of the input row's columns (twice as many at stride 2, the even ones kept by a shuffle);
lanes whose column or row lies in the padding are never read and take the padding value (-inf for a
maximum, 0 for a sum). A block of up to ``PLANE_BLOCK`` planes shares the loads' masks and offsets,
and its accumulators are independent chains (a plane alone waits on each tap's max before the next).

Max: NaN propagates as with np.maximum. The accumulator keeps the larger value (x86's maxps, which
skips a NaN tap), and a second accumulator sums max(0, tap): NaN exactly when some tap is NaN (no -inf
in that sum, so no inf - inf), turning the result into NaN at the end. That sum costs a fifth of a small
map's time (3x3/2 on 32x32x32, one core: 6.9 us without it, 8.4 with) and nothing measurable on large
ones. Padding never wins: it is -inf. Average: the sum times ``scale`` (the reciprocal window counts).

The bodies for every vector shape, stride and reduction (``_VARIANTS``) are compiled into one function,
about 3 s once per machine (cached on disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.threads import split_planes, split_ranges
from hetflow.ops.spatial import Geometry

LANES = lv.LANES
#: Planes pooled together (each with its own accumulators: 16 registers for a max). One core, 1 / 4 / 8
#: planes: 3x3/2 max on 32x32x32 14.9 / 9.4 / 8.0 us, 3x3/1 max on 480x28x28 514 / 305 / 237 us.
PLANE_BLOCK = 8
#: Column strides the kernel reads (a stride-2 tap is the even lanes of twice as many floats).
STRIDES = (1, 2)


def applies(geo: Geometry, dtype: np.dtype) -> bool:
    """Whether this kernel pools ``geo``'s windows over an X of ``dtype``: float32, column stride 1 or 2
    (any window, row stride, dilation and padding)."""
    return dtype == _FLOAT32 and geo.axes[1].stride in STRIDES


_FLOAT32 = np.dtype(np.float32)  # NOTE: a dtype compared with np.float32 itself costs ~0.3 us


def pool(
    x: np.ndarray, y: np.ndarray, image_stride: int, out: tuple[int, int], window: tuple[int, ...],
    is_max: bool, scale: np.ndarray,
) -> None:  # fmt: skip
    """``jit_pool.pool_2d`` on float32 ``x`` into the flat Y ``y`` (``buffers.flat_images``: images
    ``image_stride`` apart) of ``out`` (OH, OW), ``window`` (kh, kw, sh, sw, dh, dw, pad_top, pad_left):
    the maximum, or the sum times ``scale`` [OH, OW]."""
    head = (x, y, image_stride, *out)
    tail = (*window, is_max, scale)
    planes, per_plane = x.shape[0] * x.shape[1], out[0] * out[1]
    if split_ranges(planes, per_plane) == 1:
        vector_planes(*head, 0, planes, *tail)  # NOTE: no closures: ~1 us, a third of a 4x4 output's pool
        return
    split_planes(
        lambda first, last: vector_planes(*head, first, last, *tail),
        lambda parts: _split(parts, *head, *tail),
        planes, per_plane,
    )  # fmt: skip


@numba.njit(nogil=True, cache=True)
def rows_per_vector(out_w):  # noqa: ANN001, ANN201
    """Output rows one 16-lane vector holds: 4 rows of up to 4 outputs, 2 of up to 8, else 1."""
    return 4 if out_w <= LANES // 4 else 2 if out_w <= LANES // 2 else 1


@dataclass(frozen=True)
class _Variant:
    """One compiled body of ``_window_vectors``: the vector shape and the reduction, fixed in the IR."""

    rows: int  # output rows per vector (rows_per_vector)
    stride: int  # column stride
    is_max: bool

    @property
    def piece(self) -> int:
        """Floats loaded per tap and output row."""
        return self.stride * LANES // self.rows

    @property
    def pad(self) -> float:
        """What a lane in the padding reads."""
        return float("-inf") if self.is_max else 0.0


_VARIANTS = tuple(
    _Variant(rows, stride, is_max) for rows in (1, 2, 4) for stride in STRIDES for is_max in (True, False)
)


@dataclass
class _Call:
    """The IR values of one ``_window_vectors`` call (see its docstring)."""

    x: Any
    x_start: Any
    planes: Any
    plane_step: Any
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
    y: Any
    y_start: Any
    y_plane: Any
    y_row: Any
    count: Any
    scale: Any
    scale_start: Any


@intrinsic
def _window_vectors(
    typingctx, x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
    kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, scale, scale_start, rows, stride, is_max,
):  # noqa: ANN001, ANN202  # fmt: skip
    """One vector of outputs for each of ``planes`` (<= PLANE_BLOCK) planes, ``plane_step`` floats apart
    from ``x_start`` in the flat X ``x`` (``height`` x ``width`` maps):

    output row s < ``segments`` of the vector (of ``rows``: 1, 2 or 4) reads tap (i, j), i from
    ``first_tap`` to ``last_tap - 1``, from X's row ``top + s*row_step + i*dh``, columns ``col_start +
    j*dw + stride*lane`` for lane < 16 / rows (lanes outside X read the padding), and keeps its first
    ``count`` lanes at ``y_start + s*y_row`` in the flat Y ``y``, ``y_plane`` apart per plane: the maximum,
    or the sum times ``scale`` from ``scale_start``. ``rows``, ``stride`` and ``is_max`` pick one of the
    bodies compiled for ``_VARIANTS``.
    """
    arguments = (x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
                 kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, scale, scale_start, rows, stride,
                 is_max)  # fmt: skip
    for array in (x, y, scale):  # the IR reads and writes floats through their data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_window_vectors takes flat float32 arrays, not {array}")
    signature = types.void(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args[:22])
        for index in (0, 15, 20):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        call = _Call(*values)
        rows_v, stride_v, is_max_v = args[22:]
        for variant in _VARIANTS:
            chosen = builder.and_(
                builder.and_(
                    builder.icmp_signed("==", rows_v, lv.INT(variant.rows)),
                    builder.icmp_signed("==", stride_v, lv.INT(variant.stride)),
                ),
                builder.icmp_unsigned("==", is_max_v, ir.Constant(is_max_v.type, int(variant.is_max))),
            )
            with builder.if_then(chosen):
                _emit(builder, variant, call)
        return context.get_dummy_value()

    return signature, codegen


def _emit(builder: ir.IRBuilder, variant: _Variant, call: _Call) -> None:
    """The body of ``_window_vectors`` for one variant: taps accumulated, then stored."""
    starts = [
        builder.add(call.x_start, builder.mul(_clamped_plane(builder, plane, call.planes), call.plane_step))
        for plane in range(PLANE_BLOCK)
    ]
    totals = [_slot(builder, lv.float_vector(LANES, variant.pad)) for _ in starts]
    nans = [_slot(builder, lv.float_vector(LANES, 0.0)) for _ in starts] if variant.is_max else []
    fill = lv.float_vector(variant.piece, variant.pad)
    no_lanes = ir.Constant(ir.VectorType(ir.IntType(1), variant.piece), [0] * variant.piece)
    with cgutils.for_range(builder, call.kw) as column_tap:
        column = builder.add(call.col_start, builder.mul(column_tap.index, call.dw))
        inside = lv.lanes_inside(builder, column, variant.piece, call.width)
        with cgutils.for_range_slice(builder, call.first_tap, call.last_tap, lv.INT(1)) as (row_tap, _):
            offsets, masks = [], []
            for segment in range(variant.rows):
                row = builder.add(
                    builder.add(call.top, builder.mul(lv.INT(segment), call.row_step)),
                    builder.mul(row_tap, call.dh),
                )
                if variant.rows == 1:
                    masks.append(inside)  # the taps' rows all lie in X
                else:
                    read = builder.and_(
                        builder.icmp_unsigned("<", row, call.height),
                        builder.icmp_signed("<", lv.INT(segment), call.segments),
                    )
                    masks.append(builder.select(read, inside, no_lanes))
                offsets.append(builder.add(builder.mul(row, call.width), column))
            for plane, start in enumerate(starts):
                pieces = [
                    lv.masked_load(builder, call.x, builder.add(start, offset), mask, fill)
                    for offset, mask in zip(offsets, masks, strict=True)
                ]
                values = lv.concatenate(builder, pieces)
                if variant.stride == 2:
                    values = lv.every_other(builder, values)
                _accumulate(builder, variant, values, totals[plane], nans[plane] if nans else None)
    _store(builder, variant, call, totals, nans)


def _clamped_plane(builder: ir.IRBuilder, plane: int, planes: ir.Value) -> ir.Value:
    """``plane``, or the block's last plane where the block holds fewer (computed again, never stored)."""
    return builder.select(
        builder.icmp_signed("<", lv.INT(plane), planes), lv.INT(plane), builder.sub(planes, lv.INT(1))
    )


def _slot(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A stack slot holding ``value`` (LLVM keeps it in a register)."""
    slot = cgutils.alloca_once(builder, value.type)
    builder.store(value, slot)
    return slot


def _accumulate(
    builder: ir.IRBuilder, variant: _Variant, values: ir.Value, total: ir.Value, nan: ir.Value | None
) -> None:
    """``total`` = max(total, values) (and ``nan`` += max(0, values)) or ``total`` += values."""
    old = builder.load(total)
    if not variant.is_max:
        builder.store(builder.fadd(old, values), total)
        return
    # NOTE: select(a > b, a, b) is one maxps; a NaN in ``values`` leaves ``old`` and is caught by ``nan``.
    builder.store(builder.select(builder.fcmp_ordered(">", values, old), values, old), total)
    zero = lv.float_vector(LANES, 0.0)
    positive = builder.select(builder.fcmp_ordered(">", zero, values), zero, values)
    builder.store(builder.fadd(builder.load(nan), positive), nan)


def _store(
    builder: ir.IRBuilder, variant: _Variant, call: _Call, totals: list[ir.Value], nans: list[ir.Value]
) -> None:
    """Each plane's kept lanes into Y, one masked store per output row of the vector (an average's sums
    times their factors, a maximum made NaN where a tap was)."""
    group = LANES // variant.rows
    masks, shifts = [], []
    for segment in range(variant.rows):
        lanes = lv.lanes_inside(builder, lv.INT(-segment * group), LANES, call.count)
        alive = builder.icmp_signed("<", lv.INT(segment), call.segments)
        masks.append(builder.select(alive, lanes, ir.Constant(lanes.type, [0] * LANES)))
        # Lane segment*group of the vector lands on Y's row ``segment``.
        shifts.append(builder.sub(builder.mul(lv.INT(segment), call.y_row), lv.INT(segment * group)))
    factors = lv.float_vector(LANES, 0.0)
    if not variant.is_max:
        for mask, shift in zip(masks, shifts, strict=True):
            factors = lv.masked_load(builder, call.scale, builder.add(call.scale_start, shift), mask, factors)
    for plane, total in enumerate(totals):
        value = builder.load(total)
        if variant.is_max:
            flagged = builder.load(nans[plane])
            value = builder.select(builder.fcmp_unordered("uno", flagged, flagged), flagged, value)
        else:
            value = builder.fmul(value, factors)
        stored = builder.icmp_signed("<", lv.INT(plane), call.planes)
        with builder.if_then(stored):
            start = builder.add(call.y_start, builder.mul(lv.INT(plane), call.y_plane))
            for mask, shift in zip(masks, shifts, strict=True):
                lv.masked_store(builder, value, call.y, builder.add(start, shift), mask)


@numba.njit(nogil=True, cache=True)
def vector_planes(x, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001, ANN201
                  kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # fmt: skip
    """Output planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of the flat Y ``y``
    (images ``image_stride`` elements apart, each ``[C, OH, OW]`` contiguous; ``buffers.flat_images``),
    ``PLANE_BLOCK`` planes at a time, each a vector of outputs at a time (``_window_vectors``)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    flat_x, flat_scale = x.reshape(-1), scale.reshape(-1)
    out_size = out_h * out_w
    # A block may run on into the next image only where Y's images lie end to end.
    contiguous = image_stride == channels * out_size
    rows = rows_per_vector(out_w)
    lanes = LANES // rows
    plane = first
    while plane < last:
        channel = plane % channels
        planes = min(PLANE_BLOCK, last - plane, last - plane if contiguous else channels - channel)
        y_plane = (plane // channels) * image_stride + channel * out_size
        for oy in range(0, out_h, rows):
            segments = min(rows, out_h - oy)
            top = oy * sh - pad_top
            # The taps whose row lies in X for some output row of the vector: from the last row's first
            # to the first row's last (the rows in between are masked per output row).
            bottom = top + (segments - 1) * sh
            first_tap = 0 if bottom >= 0 else (dh - 1 - bottom) // dh
            last_tap = kh if top + (kh - 1) * dh < height else max(0, (height - 1 - top) // dh + 1)
            for ox in range(0, out_w, lanes):
                _window_vectors(flat_x, plane * height * width, planes, height * width, top, sh, segments,
                                height, width, first_tap, last_tap, kw, dh, dw, ox * sw - pad_left,
                                y, y_plane + oy * out_w + ox, out_size, out_w, min(lanes, out_w - ox),
                                flat_scale, oy * out_w + ox, rows, sw, is_max)  # fmt: skip
        plane += planes


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, y, image_stride, out_h, out_w,  # noqa: ANN001, ANN201
          kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # fmt: skip
    """``vector_planes`` over ``parts`` ranges of Y's planes, run by numba's threads."""
    planes = x.shape[0] * x.shape[1]
    for part in numba.prange(parts):
        vector_planes(x, y, image_stride, out_h, out_w, planes * part // parts, planes * (part + 1) // parts,
                      kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale)  # fmt: skip
