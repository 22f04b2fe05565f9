"""Direct 2-D convolution (stride 1, group 1, float32) of "same" windows, read from X and stored into Y
where they lie: the variant of ``jit_direct`` for windows whose padding keeps the map's size.

``jit_direct`` copies every input plane into a zero-bordered plane whose rows carry a gap of padding, and
computes the gap's columns too before a second pass copies the kept ones into Y with the bias and Relu:
on a 32x32 map with 3x3 windows 34 of every 32 positions, on 16x16 18, on 8x8 10 (and ``jit_direct_lanes``
pays a transposing copy instead). When the padding keeps the map's size (``applies``: ``pad_begin +
pad_end = dilation * (kernel - 1)`` on both axes, as in every VGG-style 3x3 or 5x5 layer), output
position ``q = oy * W + ox`` is input position ``q`` too, and tap (i, j) reads X's flat plane at ``q +
(i*dh - top) * W + (j*dw - left)``: 16 consecutive positions are one vector load, except that lanes whose
row or column falls in the padding must read zero. Those lanes are masked (``masks``: per vector of
positions and tap, a bit per lane; AVX-512 masked loads never touch the masked addresses, so no margin
is needed around X), and a tap whose mask is whole for both vectors of a block runs its channels on plain
loads. So no plane is copied, no position is computed in vain, and the block's bias and Relu are applied
as its accumulators are stored into Y.

The block is ``jit_direct``'s, one vector of positions wider (``POSITION_VECTORS`` = 3 vectors times
``KERNEL_BLOCK`` kernels, 24 accumulators in registers), with the taps looped over outside the channels
(``CHANNEL_CHUNK`` at a time), so that each tap's masks are read once per chunk, not per channel. One core of the Zen 4 VM
(2026-12-06), one image, 3x3 "same" with a Relu, against ``jit_direct`` with its copies, in GFLOP/s
counted on the Conv's own multiply-adds: 32 -> 32 at 32x32 111 vs 107, 64 -> 64 at 16x16 112 vs 105,
128 -> 32 at 14x14 106 vs 92, 64 -> 64 at 56x56 114 vs 112, 3 -> 64 at 224x224 101 vs 78. With plain
loads everywhere (wrong at the borders) a prototype ran at 116-117 where the masked one ran at 111-112.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_direct
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_direct import (
    KERNEL_BLOCK,
    X_SLOT,
    BlockSplit,
    Bounds,
    PartBuffers,
    block_shares,
    blocked_weights,
    bounds_word,
    call_parts,
    chunk_parts,
    image_of,
    output_images,
    round_up,
    share_job,
    spin_chunks,
    split_threads,
    word_bounds,
)
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_4d, int64_1d
from hetflow.devices.cpu.threads import parallel_for
from hetflow.ops.spatial import Geometry

#: Vectors of positions per block: 3 x ``KERNEL_BLOCK`` = 24 accumulators, of the 32 vector registers
#: (``jit_direct`` holds 2 x 8). One core, batch 16, 3x3 "same" with a Relu (Zen 4 VM, 2026-12-06), 2 ->
#: 3 vectors: 32 -> 32 at 32x32 108 -> 112 GFLOP/s (two spinning threads 217 -> 222), 64 -> 64 at 16x16
#: 112 -> 114 (223 -> 227).
POSITION_VECTORS = 3
#: Output positions per block.
BLOCK_POSITIONS = lv.LANES * POSITION_VECTORS
#: Channels a block runs every tap over before the next ones: the X lines of 8 channels' 3 rows stay in
#: L1 across the taps, where those of 64 or 128 did not. This variant's time over ``jit_direct``'s on
#: 64 -> 64 and 128 -> 32 at 56x56 (Zen 4 VM, 2026-12-06): 0.98 / 0.97 in chunks of 8 (or 16), one core,
#: one image; without chunks 1.03 / 1.08 in two-thread sessions at batch 16.
CHANNEL_CHUNK = 8
#: A mask whose 16 lanes are all read.
WHOLE_MASK = (1 << lv.LANES) - 1

_MASK_BITS = ir.IntType(lv.LANES)
_LANE_MASK = ir.VectorType(ir.IntType(1), lv.LANES)


def applies(geom: Geometry) -> bool:
    """Whether a stride-1 2-D window keeps the map's size (no ceil-mode overhang), so that this variant
    can compute it."""
    return len(geom.axes) == 2 and all(
        axis.stride == 1
        and axis.overhang == 0
        and axis.pad_begin + axis.pad_end == axis.dilation * (axis.kernel - 1)
        for axis in geom.axes
    )


@dataclass(frozen=True)
class SameLayout:
    """Where each tap of a "same" window reads X's flat planes (see the module docstring).

    Attributes:
        plane: positions of a plane (``H * W``, the same for X and Y).
        offsets: each tap's offset from its output position (int64), in kernel order.
        masks: ``[vectors * taps]`` int64: bit ``l`` of entry ``v * taps + t`` is set where lane ``l`` of
            the vector of positions ``16v ..`` reads a pixel of X at tap ``t`` (not padding, nor past the
            plane's end).
    """

    plane: int
    offsets: np.ndarray = field(compare=False, repr=False)
    masks: np.ndarray = field(compare=False, repr=False)


@functools.lru_cache(maxsize=1024)
def same_layout(geom: Geometry) -> SameLayout:
    """The ``SameLayout`` of a window ``applies`` accepts."""
    rows, columns = geom.axes
    height, width = rows.size, columns.size
    plane = height * width
    row_steps = np.arange(rows.kernel) * rows.dilation - rows.pad_begin
    column_steps = np.arange(columns.kernel) * columns.dilation - columns.pad_begin
    offsets = (row_steps[:, None] * width + column_steps[None, :]).reshape(-1).astype(np.int64)
    vectors = -(-plane // lv.LANES)
    position = np.arange(vectors * lv.LANES)
    oy, ox = position // width, position % width
    # [taps, positions]: whether each position's tap lands on a pixel.
    iy = oy[None, :] + np.repeat(row_steps, columns.kernel)[:, None]
    ix = ox[None, :] + np.tile(column_steps, rows.kernel)[:, None]
    inside = (position[None, :] < plane) & (iy >= 0) & (iy < height) & (ix >= 0) & (ix < width)
    lane_bits = (1 << np.arange(lv.LANES, dtype=np.int64))
    masks = (inside.reshape(len(offsets), vectors, lv.LANES) * lane_bits).sum(axis=2).T
    return SameLayout(plane, offsets, np.ascontiguousarray(masks, np.int64).reshape(-1))


def computed_products(batch: int, channels: int, kernels: int, geom: Geometry) -> int:
    """Multiply-adds ``conv2d`` carries out: every position of a plane, rounded up to a whole vector, for
    every kernel of whole blocks."""
    rows, columns = geom.axes
    positions = round_up(rows.size * columns.size, lv.LANES)
    return batch * positions * round_up(kernels, KERNEL_BLOCK) * channels * rows.kernel * columns.kernel


def buffer_shapes(channels: int, kernels: int, geom: Geometry) -> tuple[tuple[int, int], tuple[int, int]]:
    """One part's scratch: none (the variant reads X and writes Y where they lie)."""
    return (0, 0), (0, 0)


def _block_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled block of ``vectors`` vectors of positions (see ``_multiply_block``)."""

    @intrinsic
    def block(typingctx, x, position, plane, channels, offsets, masks, wt, w_start, kept, bias, bounds, y, y_start):  # noqa: ANN001, ANN202, E501
        signature = types.void(x, position, plane, channels, offsets, masks, wt, w_start, kept, bias, bounds, y, y_start)

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            (x_v, position_v, plane_v, channels_v, offsets_v, masks_v, wt_v, w_start_v, kept_v, bias_v, bounds_v,
             y_v, y_start_v) = args  # fmt: skip
            offsets_array = context.make_array(sig.args[4])(context, builder, offsets_v)
            reads = _BlockReads(
                builder, lv.array_data(context, builder, sig.args[0], x_v), position_v, plane_v, offsets_array.data,
                builder.extract_value(offsets_array.shape, 0), lv.array_data(context, builder, sig.args[5], masks_v),
                lv.array_data(context, builder, sig.args[6], wt_v), w_start_v, vectors,
            )  # fmt: skip
            slots = lv.accumulators(builder, KERNEL_BLOCK, vectors)
            chunks = builder.sdiv(builder.add(channels_v, lv.INT(CHANNEL_CHUNK - 1)), lv.INT(CHANNEL_CHUNK))
            with cgutils.for_range(builder, chunks) as chunk_loop:
                first = builder.mul(chunk_loop.index, lv.INT(CHANNEL_CHUNK))
                left = builder.sub(channels_v, first)
                count = builder.select(builder.icmp_signed("<", left, lv.INT(CHANNEL_CHUNK)), left, lv.INT(CHANNEL_CHUNK))
                with cgutils.for_range(builder, reads.taps) as tap_loop:
                    reads.tap_over_channels(tap_loop.index, first, count, slots)
            bias_data = lv.array_data(context, builder, sig.args[9], bias_v)
            y_data = lv.array_data(context, builder, sig.args[11], y_v)
            low, high = (builder.extract_value(bounds_v, i) for i in (0, 1))
            _store_block(builder, slots, bias_data, (low, high), kept_v, position_v, plane_v, y_data, y_start_v)
            return context.get_dummy_value()

        return signature, codegen

    return block


class _BlockReads:
    """What a block reads (X at its positions, the masks, the weights of its kernels), as IR values of
    one ``codegen``."""

    def __init__(
        self, builder: ir.IRBuilder, x: ir.Value, position: ir.Value, plane: ir.Value, offsets: ir.Value,
        taps: ir.Value, masks: ir.Value, wt: ir.Value, w_start: ir.Value, vectors: int,
    ) -> None:  # fmt: skip
        self.builder, self.x, self.position, self.plane = builder, x, position, plane
        self.offsets, self.taps, self.masks, self.wt, self.w_start = offsets, taps, masks, wt, w_start
        self.vectors = vectors
        self.fma = lv.fused_multiply_add(builder)
        # The block's first vector's row of the mask table.
        self.first_mask = builder.mul(builder.sdiv(position, lv.INT(lv.LANES)), taps)

    def tap_over_channels(
        self, tap: ir.Value, first: ir.Value, count: ir.Value, slots: list[list[ir.Value]]
    ) -> None:
        """Tap ``tap`` of channels ``first .. first + count - 1`` into the accumulators: on plain loads
        where every lane of the block's vectors reads a pixel, else on masked ones."""
        builder = self.builder
        masks = []
        for v in range(self.vectors):
            entry = builder.add(builder.add(self.first_mask, tap), builder.mul(self.taps, lv.INT(v)))
            masks.append(builder.trunc(lv.load_scalar(builder, self.masks, entry), _MASK_BITS))
        every = masks[0]
        for mask in masks[1:]:
            every = builder.and_(every, mask)
        whole = builder.icmp_unsigned("==", every, ir.Constant(_MASK_BITS, WHOLE_MASK))
        with builder.if_else(whole) as (plain, masked):
            with plain:
                self._channels(tap, first, count, None, slots)
            with masked:
                self._channels(tap, first, count, masks, slots)

    def _channels(
        self, tap: ir.Value, first: ir.Value, count: ir.Value, masks: list[ir.Value] | None,
        slots: list[list[ir.Value]],
    ) -> None:  # fmt: skip
        builder = self.builder
        zero = lv.float_vector(lv.LANES, 0.0)
        x_tap = builder.add(self.position, lv.load_scalar(builder, self.offsets, tap))
        with cgutils.for_range(builder, count) as loop:
            channel = builder.add(first, loop.index)
            x_at = builder.add(x_tap, builder.mul(channel, self.plane))
            inputs = []
            for v in range(self.vectors):
                lanes = None if masks is None else builder.bitcast(masks[v], _LANE_MASK)
                inputs.append(lv.load_lanes(builder, self.x, builder.add(x_at, lv.INT(v * lv.LANES)), lanes, zero))
            w_at = builder.mul(builder.add(builder.mul(channel, self.taps), tap), lv.INT(KERNEL_BLOCK))
            w_at = builder.add(self.w_start, w_at)
            for k in range(KERNEL_BLOCK):
                weight = lv.load_scalar(builder, self.wt, builder.add(w_at, lv.INT(k)))
                lv.multiply_add_broadcast(builder, self.fma, inputs, weight, slots[k])


def _store_block(
    builder: ir.IRBuilder, slots: list[list[ir.Value]], bias_data: ir.Value, bounds: tuple[ir.Value, ir.Value],
    kept: ir.Value, position: ir.Value, plane: ir.Value, y_data: ir.Value, y_start: ir.Value,
) -> None:  # fmt: skip
    """Kernel k < ``kept`` of the block to ``y_data + y_start + k*plane``: its accumulators plus
    ``bias[k]``, clamped to ``bounds`` (``jit_direct.Bounds``; NaN stays); lanes past the plane's end are
    not written."""
    low_lanes, high_lanes = (lv.splat(builder, bound) for bound in bounds)
    for k, row in enumerate(slots):
        with builder.if_then(builder.icmp_signed(">", kept, lv.INT(k))):
            bias = lv.splat(builder, lv.load_scalar(builder, bias_data, lv.INT(k)))
            for v, slot in enumerate(row):
                value = builder.fadd(builder.load(slot), bias)
                value = builder.select(builder.fcmp_ordered("<", value, low_lanes), low_lanes, value)
                value = builder.select(builder.fcmp_ordered(">", value, high_lanes), high_lanes, value)
                start = builder.add(position, lv.INT(v * lv.LANES))
                at = builder.add(builder.add(y_start, builder.mul(plane, lv.INT(k))), start)
                inside = builder.icmp_signed("<=", builder.add(start, lv.INT(lv.LANES)), plane)
                with builder.if_else(inside) as (whole, part):
                    with whole:
                        lv.store_lanes(builder, value, y_data, at, None)
                    with part:
                        mask = lv.lanes_inside(builder, start, lv.LANES, plane)
                        lv.store_lanes(builder, value, y_data, at, mask)


#: One block of outputs stored into Y's image ``y`` (flat):
#:
#: ``y[y_start + k*plane + p] = clamp(bias[k] + sum over c, t of x[c*plane + p + offsets[t]] (0 where
#: masks[p // 16 * taps + t] leaves lane p % 16 out) * wt[w_start + (c*taps + t)*KERNEL_BLOCK + k], *bounds)``
#:
#: for k < ``kept`` and the positions p of the block's ``vectors`` vectors from ``position`` that lie in
#: the plane; ``_multiply_pair`` and ``_multiply_tail`` the same for two vectors and one (a plane's last).
_multiply_block = _block_intrinsic(POSITION_VECTORS)
_multiply_pair = _block_intrinsic(2)
_multiply_tail = _block_intrinsic(1)


@numba.njit(nogil=True, cache=True)
def multiply_image(x_image, offsets, masks, wt, block_first, block_last, bias, bounds, y_image):  # noqa: ANN001
    """Kernel blocks ``block_first .. block_last - 1`` of one image: ``x_image [C * plane]`` into
    ``y_image [K * plane]`` (both flat), the bias added, clamped to ``bounds``."""
    kernels = bias.shape[0]
    plane = y_image.shape[0] // kernels
    channels = x_image.shape[0] // plane
    flat_w = wt.reshape(wt.size)
    block_weights = channels * offsets.shape[0] * KERNEL_BLOCK
    whole = plane - plane % BLOCK_POSITIONS
    for block in range(block_first, block_last):
        first = block * KERNEL_BLOCK
        kept = min(KERNEL_BLOCK, kernels - first)
        block_bias = bias[first : first + kept]
        w_start = np.int64(block * block_weights)
        y_start = np.int64(first * plane)
        for position in range(0, whole, BLOCK_POSITIONS):
            _multiply_block(x_image, np.int64(position), np.int64(plane), np.int64(channels), offsets, masks,
                            flat_w, w_start, np.int64(kept), block_bias, bounds, y_image, y_start)  # fmt: skip
        position = whole
        if plane - position > lv.LANES:  # two vectors or part of a second
            _multiply_pair(x_image, np.int64(position), np.int64(plane), np.int64(channels), offsets, masks,
                           flat_w, w_start, np.int64(kept), block_bias, bounds, y_image, y_start)  # fmt: skip
            position += 2 * lv.LANES
        if position < plane:
            _multiply_tail(x_image, np.int64(position), np.int64(plane), np.int64(channels), offsets, masks,
                           flat_w, w_start, np.int64(kept), block_bias, bounds, y_image, y_start)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _images(x, first, last, offsets, masks, wt, bias, bounds, y_flat, y_stride, y_shape):  # noqa: ANN001
    """Images ``first .. last - 1`` of X ``[N, C, H, W]``, every kernel block, into Y held as
    ``jit_direct.OutputImages``."""
    for image in range(first, last):
        _share(image, 1, x, offsets, masks, wt, bias, bounds, y_flat, y_stride, y_shape)


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
    """``jit_direct.conv2d`` for a window ``applies`` accepts: same arguments, same results (``buffers``
    unused: there is no scratch). A Relu mask on X (a backward's) goes to ``jit_direct``, which applies it
    as it copies X's planes. The images are split over the kernel threads (with fewer images than
    threads, each image's kernel blocks are)."""
    if mask is not None:
        return jit_direct.conv2d(x, w, bias, geom, bounds, y, mask=mask)
    layout = same_layout(geom)
    wt = blocked_weights(w) if wt is None else wt
    kernels = int(w.shape[0])
    bias = np.zeros(kernels, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)
    x = np.ascontiguousarray(x)
    batch, blocks = int(x.shape[0]), int(wt.shape[0])
    threads = split_threads(computed_products(batch, int(x.shape[1]), kernels, geom), batch, blocks)
    images = output_images(y)
    shares, parts = call_parts(batch, threads)

    def run(part: int) -> None:
        if shares == 1:
            first, last = batch * part // parts, batch * (part + 1) // parts
            _images(x, first, last, layout.offsets, layout.masks, wt, bias, bounds, images.flat, images.stride,
                    images.shape)  # fmt: skip
        else:
            _share(part, shares, x, layout.offsets, layout.masks, wt, bias, bounds, images.flat, images.stride,
                   images.shape)  # fmt: skip

    parallel_for(run, parts, threads)
    return y


def bind_one_part(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    """``jit_direct.bind_one_part`` for this variant: ``run(x, wt, bias, y)`` (``wt`` blocked, ``bias``
    float32, each image of Y contiguous: a Concat's image-strided slice too), one thread, every image."""
    layout = same_layout(geom)
    batch = int(x_shape[0])

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray) -> None:
        images = output_images(y)
        _images(x, 0, batch, layout.offsets, layout.masks, wt, bias, bounds, images.flat, images.stride, images.shape)

    return run


def bind_block_split(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> BlockSplit:
    """``jit_direct.bind_block_split`` for this variant: each image's kernel blocks shared out over
    ``parts`` parts (as many as ``buffers`` has), run by numba's threads or as a spin-pool job. X
    C-contiguous; each image of Y contiguous (a Concat's image-strided slice too)."""
    layout = same_layout(geom)
    batch = int(x_shape[0])

    def native(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> None:
        shares = block_shares(parts, batch, buffers)
        images = output_images(y)
        _split_blocks(shares, x, layout.offsets, layout.masks, wt, bias, bounds, images.flat, images.stride,
                      images.shape)  # fmt: skip

    def job(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> Job:
        shares = block_shares(parts, batch, buffers)
        images = output_images(y)
        return share_job(_share_address(), (shares, bounds_word(bounds), 0, 0, 0, *images.numbers), x,
                         (layout.offsets, layout.masks), wt, bias, images.flat, buffers.planes, buffers.products,
                         spin_chunks(parts, batch, shares, buffers))  # fmt: skip

    return BlockSplit(native, job)


@numba.njit(parallel=True, nogil=True, cache=True)
def _split_blocks(shares, x, offsets, masks, wt, bias, bounds, y_flat, y_stride, y_shape):  # noqa: ANN001
    """Every image's kernel blocks in ``shares`` shares (``_share``), the parts run by numba's threads."""
    for part in numba.prange(x.shape[0] * shares):
        _share(part, shares, x, offsets, masks, wt, bias, bounds, y_flat, y_stride, y_shape)


@numba.njit(nogil=True, cache=True)
def _share(part, shares, x, offsets, masks, wt, bias, bounds, y_flat, y_stride, y_shape):  # noqa: ANN001
    """Part ``part``: image ``part // shares``, its kernel-block share ``part % shares``; Y as
    ``jit_direct.OutputImages``."""
    blocks = wt.shape[0]
    image, share = part // shares, part % shares
    first, last = blocks * share // shares, blocks * (share + 1) // shares
    y_image = image_of(y_flat, y_stride, y_shape, image)
    multiply_image(x[image].reshape(x[image].size), offsets, masks, wt, first, last, bias, bounds,
                   y_image.reshape(y_image.size))  # fmt: skip


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_share`` over chunk ``chunk``'s run of parts as a spin-pool job (``jit_direct.pack_share``'s
    block: the offsets, then the masks)."""
    x = float32_4d(args, X_SLOT)
    stride, shape = jit_direct.job_image_shape_3d(args)
    first, last = chunk_parts(x.shape[0] * args[0], chunk, chunks)
    for part in range(first, last):
        _share(part, args[0], x, int64_1d(args, 14), int64_1d(args, 16), float32_4d(args, 18),
               float32_1d(args, 23), word_bounds(args[1]), float32_1d(args, 25), stride, shape)  # fmt: skip


@functools.cache
def _share_address() -> int:
    return spin_pool.job(_share_job)
