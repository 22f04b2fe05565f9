"""The float32 depthwise Conv with square 3x3 or 5x5 windows, strides 1 or 2: each plane swept in blocks
of output rows, the window's weights held in registers, in LLVM IR.

Why: ``jit_depthwise_lanes`` computes one vector of outputs per call, reloading and broadcasting every
weight and reading every input row once per output row that uses it: per output vector of a 3x3 window
9 masked loads of X, 9 broadcast loads of W and a fixed cost of ~4.6 ns (136x28x28 on one core: 9.3
ns a plane's vector, ~25 cycles for 9 FMAs). Here a call sweeps a whole plane, ``ROWS`` output rows
at a time across all their columns: the weights are broadcast once a plane, each input row's window columns are
loaded once and feed every output row whose window covers that row, so a 3x3 window at stride 1 costs
about 4 loads (not 18) per output vector and the FMAs bound the loop; the block's rows are independent
chains of FMAs, enough to hide their latency.

Measured on one core, one image, minimums, ``jit_depthwise_lanes``' vectors -> swept rows: 3x3 stride 1
on 136x28x28 59 -> 32 us, 576x14x14 67 -> 37, 960x7x7 48 -> 33, 144x56x56 230 -> 131, 32x112x112 174 ->
114; stride 2 on 96x112x112 246 -> 211 and 144x56x56 96 -> 77 (each input row's 32 floats split into
even lanes by a shuffle, on the port the FMAs share); 5x5 on 240x28x28 207 -> 91.

A vector holds 16 outputs of one row (at stride 2 the even lanes of 32 loaded floats); lanes whose
column lies in the padding are never read and count as zero, input rows in the padding are skipped, and
output rows past the map are computed but never stored. Rows of 8 or fewer outputs still take a whole
vector, and still beat the old kernel's two rows per vector (960x7x7 above).

Accumulators start at the bias; the activation is ``llvm_vectors.activate`` with the constants of
``jit_depthwise_lanes.activation_constants``.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv

#: Window sizes (square) swept; any other runs ``jit_depthwise_lanes``' vectors.
WINDOWS = (3, 5)
#: Strides (the same along rows and columns) swept.
STRIDES = (1, 2)
#: Output rows per block: seven independent chains of FMAs, and every map of the zoo (224 / 2^k: 112,
#: 56, 28, 14, 7) a whole number of blocks; eight rows left two of 14x14's 16 rows idle and measured no
#: faster on 28x28 and larger maps. A last block of at most ``SHORT_ROWS`` rows takes that many.
ROWS = 7
SHORT_ROWS = 4
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
    """Every output row of one plane in blocks of ``ROWS``: X's plane at ``x_start`` of the flat ``x``
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
        for window, stride in _BODIES:
            chosen = builder.and_(
                builder.icmp_signed("==", window_v, lv.INT(window)),
                builder.icmp_signed("==", stride_v, lv.INT(stride)),
            )
            with builder.if_then(chosen):
                _Plane(builder, values[:15], window, stride).emit()
        return context.get_dummy_value()

    return signature, codegen


class _Plane:
    """The IR of one plane's sweep for a fixed window and stride."""

    def __init__(self, builder: ir.IRBuilder, values: list[ir.Value], window: int, stride: int):
        self.builder, self.window, self.stride = builder, window, stride
        (self.x, self.x_start, self.height, self.width, self.top, self.left, self.y, self.y_start, self.out_h,
         self.out_w, self.w, self.w_start, self.bias, self.bias_at, self.activation) = values  # fmt: skip
        self.piece = lv.LANES * stride  # floats loaded per input row and window column
        self.fma = lv.fused_multiply_add(builder)

    def emit(self) -> None:
        builder = self.builder
        weights = [
            [self._broadcast(self.w, builder.add(self.w_start, lv.INT(i * self.window + j))) for j in range(self.window)]
            for i in range(self.window)
        ]  # fmt: skip
        bias = self._broadcast(self.bias, self.bias_at)
        constants = [self._broadcast(self.activation, lv.INT(i)) for i in range(3)]
        blocks = builder.sdiv(builder.add(self.out_h, lv.INT(ROWS - 1)), lv.INT(ROWS))
        with cgutils.for_range(builder, blocks) as block:
            first_row = builder.mul(block.index, lv.INT(ROWS))
            rows = builder.sub(self.out_h, first_row)  # more than ROWS except in the last block
            top = builder.add(self.top, builder.mul(first_row, lv.INT(self.stride)))
            y_start = builder.add(self.y_start, builder.mul(first_row, self.out_w))
            with builder.if_else(builder.icmp_signed(">", rows, lv.INT(SHORT_ROWS))) as (full, short):
                with full:
                    self._block(ROWS, top, y_start, rows, weights, bias, constants)
                with short:
                    self._block(SHORT_ROWS, top, y_start, rows, weights, bias, constants)

    def _block(
        self, size: int, top: ir.Value, y_start: ir.Value, rows: ir.Value, weights: list[list[ir.Value]],
        bias: ir.Value, constants: list[ir.Value],
    ) -> None:  # fmt: skip
        """A block of ``size`` output rows from X's row ``top`` (its rows from ``rows`` on not stored), all
        its columns, 16 at a time."""
        builder = self.builder
        chunks = builder.sdiv(builder.add(self.out_w, lv.INT(lv.LANES - 1)), lv.INT(lv.LANES))
        with cgutils.for_range(builder, chunks) as chunk:
            first = builder.mul(chunk.index, lv.INT(lv.LANES))
            column = builder.add(self.left, builder.mul(first, lv.INT(self.stride)))
            totals = self._accumulate(size, top, column, weights, bias)
            self._store(first, y_start, rows, totals, constants)

    def _broadcast(self, base: ir.Value, offset: ir.Value) -> ir.Value:
        return lv.broadcast(self.builder, lv.load_scalar(self.builder, base, offset))

    def _accumulate(
        self, size: int, top: ir.Value, column: ir.Value, weights: list[list[ir.Value]], bias: ir.Value
    ) -> list[ir.Value]:  # fmt: skip
        """Each output row's vector at this chunk: its bias plus every window tap times its weight, each
        input row loaded once for all the output rows that read it."""
        builder, window, stride = self.builder, self.window, self.stride
        fill = lv.float_vector(self.piece, 0.0)
        masks = [
            lv.lanes_inside(builder, builder.add(column, lv.INT(j)), self.piece, self.width) for j in range(window)
        ]
        slots = [cgutils.alloca_once(builder, lv.VECTOR) for _ in range(size)]
        for slot in slots:
            builder.store(bias, slot)
        for t in range((size - 1) * stride + window):
            row = builder.add(top, lv.INT(t))
            readers = [(r, t - r * stride) for r in range(size) if 0 <= t - r * stride < window]
            with builder.if_then(builder.icmp_unsigned("<", row, self.height)):  # rows in the padding add 0
                start = builder.add(self.x_start, builder.add(builder.mul(row, self.width), column))
                for j in range(window):
                    values = lv.masked_load(builder, self.x, builder.add(start, lv.INT(j)), masks[j], fill)
                    if stride == 2:
                        values = lv.every_other(builder, values)
                    for r, i in readers:
                        total = builder.load(slots[r])
                        builder.store(builder.call(self.fma, [values, weights[i][j], total]), slots[r])
        return slots

    def _store(
        self, first: ir.Value, y_start: ir.Value, rows: ir.Value, slots: list[ir.Value], constants: list[ir.Value]
    ) -> None:  # fmt: skip
        """The block's rows below ``rows``, activated, into Y from ``y_start``: the chunk's lanes inside the
        row."""
        builder = self.builder
        mask = lv.lanes_inside(builder, first, lv.LANES, self.out_w)
        for r, slot in enumerate(slots):
            with builder.if_then(builder.icmp_signed("<", lv.INT(r), rows)):
                value = lv.activate(builder, constants, builder.load(slot))
                offset = builder.add(y_start, builder.add(builder.mul(lv.INT(r), self.out_w), first))
                lv.masked_store(builder, value, self.y, offset, mask)


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
