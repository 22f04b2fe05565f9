"""The float32 depthwise Conv with square 3x3 or 5x5 windows, strides 1 or 2: each plane swept in blocks
of output rows, the window's weights held in registers, in LLVM IR.

Why: ``jit_depthwise_lanes`` computes one vector of outputs per call, reloading and broadcasting every
weight and reading every input row once per output row that uses it: per output vector of a 3x3 window
9 masked loads of X, 9 broadcast loads of W and a fixed cost of ~4.6 ns (136x28x28 on one core: 9.3
ns a plane's vector, ~25 cycles for 9 FMAs). Here a call sweeps a whole plane, ``row_sweep.ROWS`` output rows
at a time across all their columns: the weights are broadcast once a plane, each input row's window columns are
loaded once and feed every output row whose window covers that row, so a 3x3 window at stride 1 costs
about 4 loads (not 18) per output vector and the FMAs bound the loop; the block's rows are independent
chains of FMAs, enough to hide their latency.

Measured on one core, one image, minimums, ``jit_depthwise_lanes``' vectors -> swept rows: 3x3 stride 1
on 136x28x28 59 -> 32 us, 576x14x14 67 -> 37, 960x7x7 48 -> 33, 144x56x56 230 -> 131, 32x112x112 174 ->
114; stride 2 on 96x112x112 246 -> 211 and 144x56x56 96 -> 77 (each input row's 32 floats split into
even lanes by a shuffle, on the port the FMAs share); 5x5 on 240x28x28 207 -> 91.

The sweep itself (blocks of ``row_sweep.ROWS`` rows, lanes in the padding, rows past the map, the next
block's rows prefetched) is ``row_sweep``'s, shared with the pools.

Accumulators start at the bias; the activation is ``llvm_vectors.activate`` with the constants of
``jit_depthwise_lanes.activation_constants``.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import row_sweep

#: Window sizes (square) swept; any other runs ``jit_depthwise_lanes``' vectors.
WINDOWS = (3, 5)
#: Strides (the same along rows and columns) swept.
STRIDES = (1, 2)
_BODIES = tuple((window, stride) for window in WINDOWS for stride in STRIDES)


@numba.njit(nogil=True, cache=True, inline="always")
def sweeps(kh, kw, sh, sw, dh, dw):  # noqa: ANN001, ANN201
    """Whether a depthwise window (``kh`` x ``kw``, strides ``sh``, ``sw``, dilations ``dh``, ``dw``) is
    swept here: square 3x3 or 5x5, equal strides of 1 or 2, no dilation."""
    return kh == kw and (kh == 3 or kh == 5) and sh == sw and (sh == 1 or sh == 2) and dh == 1 and dw == 1


@intrinsic
def _sweep(
    typingctx, x, x_start, height, width, top, left, y, y_start, out_h, out_w, w, w_start, bias, bias_at,
    activation, window, stride,
):  # noqa: ANN001, ANN202  # fmt: skip
    """Every output row of one plane in blocks of ``row_sweep.ROWS``: X's plane at ``x_start`` of the flat ``x``
    (``height`` x ``width``), output row 0 reading from X's row ``top``, column 0 from X's column
    ``left``; Y's plane (``out_h`` x ``out_w``) from ``y_start``; weights ``window`` x ``window`` from
    ``w_start``, bias ``bias[bias_at]``, then the activation (``activation``: slope, low, high).
    ``window`` and ``stride`` pick a body of ``_BODIES``.

    The blocks' loop is in the IR, not in the numba caller: there LLVM kept every body's row pointers
    as induction variables on the stack, ~120 cycles a block."""
    arguments = (x, x_start, height, width, top, left, y, y_start, out_h, out_w, w, w_start, bias, bias_at,
                 activation, window, stride)  # fmt: skip
    for array in (x, y, w, bias, activation):  # the IR reads and writes floats through data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_sweep takes flat float32 arrays, not {array}")
    signature = types.void(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args)
        for index in (0, 6, 10, 12, 14):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        window_v, stride_v = args[15:]
        size = lv.array_size(context, builder, sig.args[0], args[0])
        for window, stride in _BODIES:
            chosen = builder.and_(
                builder.icmp_signed("==", window_v, lv.INT(window)),
                builder.icmp_signed("==", stride_v, lv.INT(stride)),
            )
            with builder.if_then(chosen):
                _Plane(builder, values[:15], window, stride, size).emit()
        return context.get_dummy_value()

    return signature, codegen


class _Plane(row_sweep.RowSweep):
    """The depthwise Conv's sweep: accumulators start at the bias, each tap is one FMA with its weight
    (held in a register for the whole plane), the activation is applied as the rows are stored."""

    def __init__(self, builder: ir.IRBuilder, values: list[ir.Value], window: int, stride: int, size: ir.Value):
        super().__init__(builder, values[: row_sweep.GEOMETRY_VALUES], window, stride, size)
        self.w, self.w_start, self.bias, self.bias_at, self.activation = values[row_sweep.GEOMETRY_VALUES :]
        self.fma = lv.fused_multiply_add(builder)

    def prepare(self) -> None:
        builder, window = self.builder, self.window
        self.weights = [
            [self._broadcast(self.w, builder.add(self.w_start, lv.INT(i * window + j))) for j in range(window)]
            for i in range(window)
        ]  # fmt: skip
        self.bias_vector = self._broadcast(self.bias, self.bias_at)
        self.constants = [self._broadcast(self.activation, lv.INT(i)) for i in range(3)]

    def _broadcast(self, base: ir.Value, offset: ir.Value) -> ir.Value:
        return lv.broadcast(self.builder, lv.load_scalar(self.builder, base, offset))

    def start(self) -> ir.Value:
        return self.bias_vector

    def join(self, total: ir.Value, values: ir.Value, i: int, j: int) -> ir.Value:
        return self.builder.call(self.fma, [values, self.weights[i][j], total])

    def finish(self, total: ir.Value, row: ir.Value, first: ir.Value) -> ir.Value:
        return lv.activate(self.builder, self.constants, total)


@numba.njit(nogil=True, cache=True)
def swept_planes(x, w, bias, activation, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001, ANN201
                 window, stride, pad_top, pad_left, groups):  # fmt: skip
    """``jit_depthwise_lanes.vector_planes`` for a window ``sweeps`` takes (``window`` x ``window``,
    ``stride`` both ways), X read channel-shuffled in ``groups``, into the flat Y ``y`` (images
    ``image_stride`` apart); but ``first .. last - 1`` count Y's planes (image p // C, channel p % C),
    not X's: two threads' shares then write Y's planes in two ranges, where by X's planes a shuffled
    layer's threads would write neighbouring planes, sharing a cache line at every plane's edge
    (272x14x14 in 4 groups: 28 us on two threads against 23 on one)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    per_group = channels // groups
    taps = window * window
    flat_x = x.reshape(-1)
    plane_size = height * width
    out_size = out_h * out_w
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        # Output channel i*groups + g reads X's channel g*per_group + i.
        source = (channel % groups) * per_group + channel // groups
        _sweep(flat_x, (image * channels + source) * plane_size, height, width, -pad_top, -pad_left, y,
               image * image_stride + channel * out_size, out_h, out_w, w, channel * taps, bias, channel,
               activation, window, stride)  # fmt: skip
