"""3x3 stride-2 max and average pools (any padding, floor or ceil rounding) in strips of 16 output columns:
the pools of SqueezeNet, GoogLeNet, Inception v2, ResNet-50, DenseNet-121, AlexNet, ZFNet and cifar10-quick.
An average is the window's sum (padding adds zero) times the pool's ``[OH, OW]`` reciprocal counts, as
the strip stores a row: cifar10-quick's 32 x 16x16 -> 8x8 at batch 16 in its run 0.031 -> 0.011 ms (ONNX
Runtime's 0.011; 60 ns a plane in ``jit_pool_lanes``' vectors).

Why: ``jit_pool_lanes`` loads all 9 taps of every vector of outputs, each tap of a stride-2 window one
32-float load split to 16 lanes by a shuffle, and ``jit_pool_rows``' sweep loads every input row once
per column tap; on SqueezeNet's 27x27 and 55x55 maps they spent 230 and 600 ns a plane on one core, where
ONNX Runtime's pools (channels in the lanes) took about half in its runs. Here a strip (``_strip``)
walks down the plane: each input row is loaded once (two 16-float halves and the next float), split by
three shuffles into the windows' even, odd and next even columns, and their maximum is the row's 3-wide
window at all 16 outputs (``_row_maxima``); an output row is the maximum of three such rows, the last
of which is the next output row's first and stays in a register. One core, one image, the planes
alone, before -> after (us): 256x27x27 54 -> 19, 128x55x55 82 -> 39, 96x56x56 (ceil) 64 -> 31, 480x28x28
(ceil) 101 -> 37, 832x14x14 (ceil) 58 -> 36, 32x32x32 12 -> 3.5, 64x111x111 141 -> 105 (a map past L2).

Loads: where a row's 48 floats lie inside the flat X they are plain loads, and the columns outside the
row (padding, ceil mode's last window) become -inf after the shuffles, under lane masks worked out once
a strip; masked loads are kept to X's ends and to rows in the padding (read as -inf). A first version
that worked out a lane mask before every load (a broadcast, an add and a compare into a mask register)
ran no faster than the old kernels: on Zen 4 a load behind such a mask cost twice a plain one, where a
masked load under a mask made once costs the same (``benchmarks/results/2026-12-07-s57/experiments.txt``).

NaN: x86's max skips a NaN where ``np.maximum`` (and ONNX) propagate it, so every loaded vector is
tested for NaN (all its lanes: a NaN just beside the row counts too); a plane that met one is left to
the caller's exact loop (``pool_plane`` says so).
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import stride_two
from hetflow.devices.cpu.kernels.window_lanes import slot

#: The window (both axes) and the stride (both axes) this kernel takes.
WINDOW = 3
STRIDE = 2
#: Outputs per vector.
LANES = lv.LANES


@numba.njit(nogil=True, cache=True, inline="always")
def takes(kh, kw, sh, sw, dh, dw):  # noqa: ANN001, ANN201
    """Whether this kernel pools the window: 3x3, stride 2 both ways, no dilation."""
    return kh == WINDOW and kw == WINDOW and sh == STRIDE and sw == STRIDE and dh == 1 and dw == 1


def _maximum(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    return builder.select(builder.fcmp_ordered(">", a, b), a, b)  # one maxps


class _Reduction:
    """What a strip makes of its windows: the maximum (padding -inf, NaN tested) or the sum (padding 0)."""

    def __init__(self, builder: ir.IRBuilder, is_max: bool):
        self.builder, self.is_max = builder, is_max
        self.fill = lv.float_vector(LANES, float("-inf") if is_max else 0.0)

    def combine(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return _maximum(self.builder, a, b) if self.is_max else self.builder.fadd(a, b)

    def row(self, data: ir.Value, size: ir.Value, row_at: ir.Value, valid: ir.Value, width: ir.Value,
            first: ir.Value, masks: list[ir.Value]) -> tuple[ir.Value, ir.Value]:  # fmt: skip
        """16 outputs' 3-wide windows along one input row at ``row_at`` of the flat array at ``data``
        (``size`` floats; the row ``width`` floats, read only if ``valid``, else padding), output lane k's
        window from column ``first + 2k`` (columns outside the row are padding, under the strip's
        ``masks``); and the i1 "a loaded lane was NaN" (the maximum's: a sum carries a NaN itself).

        The row is read as ``stride_two`` reads it (plain loads inside the array, shuffles into the
        windows' even, odd and next even columns). The NaN test reads every loaded lane, in the row or
        not: a NaN beside the row only sends the plane to the exact loop."""
        builder = self.builder
        loaded = stride_two.load_row(builder, data, size, row_at, first, width, self.fill, valid)
        low, high, next_ = loaded
        if self.is_max:
            nan = builder.or_(builder.fcmp_unordered("uno", low, high), builder.fcmp_unordered("uno", next_, next_))
        else:
            nan = ir.Constant(ir.VectorType(ir.IntType(1), LANES), [0] * LANES)
        columns = [
            builder.select(mask, vector, self.fill)
            for mask, vector in zip(masks, stride_two.window_columns(builder, loaded, WINDOW))
        ]
        return self.combine(self.combine(columns[0], columns[1]), columns[2]), nan


@intrinsic
def _strip(typingctx, x, x_at, height, width, pad_top, first_column, y, y_at, out_h, out_w, count, scale,  # noqa: ANN001, ANN202
           scale_at, is_max):  # fmt: skip
    """A strip of 16 output columns of one plane, every output row: X's ``height`` x ``width`` plane at
    ``x_at`` of the flat ``x``, output row 0's window from input row ``-pad_top``, output lane k's from
    column ``first_column + 2k``; the first ``count`` lanes of each output row stored at ``y_at + oy *
    out_w`` of the flat ``y``: the maximum, or (``is_max`` 0) the sum times the flat ``scale`` at
    ``scale_at + oy * out_w`` (``[OH, OW]``; ``scale_at`` the strip's first output column). Each input row's windows are
    made once: an output row's last input row is the next one's first (kept in a register). Returns 1
    when a maximum loaded a NaN."""
    for array in (x, y, scale):
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_strip takes flat float32 arrays, not {array}")

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        (x_value, x_at_value, height_value, width_value, pad_top_value, first_value, y_value, y_at_value,
         out_h_value, out_w_value, count_value, scale_value, scale_at_value, is_max_value) = args  # fmt: skip
        data = lv.array_data(context, builder, sig.args[0], x_value)
        size = lv.array_size(context, builder, sig.args[0], x_value)
        y_data = lv.array_data(context, builder, sig.args[6], y_value)
        scale_data = lv.array_data(context, builder, sig.args[11], scale_value)
        masks = stride_two.column_masks(builder, first_value, width_value, WINDOW)
        store_mask = lv.lanes_inside(builder, lv.INT(0), LANES, count_value)
        found = slot(builder, lv.INT(0))
        with builder.if_else(builder.icmp_unsigned("!=", is_max_value, lv.INT(0))) as (maximum, average):
            for is_max, branch in ((True, maximum), (False, average)):
                with branch:
                    reduction = _Reduction(builder, is_max)

                    def row_windows(row: ir.Value, reduction: _Reduction = reduction) -> tuple[ir.Value, ir.Value]:
                        valid = builder.icmp_unsigned("<", row, height_value)  # a negative row wraps past any height
                        at = builder.add(x_at_value, builder.mul(row, width_value))
                        return reduction.row(data, size, at, valid, width_value, first_value, masks)

                    first_row, first_nan = row_windows(builder.sub(lv.INT(0), pad_top_value))
                    carry = slot(builder, first_row)
                    nans = slot(builder, first_nan)
                    with cgutils.for_range(builder, out_h_value) as loop:
                        top = builder.sub(builder.mul(loop.index, lv.INT(2)), pad_top_value)
                        middle, middle_nan = row_windows(builder.add(top, lv.INT(1)))
                        bottom, bottom_nan = row_windows(builder.add(top, lv.INT(2)))
                        windows = reduction.combine(reduction.combine(builder.load(carry), middle), bottom)
                        row_at = builder.mul(loop.index, out_w_value)
                        if not is_max:
                            scale_at = builder.add(row_at, scale_at_value)
                            factors = lv.masked_load(builder, scale_data, scale_at, store_mask, reduction.fill)
                            windows = builder.fmul(windows, factors)
                        lv.masked_store(builder, windows, y_data, builder.add(y_at_value, row_at), store_mask)
                        builder.store(bottom, carry)
                        builder.store(builder.or_(builder.load(nans), builder.or_(middle_nan, bottom_nan)), nans)
                    bits = builder.bitcast(builder.load(nans), ir.IntType(LANES))
                    nan_seen = builder.zext(builder.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0)), lv.INT)
                    builder.store(nan_seen, found)
        return builder.load(found)

    signature = types.int64(x, types.int64, types.int64, types.int64, types.int64, types.int64, y, types.int64,
                            types.int64, types.int64, types.int64, scale, types.int64, types.int64)  # fmt: skip
    return signature, codegen


@numba.njit(nogil=True, cache=True)
def pool_plane(x, x_at, height, width, pad_top, pad_left, y, y_at, out_h, out_w, is_max, scale):  # noqa: ANN001, ANN201
    """The 3x3 stride-2 maximum (or, ``is_max`` false, the sum times the flat ``scale`` ``[OH, OW]``) of
    one plane: X's ``height`` x ``width`` floats at ``x_at`` of the flat ``x``, output (0, 0)'s window at
    row ``-pad_top``, column ``-pad_left``; Y's ``out_h`` x ``out_w`` at ``y_at`` of the flat ``y``.
    Returns whether a maximum loaded a NaN (the plane is then not exact: pool it again with an exact
    loop)."""
    nan = 0
    for ox in range(0, out_w, LANES):
        nan |= _strip(x, x_at, height, width, pad_top, 2 * ox - pad_left, y, y_at + ox, out_h, out_w,
                      min(LANES, out_w - ox), scale, ox, 1 if is_max else 0)  # fmt: skip
    return nan != 0
