"""One plane of a 2-D window op swept in blocks of output rows, in LLVM IR: the loop shared by the
depthwise Conv (``jit_depthwise_rows``) and the pools (``jit_pool_rows``).

A block is ``ROWS`` output rows across all their columns, 16 outputs a vector (at stride 2 the even lanes
of 32 loaded floats). Each input row's window columns are loaded once and fed to every output row of the
block whose window covers that row, so a 3x3 window at stride 1 costs about 4 loads (not 18) per output
vector; the block's rows are independent chains, enough to hide each operation's latency. Lanes whose
column lies in the padding are never read and take the op's padding value, input rows in the padding
are skipped, and output rows past the map are computed but never stored.

Each input row's chunk also prefetches the same columns of the row the next block reads there: a block
reads 2 * ROWS + 1 rows at stride 2 (ROWS + 2 at 1) side by side, more streams than the hardware
prefetcher follows once the map comes from memory. Two threads, batch 16, minimums: 3x3/2 max pool on
64x111x111 (SqueezeNet's) 4.0 -> 1.2 ms, 3x3/1 max on 480x28x28 2.9 -> 1.5; in-run, MobileNet-v2's
depthwise layers 21 -> 11 ms. A map in cache lost nothing (one image, 64x111x111: 118 -> 90 us).

An op is a subclass saying how a vector starts (``start``), how a tap joins it (``join``) and what is
stored (``finish``); ``prepare`` emits what it keeps for the whole plane (the depthwise Conv's weights).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import stride_two

#: Output rows per block: seven independent chains, and every map of the zoo (224 / 2^k: 112, 56, 28,
#: 14, 7) a whole number of blocks; eight rows left two of 14x14's 16 rows idle and measured no faster
#: on 28x28 and larger maps (depthwise 3x3, one core). A last block of at most ``SHORT_ROWS`` rows takes
#: that many.
ROWS = 7
SHORT_ROWS = 4

#: The plane's geometry as IR values, in this order: the flat X's data pointer, the plane's start in it,
#: its height and width, the input row and column of output (0, 0)'s window corner (negative in the
#: padding), the flat Y's data pointer, the plane's start in it, the output height and width.
GEOMETRY_VALUES = 10


class RowSweep:
    """The IR of one plane's sweep for a fixed square window and stride (see the module docstring)."""

    #: What a lane in the padding reads.
    pad_value = 0.0

    def __init__(self, builder: ir.IRBuilder, geometry: list[ir.Value], window: int, stride: int, size: ir.Value):
        """``size``: the flat X's length in floats (a row at stride 2 is read in plain loads inside it)."""
        assert len(geometry) == GEOMETRY_VALUES
        self.builder, self.window, self.stride, self.size = builder, window, stride, size
        (self.x, self.x_start, self.height, self.width, self.top, self.left, self.y, self.y_start, self.out_h,
         self.out_w) = geometry  # fmt: skip
        self.piece = lv.LANES * stride  # floats loaded per input row and window column

    # -- what an op defines ------------------------------------------------------------------------
    def prepare(self) -> None:
        """Emit, once a plane, what every vector uses."""

    def start(self) -> ir.Value:
        """An output vector before any tap."""
        raise NotImplementedError

    def join(self, total: ir.Value, values: ir.Value, i: int, j: int) -> ir.Value:
        """``total`` with tap (``i``, ``j``)'s input ``values`` taken in."""
        raise NotImplementedError

    def loaded(self, values: ir.Value) -> None:
        """Called with every vector of inputs loaded (after the stride's shuffle)."""

    def finish(self, total: ir.Value, row: ir.Value, first: ir.Value) -> ir.Value:
        """What is stored of the output vector of ``row``, columns from ``first``."""
        return total

    # -- the sweep ---------------------------------------------------------------------------------
    def emit(self) -> None:
        builder = self.builder
        self.prepare()
        blocks = builder.sdiv(builder.add(self.out_h, lv.INT(ROWS - 1)), lv.INT(ROWS))
        with cgutils.for_range(builder, blocks) as block:
            first_row = builder.mul(block.index, lv.INT(ROWS))
            rows = builder.sub(self.out_h, first_row)  # more than ROWS except in the last block
            with builder.if_else(builder.icmp_signed(">", rows, lv.INT(SHORT_ROWS))) as (full, short):
                with full:
                    self._block(ROWS, first_row, rows)
                with short:
                    self._block(SHORT_ROWS, first_row, rows)

    def _block(self, size: int, first_row: ir.Value, rows: ir.Value) -> None:
        """A block of ``size`` output rows from ``first_row`` (its rows from ``rows`` on not stored), all its
        columns, 16 at a time."""
        builder = self.builder
        top = builder.add(self.top, builder.mul(first_row, lv.INT(self.stride)))
        chunks = builder.sdiv(builder.add(self.out_w, lv.INT(lv.LANES - 1)), lv.INT(lv.LANES))
        with cgutils.for_range(builder, chunks) as chunk:
            first = builder.mul(chunk.index, lv.INT(lv.LANES))
            column = builder.add(self.left, builder.mul(first, lv.INT(self.stride)))
            totals = self._accumulate(size, top, column)
            self._store(first_row, first, rows, totals)

    def _accumulate(self, size: int, top: ir.Value, column: ir.Value) -> list[ir.Value]:
        """Each output row's vector at this chunk, every input row loaded once for all the output rows
        that read it."""
        builder, window, stride = self.builder, self.window, self.stride
        fill = lv.float_vector(lv.LANES, self.pad_value)
        if stride == 2:  # each input row once, split into its window columns (``stride_two``)
            masks = stride_two.column_masks(builder, column, self.width, window)
        else:
            masks = [
                lv.lanes_inside(builder, builder.add(column, lv.INT(j)), lv.LANES, self.width)
                for j in range(window)
            ]
        slots = [cgutils.alloca_once(builder, lv.VECTOR) for _ in range(size)]
        initial = self.start()
        for slot in slots:
            builder.store(initial, slot)
        for t in range((size - 1) * stride + window):
            row = builder.add(top, lv.INT(t))
            readers = [(r, t - r * stride) for r in range(size) if 0 <= t - r * stride < window]
            with builder.if_then(
                builder.icmp_unsigned("<", row, self.height)
            ):  # rows in the padding: skipped
                row_at = builder.add(self.x_start, builder.mul(row, self.width))
                start = builder.add(row_at, column)
                self._prefetch_next_block(start)
                if stride == 2:
                    loaded = stride_two.load_row(builder, self.x, self.size, row_at, column, self.width, fill)
                    columns = stride_two.WindowColumns(builder, loaded)
                for j in range(window):
                    # NOTE: at stride 1 each column is loaded just before its FMAs: loading the three first
                    # made the 3x3 sweep 1.3-2x slower (960x7x7 on one core 35 -> 65-73 us).
                    if stride == 2:
                        values = builder.select(masks[j], columns.column(j), fill)
                    else:
                        values = lv.masked_load(builder, self.x, builder.add(start, lv.INT(j)), masks[j], fill)
                    self.loaded(values)
                    for r, i in readers:
                        builder.store(self.join(builder.load(slots[r]), values, i, j), slots[r])
        return slots

    def _prefetch_next_block(self, start: ir.Value) -> None:
        """Prefetch this chunk's columns of the input row the next block reads where this one reads
        ``start``'s (``ROWS * stride`` rows down; past the plane's last block, the next plane's rows)."""
        ahead = self.builder.add(start, self.builder.mul(self.width, lv.INT(ROWS * self.stride)))
        for line in range(self.piece // lv.LINE_FLOATS):  # the chunk's floats; the window's tail is the next chunk's
            lv.prefetch(self.builder, self.x, self.builder.add(ahead, lv.INT(line * lv.LINE_FLOATS)))

    def _store(self, first_row: ir.Value, first: ir.Value, rows: ir.Value, slots: list[ir.Value]) -> None:
        """The block's rows below ``rows`` into Y: the chunk's lanes inside the row."""
        builder = self.builder
        mask = lv.lanes_inside(builder, first, lv.LANES, self.out_w)
        for r, slot in enumerate(slots):
            with builder.if_then(builder.icmp_signed("<", lv.INT(r), rows)):
                row = builder.add(first_row, lv.INT(r))
                value = self.finish(builder.load(slot), row, first)
                offset = builder.add(self.y_start, builder.add(builder.mul(row, self.out_w), first))
                lv.masked_store(builder, value, self.y, offset, mask)
