"""Direct 2-D convolution at stride 2 over a few input channels (the image stems), X read where it lies
and Y stored where it lies: the variant of the direct kernel for the first layer of most CNNs.

``jit_direct_phases`` turns a strided window into a stride-1 one by first copying X into its phase
planes, multiplies blocks of kernels into a scratch of products that spans the phases' padded rows, and
copies those into Y with the bias and the clamp. On one image of a 3-channel stem each share of the work
(a block of 8 kernels) fills every phase plane again. Here nothing is copied: a block of output rows
reads each input row it needs once, 48 floats from X split into its window columns by shuffles
(``stride_two``: columns outside the row read zero); those feed 8 kernels x ``ROWS`` output rows of 16
positions (24 accumulators), with each weight an FMA's broadcast operand. After the channels' taps the accumulators take the bias and the clamp and are
stored straight into Y (masked past the row's end).

Work is split by units of ``ROWS`` output rows of one image (every kernel block of them): a thread's unit
reads the input rows of its output rows only.

Applies (``applies``) to float32 3x3 and 7x7 windows at stride 2, dilation 1, any padding, on up to
``MAX_CHANNELS`` input channels; a run takes it for one image (``takes``). One image on two spinning
threads (Zen 4 VM, 2026-12-07, minimums), ``jit_direct_phases`` -> here: 3 -> 32 at 224x224 pad 1
(MobileNet v2's stem, which ran on im2col in 0.25 ms in its run) 146 -> 129 us, 3 -> 24 (ShuffleNet's)
141 -> 87, 3 -> 64 pad 0 (SqueezeNet's) 256 -> 240, 7x7 3 -> 64 pad 3 (GoogLeNet's, ResNet-50's) 1120 ->
1091. On one core they tie (3x3: 251 / 259 us, 43 GMAC/s; 7x7: 2221 / 2192, 53 GMAC/s). Before the rows
were read through ``stride_two`` (one masked 32-float load per window column) the 7x7 body ran 2471 us on
one core and 1246 on two, slower than the phase planes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import stride_two
from hetflow.devices.cpu.kernels.jit_direct import (
    KERNEL_BLOCK,
    BlockSplit,
    Bounds,
    PartBuffers,
    blocked_weights,
    bounds_word,
    output_images,
    round_up,
    word_bounds,
)
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_4d
from hetflow.devices.cpu.threads import intra_op_threads, parallel_for
from hetflow.ops.spatial import Geometry

#: Square windows compiled, each its own unrolled body (5x5 stems would compile alike; none is in the zoo
#: to measure them on).
WINDOWS = (3, 7)
#: The stride, both ways.
STRIDE = 2
#: Input channels up to which a stem runs here (each adds its taps to the block's inner loop).
MAX_CHANNELS = 4
#: Output rows per unit of work: ``ROWS`` x ``KERNEL_BLOCK`` = 24 accumulators of the 32 registers.
ROWS = 3


def applies(geom: Geometry, channels: int) -> bool:
    """Whether this variant computes a Conv over ``geom``'s windows on ``channels`` input channels."""
    if len(geom.axes) != 2 or channels > MAX_CHANNELS:
        return False
    rows, columns = geom.axes
    return (
        rows.kernel == columns.kernel
        and rows.kernel in WINDOWS
        and rows.stride == columns.stride == STRIDE
        and rows.dilation == columns.dilation == 1
    )


def takes(geom: Geometry, x_shape: Sequence[int]) -> bool:
    """Whether the direct Conv runs here rather than on phase planes: one image's stem that ``applies``.
    A batch's stems stay there, each image's planes filled once by the share that runs it: at batch 16 on
    two spinning threads (2026-12-07) SqueezeNet's 3 -> 64 stem (111x111 out) ran 6.2 ms here against
    5.3, its 64 planes written three rows at a time (MobileNet v2's 3 -> 32 2.5 against 2.9)."""
    return int(x_shape[0]) == 1 and applies(geom, int(x_shape[1]))


def computed_products(batch: int, channels: int, kernels: int, geom: Geometry) -> int:
    """Multiply-adds the kernel carries out, the dropped ones included (rows to whole units, columns to
    whole vectors, kernels to whole blocks)."""
    rows, columns = geom.axes
    positions = round_up(rows.out, ROWS) * round_up(columns.out, lv.LANES)
    return batch * positions * round_up(kernels, KERNEL_BLOCK) * channels * rows.kernel * columns.kernel


def buffer_shapes(channels: int, kernels: int, geom: Geometry) -> tuple[tuple[int, int], tuple[int, int]]:
    """No scratch: X and Y are read and written where they lie."""
    return (0, 0), (0, 0)


# -- the compiled block ------------------------------------------------------------------------------
@intrinsic
def _unit(
    typingctx, x, x_start, channels, plane, height, width, top, left, wt, wt_start, bias, bias_start,
    kernels, low, high, y, y_start, y_plane, out_w, rows, window,
):  # noqa: ANN001, ANN202  # fmt: skip
    """One block of ``KERNEL_BLOCK`` kernels over ``ROWS`` output rows (the first ``rows`` of them stored)
    and all ``out_w`` columns: X's image from ``x_start`` of the flat ``x`` (``channels`` planes of
    ``plane`` floats, ``height`` x ``width``), output row 0 of the unit reading from input row ``top``,
    column 0 from input column ``left``; the blocked weights ``[C, taps, 8]`` from ``wt_start``; kernel
    k's bias ``bias[bias_start + k]``, the first ``kernels`` of the block stored, clamped to ``low`` ..
    ``high``, into Y's planes (``y_plane`` apart) from ``y_start`` (row 0 of the unit, kernel 0 of the
    block). ``window`` picks the body."""
    arguments = (x, x_start, channels, plane, height, width, top, left, wt, wt_start, bias, bias_start, kernels,
                 low, high, y, y_start, y_plane, out_w, rows, window)  # fmt: skip
    for array in (x, wt, bias, y):  # the IR reads and writes floats through data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_unit takes flat float32 arrays, not {array}")
    signature = types.void(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args)
        for index in (0, 8, 10, 15):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        x_size = lv.array_size(context, builder, sig.args[0], args[0])
        for size in WINDOWS:
            with builder.if_then(builder.icmp_signed("==", args[20], lv.INT(size))):
                _Unit(builder, values[:20], size, x_size).emit()
        return context.get_dummy_value()

    return signature, codegen


class _Unit:
    """The IR of one unit (see ``_unit``) for a fixed window size."""

    def __init__(self, builder: ir.IRBuilder, values: list[ir.Value], window: int, size: ir.Value):
        self.builder, self.window, self.size = builder, window, size  # size: the flat X's floats
        (self.x, self.x_start, self.channels, self.plane, self.height, self.width, self.top, self.left, self.wt,
         self.wt_start, self.bias, self.bias_start, self.kernels, self.low, self.high, self.y, self.y_start,
         self.y_plane, self.out_w, self.rows) = values  # fmt: skip
        self.fma = lv.fused_multiply_add(builder)
        self.input_rows = (ROWS - 1) * STRIDE + window

    def emit(self) -> None:
        builder = self.builder
        chunks = builder.sdiv(builder.add(self.out_w, lv.INT(lv.LANES - 1)), lv.INT(lv.LANES))
        with cgutils.for_range(builder, chunks) as chunk:
            first = builder.mul(chunk.index, lv.INT(lv.LANES))
            column = builder.add(self.left, builder.mul(first, lv.INT(STRIDE)))
            slots = lv.accumulators(builder, KERNEL_BLOCK, ROWS)
            masks = stride_two.column_masks(builder, column, self.width, self.window)
            with cgutils.for_range(builder, self.channels) as channel:
                self._channel(channel.index, column, masks, slots)
            self._store(first, slots)

    def _channel(self, channel: ir.Value, column: ir.Value, masks: list[ir.Value], slots: list[list[ir.Value]]) -> None:
        """Every tap of one input channel into the accumulators."""
        builder, window = self.builder, self.window
        plane_start = builder.add(self.x_start, builder.mul(channel, self.plane))
        taps = window * window
        weights = builder.add(self.wt_start, builder.mul(channel, lv.INT(taps * KERNEL_BLOCK)))
        fill = lv.float_vector(lv.LANES, 0.0)
        for t in range(self.input_rows):
            row = builder.add(self.top, lv.INT(t))
            readers = [(r, t - r * STRIDE) for r in range(ROWS) if 0 <= t - r * STRIDE < window]
            with builder.if_then(builder.icmp_unsigned("<", row, self.height)):  # rows in the padding: skipped
                row_at = builder.add(plane_start, builder.mul(row, self.width))
                self._prefetch_next_unit(builder.add(row_at, column))
                loaded = stride_two.load_row(builder, self.x, self.size, row_at, column, self.width, fill)
                columns = stride_two.WindowColumns(builder, loaded)
                for j in range(window):
                    values = builder.select(masks[j], columns.column(j), fill)
                    for r, i in readers:
                        tap = builder.add(weights, lv.INT((i * window + j) * KERNEL_BLOCK))
                        for k in range(KERNEL_BLOCK):
                            weight = lv.broadcast(builder, lv.load_scalar(builder, self.wt, builder.add(tap, lv.INT(k))))
                            slot = slots[k][r]
                            builder.store(builder.call(self.fma, [values, weight, builder.load(slot)]), slot)

    def _prefetch_next_unit(self, start: ir.Value) -> None:
        """Prefetch the columns read from ``start`` in the row the next unit reads there (``ROWS *
        STRIDE`` rows down): a unit reads ``input_rows`` rows of each channel side by side, more streams
        than the hardware prefetcher follows when X comes from memory (a network's feed, read first)."""
        builder = self.builder
        ahead = builder.add(start, builder.mul(self.width, lv.INT(ROWS * STRIDE)))
        for line in range(lv.LANES * STRIDE // lv.LINE_FLOATS):
            lv.prefetch(builder, self.x, builder.add(ahead, lv.INT(line * lv.LINE_FLOATS)))

    def _store(self, first: ir.Value, slots: list[list[ir.Value]]) -> None:
        """The block's kernels below ``kernels`` and rows below ``rows``: bias, clamp, then into Y."""
        builder = self.builder
        mask = lv.lanes_inside(builder, first, lv.LANES, self.out_w)
        low, high = lv.broadcast(builder, self.low), lv.broadcast(builder, self.high)
        for k in range(KERNEL_BLOCK):
            with builder.if_then(builder.icmp_signed("<", lv.INT(k), self.kernels)):
                bias = lv.broadcast(builder, lv.load_scalar(builder, self.bias, builder.add(self.bias_start, lv.INT(k))))
                plane = builder.add(self.y_start, builder.add(builder.mul(lv.INT(k), self.y_plane), first))
                for r in range(ROWS):
                    with builder.if_then(builder.icmp_signed("<", lv.INT(r), self.rows)):
                        value = lv.clamp(builder, builder.fadd(builder.load(slots[k][r]), bias), low, high)
                        offset = builder.add(plane, builder.mul(lv.INT(r), self.out_w))
                        lv.masked_store(builder, value, self.y, offset, mask)


# -- loops over units --------------------------------------------------------------------------------
@numba.njit(nogil=True, cache=True)
def _units(x, wt, bias, low, high, y, image_stride, out_h, out_w, kernels, pad_top, pad_left, window,  # noqa: ANN001
           first, last):  # fmt: skip
    """Units ``first .. last - 1`` (unit u: image ``u // units``, output rows from ``ROWS * (u % units)``,
    ``units`` per image) into the flat Y ``y`` (images ``image_stride`` apart, each ``[K, OH, OW]``)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    plane = height * width
    flat_x, flat_w = x.reshape(-1), wt.reshape(-1)
    units = (out_h + ROWS - 1) // ROWS
    blocks = wt.shape[0]
    block_weights = channels * window * window * KERNEL_BLOCK
    out_plane = out_h * out_w
    for unit in range(first, last):
        image, row = unit // units, (unit % units) * ROWS
        rows = min(ROWS, out_h - row)
        for block in range(blocks):
            _unit(flat_x, image * channels * plane, channels, plane, height, width, row * STRIDE - pad_top,
                  -pad_left, flat_w, block * block_weights, bias, block * KERNEL_BLOCK,
                  min(KERNEL_BLOCK, kernels - block * KERNEL_BLOCK), low, high, y,
                  image * image_stride + block * KERNEL_BLOCK * out_plane + row * out_w, out_plane, out_w, rows,
                  window)  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True)
def _split_units(parts, x, wt, bias, low, high, y, image_stride, out_h, out_w, kernels, pad_top, pad_left,  # noqa: ANN001
                 window):  # fmt: skip
    """Every unit in ``parts`` runs, run by numba's threads."""
    total = x.shape[0] * ((out_h + ROWS - 1) // ROWS)
    for part in numba.prange(parts):
        _units(x, wt, bias, low, high, y, image_stride, out_h, out_w, kernels, pad_top, pad_left, window,
               total * part // parts, total * (part + 1) // parts)  # fmt: skip


class _Bound:
    """What every call over one geometry passes the loops besides the arrays."""

    def __init__(self, geom: Geometry, kernels: int, bounds: Bounds):
        rows, columns = geom.axes
        self.out_h, self.out_w = rows.out, columns.out
        self.numbers = (self.out_h, self.out_w, kernels, rows.pad_begin, columns.pad_begin, rows.kernel)
        self.low, self.high = bounds

    def units(self, batch: int) -> int:
        return batch * -(-self.out_h // ROWS)

    def run(self, x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, first: int, last: int) -> None:
        images = output_images(y)
        _units(x, wt, bias, self.low, self.high, images.flat, images.stride, *self.numbers, first, last)


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geom: Geometry,
    bounds: Bounds,
    y: np.ndarray,
    mask: np.ndarray | None = None,
    wt: np.ndarray | None = None,
    buffers: PartBuffers | None = None,
) -> np.ndarray:
    """``jit_direct.conv2d`` for the windows ``applies`` takes: same arguments and results, no ``mask``
    and no scratch (``buffers`` is not read). The units are split over the kernel threads."""
    if mask is not None:
        raise ValueError("the strided direct Conv reads X as it is: no mask")
    wt = blocked_weights(w) if wt is None else wt
    bias = np.zeros(w.shape[0], np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    bound = _Bound(geom, int(w.shape[0]), bounds)
    total = bound.units(int(x.shape[0]))
    parts = max(1, min(intra_op_threads(), total))
    parallel_for(lambda part: bound.run(x, wt, bias, y, total * part // parts, total * (part + 1) // parts), parts, parts)
    return y


def bind_one_part(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    """``run(x, wt, bias, y)``: every unit on the calling thread."""
    bound = _Bound(geom, kernels, bounds)
    total = bound.units(int(x_shape[0]))
    return lambda x, wt, bias, y: bound.run(x, wt, bias, y, 0, total)


def bind_block_split(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> BlockSplit:
    """The units shared out in ``parts`` runs: by numba's threads (``native``) or as the chunks of a
    spin-pool job (``job``, which a captured run replays)."""
    bound = _Bound(geom, kernels, bounds)
    total = bound.units(int(x_shape[0]))

    def native(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> None:
        images = output_images(y)
        _split_units(min(parts, total), x, wt, bias, bound.low, bound.high, images.flat, images.stride,
                     *bound.numbers)  # fmt: skip

    def job(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> Job:
        images = output_images(y)
        numbers = (images.stride, *bound.numbers, bounds_word(bounds))
        block = argument_block(_BLOCK_SLOTS, (x, wt, bias, images.flat), numbers)
        return Job(_job_address(), block, max(1, min(parts, total)), (x, wt, bias, images.flat))

    return BlockSplit(native, job)


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block: X and the blocked weights (4-D), the bias and Y (1-D), then 8 numbers:
#: Y's image stride, out_h, out_w, kernels, pad_top, pad_left, the window, the bounds (``bounds_word``).
_BLOCK_SLOTS = 5 + 5 + 2 + 2 + 8


def _units_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """Chunk ``chunk``'s run of the units, as a spin-pool job."""
    x, wt, bias, y = float32_4d(args, 0), float32_4d(args, 5), float32_1d(args, 10), float32_1d(args, 12)
    out_h = args[15]
    total = x.shape[0] * ((out_h + ROWS - 1) // ROWS)
    low, high = word_bounds(args[21])
    _units(x, wt, bias, low, high, y, args[14], out_h, args[16], args[17], args[18], args[19], args[20],
           total * chunk // chunks, total * (chunk + 1) // chunks)  # fmt: skip


@functools.cache
def _job_address() -> int:
    return spin_pool.job(_units_job)
