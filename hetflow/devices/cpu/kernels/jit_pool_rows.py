"""The float32 max and average pools with 3x3 windows at stride 1 and no dilation, each plane swept in
blocks of output rows (``row_sweep``, shared with the depthwise Conv).

Why: ``jit_pool_lanes`` computes one vector of outputs per call and loads every tap of it, so each input
row is read once per output row that covers it (three times at 3x3 stride 1) and every call pays its
fixed cost. Swept, an input row is loaded once per block and joins every output row that reads it,
and the next block's rows are prefetched (a batch's maps come from memory).

Max: a lane in the padding reads -inf and never wins. x86's max skips a NaN, where ``np.maximum`` (and
ONNX) propagate it, so every loaded vector is also tested for NaN; a plane that held one is computed
again by ``jit_pool_lanes``' exact loop (``sweep_plane`` says so). Average: padding adds 0, and the sum
is multiplied by ``scale`` ``[OH, OW]`` (the reciprocal window counts) as it is stored.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import row_sweep
from hetflow.devices.cpu.kernels.window_lanes import slot

#: Strides swept (the same both ways) of a 3x3 window: ResNet's, GoogLeNet's and Inception's stride-1
#: pools. 2x2/2 windows do not overlap, so there is no row to share, and they ran 5-25% slower swept.
#: 3x3/2 windows, once swept here too, are all pooled in strips (``jit_pool_strided``, which takes them
#: first): swept they had run, one core, one image (us, 2026-12-06), max 64x111 -> 55 128, 128x55 -> 27
#: 69, 480x28 -> 14 85; in strips (2026-12-07) 100, 37 and 34.
STRIDES = (1,)
#: The shortest output row swept: a vector is one row's 16 outputs, so shorter rows leave lanes idle
#: where ``jit_pool_lanes`` packs several rows into one. One core, one image, swept against
#: ``jit_pool_lanes`` (us): 96x16x16 max 10.2 vs 12.3, 96x20x20 13.9 vs 24.9, 192x27x27 36 vs 65, 256x28x28
#: average 56 vs 80, but 576x14x14 average 59 vs 52 and 832x6x6 max 60 vs 19.
MIN_ROW_OUTPUTS_STRIDE_1 = 16
_WINDOW = 3
_BODIES = tuple((stride, is_max) for stride in STRIDES for is_max in (True, False))


@numba.njit(nogil=True, cache=True, inline="always")
def sweeps(kh, kw, sh, sw, dh, dw, out_w):  # noqa: ANN001, ANN201
    """Whether a pool window (``kh`` x ``kw``, strides ``sh``, ``sw``, dilations ``dh``, ``dw``) with
    output rows ``out_w`` long is swept here: 3x3 at stride 1, no dilation, rows of at least
    ``MIN_ROW_OUTPUTS_STRIDE_1`` outputs."""
    if kh != _WINDOW or kw != _WINDOW or sh != 1 or sw != 1 or dh != 1 or dw != 1:
        return False
    return out_w >= MIN_ROW_OUTPUTS_STRIDE_1


@intrinsic
def _sweep(typingctx, x, x_start, height, width, top, left, y, y_start, out_h, out_w, scale, stride, is_max):  # noqa: ANN001, ANN202
    """Every output row of one plane: X's plane at ``x_start`` of the flat ``x`` (``height`` x ``width``),
    output (0, 0)'s window from X's row ``top``, column ``left``; Y's plane (``out_h`` x ``out_w``) from
    ``y_start`` of the flat ``y``. The maximum, or the sum times the flat ``scale`` (``out_h * out_w``).
    Returns 1 when a maximum loaded a NaN (its result is then not exact), else 0."""
    arguments = (x, x_start, height, width, top, left, y, y_start, out_h, out_w, scale, stride, is_max)
    for array in (x, y, scale):  # the IR reads and writes floats through data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_sweep takes flat float32 arrays, not {array}")
    signature = types.int64(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args)
        for index in (0, 6, 10):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        stride_v, is_max_v = args[11:]
        size = lv.array_size(context, builder, sig.args[0], args[0])
        found = slot(builder, lv.INT(0))
        for stride, is_max in _BODIES:
            chosen = builder.and_(
                builder.icmp_signed("==", stride_v, lv.INT(stride)),
                builder.icmp_unsigned("==", is_max_v, ir.Constant(is_max_v.type, int(is_max))),
            )
            with builder.if_then(chosen):
                geometry = values[: row_sweep.GEOMETRY_VALUES]
                if is_max:
                    plane = _MaxPlane(builder, geometry, _WINDOW, stride, size)
                    plane.emit()
                    builder.store(plane.nan_seen(), found)
                else:
                    _SumPlane(builder, geometry, _WINDOW, stride, size, values[10]).emit()
        return builder.load(found)

    return signature, codegen


class _MaxPlane(row_sweep.RowSweep):
    """The maximum of each window; a flag of whether any loaded lane was NaN."""

    pad_value = float("-inf")

    def prepare(self) -> None:
        self.nans = slot(self.builder, ir.Constant(ir.VectorType(ir.IntType(1), lv.LANES), [0] * lv.LANES))

    def start(self) -> ir.Value:
        return lv.float_vector(lv.LANES, float("-inf"))

    def join(self, total: ir.Value, values: ir.Value, i: int, j: int) -> ir.Value:
        # select(a > b, a, b) is one maxps: a NaN in ``values`` leaves ``total`` (``loaded`` flags it).
        return self.builder.select(self.builder.fcmp_ordered(">", values, total), values, total)

    def loaded(self, values: ir.Value) -> None:
        builder = self.builder
        builder.store(
            builder.or_(builder.load(self.nans), builder.fcmp_unordered("uno", values, values)), self.nans
        )

    def nan_seen(self) -> ir.Value:
        """1 when any loaded lane was NaN (int64)."""
        builder = self.builder
        bits = builder.bitcast(builder.load(self.nans), ir.IntType(lv.LANES))
        return builder.zext(builder.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0)), lv.INT)


class _SumPlane(row_sweep.RowSweep):
    """The sum of each window times its scale."""

    def __init__(
        self, builder: ir.IRBuilder, geometry: list[ir.Value], window: int, stride: int, size: ir.Value,
        scale: ir.Value,
    ):  # fmt: skip
        super().__init__(builder, geometry, window, stride, size)
        self.scale = scale

    def start(self) -> ir.Value:
        return lv.float_vector(lv.LANES, 0.0)

    def join(self, total: ir.Value, values: ir.Value, i: int, j: int) -> ir.Value:
        return self.builder.fadd(total, values)

    def finish(self, total: ir.Value, row: ir.Value, first: ir.Value) -> ir.Value:
        builder = self.builder
        at = builder.add(builder.mul(row, self.out_w), first)
        mask = lv.lanes_inside(builder, first, lv.LANES, self.out_w)
        return builder.fmul(
            total, lv.masked_load(builder, self.scale, at, mask, lv.float_vector(lv.LANES, 0.0))
        )


@numba.njit(nogil=True, cache=True)
def sweep_plane(x, y, image_stride, out_h, out_w, plane, stride, pad_top, pad_left, is_max, scale):  # noqa: ANN001, ANN201
    """Output plane ``plane`` (image ``plane // C``, channel ``plane % C``) of the flat Y ``y`` (images
    ``image_stride`` apart) pooled from ``x`` [N, C, H, W] over a window ``sweeps`` takes. Returns
    whether a maximum met a NaN: the plane must then be pooled by an exact loop."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    image, channel = plane // channels, plane % channels
    found = _sweep(
        x.reshape(-1),
        plane * height * width,
        height,
        width,
        -pad_top,
        -pad_left,
        y,
        image * image_stride + channel * out_h * out_w,
        out_h,
        out_w,
        scale.reshape(-1),
        stride,
        is_max,
    )
    return found != 0
