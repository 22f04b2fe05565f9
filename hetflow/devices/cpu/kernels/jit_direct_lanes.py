"""Direct 2-D convolution (stride 1, group 1, float32) with the kernels as the vector lanes: the variant
of ``jit_direct`` for small maps.

``jit_direct`` puts 16 consecutive flat positions in a vector, so it computes every position of its
padded rows, rounded up to whole vectors: on an 8x8 map (rows 9 long, 64 of 80 positions kept) a fifth
of its work is dropped, and on 16x16 a sixteenth. Here each output position is a scalar of X
broadcast into FMAs with vectors of 16 kernels' weights, so a block is any ``POSITION_BLOCK`` positions
(listed by their flat offsets, the pad columns left out) times ``KERNEL_VECTORS`` x 16 kernels: the same
2 vector loads and 8 broadcasts per 16 FMAs as ``jit_direct``, and no position computed in vain. The
products come out position-major (``[P, K']``) and are copied into Y's planes with the bias and Relu.

The planes are ``jit_direct``'s (``flat_layout``, ``pad_image``, and the Relu mask of a backward applied
as they are copied), so dX runs here as it does there. The kernels are padded to whole blocks of
``BLOCK_KERNELS``, which makes this the variant for layers of 32, 64, 128... kernels
(``prefers_lanes``): on the Zen 4 VM, maps of 14x14 and smaller.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_direct, jit_direct_phases, jit_direct_same, jit_direct_stems
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_direct import (
    IMAGE_STRIDE_SLOT,
    X_SLOT,
    BlockSplit,
    Bounds,
    OutputImages,
    PartBuffers,
    block_shares,
    blocked_weights,
    bounds_word,
    call_parts,
    chunk_parts,
    conv_inputs,
    fit_buffers,
    flat_layout,
    image_of,
    loop_window,
    output_images,
    pad_image,
    round_up,
    share_job,
    spin_chunks,
    split_threads,
    word_bounds,
)
from hetflow.devices.cpu.spin_pool import (
    Job,
    float32_1d,
    float32_2d,
    float32_3d,
    float32_4d,
    int64_1d,
)
from hetflow.devices.cpu.threads import parallel_for
from hetflow.ops.spatial import Geometry

#: Vectors of 16 kernels per block.
KERNEL_VECTORS = 2
#: Output positions per block: KERNEL_VECTORS * POSITION_BLOCK accumulators in registers.
POSITION_BLOCK = 8
#: Kernels per block.
BLOCK_KERNELS = lv.LANES * KERNEL_VECTORS


@intrinsic
def _position_block(
    typingctx, xp, channels, plane, positions, p_start, offsets, wt, w_start, yt, y_start, y_row
):  # noqa: ANN001, ANN202, E501
    """One block of outputs, stored (not added) into ``yt``:

    ``yt[y_start + i*y_row + v*16 + lane] = sum over c, t of
    xp[c*plane + positions[p_start + i] + offsets[t]] * wt[w_start + (c*taps + t)*BLOCK_KERNELS + v*16 + lane]``

    for i < POSITION_BLOCK, v < KERNEL_VECTORS (taps = ``len(offsets)``).
    """
    signature = types.void(xp, channels, plane, positions, p_start, offsets, wt, w_start, yt, y_start, y_row)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        (
            xp_v,
            channels_v,
            plane_v,
            positions_v,
            p_start_v,
            offsets_v,
            wt_v,
            w_start_v,
            yt_v,
            y_start_v,
            y_row_v,
        ) = args
        x_data = lv.array_data(context, builder, sig.args[0], xp_v)
        positions_data = lv.array_data(context, builder, sig.args[3], positions_v)
        offsets_array = context.make_array(sig.args[5])(context, builder, offsets_v)
        taps = builder.extract_value(offsets_array.shape, 0)
        w_data = lv.array_data(context, builder, sig.args[6], wt_v)
        y_data = lv.array_data(context, builder, sig.args[8], yt_v)
        fma = lv.fused_multiply_add(builder)
        pixels = [
            lv.load_scalar(builder, positions_data, builder.add(p_start_v, lv.INT(i)))
            for i in range(POSITION_BLOCK)
        ]
        slots = lv.accumulators(builder, POSITION_BLOCK, KERNEL_VECTORS)
        block_weights = builder.mul(taps, lv.INT(BLOCK_KERNELS))
        with cgutils.for_range(builder, channels_v) as channel_loop:
            channel = channel_loop.index
            x_channel = builder.mul(channel, plane_v)
            w_channel = builder.add(w_start_v, builder.mul(channel, block_weights))
            with cgutils.for_range(builder, taps) as tap_loop:
                tap = tap_loop.index
                x_tap = builder.add(x_channel, lv.load_scalar(builder, offsets_array.data, tap))
                w_tap = builder.add(w_channel, builder.mul(tap, lv.INT(BLOCK_KERNELS)))
                weights = lv.load_vectors(builder, w_data, w_tap, KERNEL_VECTORS)
                for i in range(POSITION_BLOCK):
                    value = lv.load_scalar(builder, x_data, builder.add(x_tap, pixels[i]))
                    lv.multiply_add_broadcast(builder, fma, weights, value, slots[i])
        lv.store_accumulators(builder, slots, y_data, y_start_v, y_row_v)
        return context.get_dummy_value()

    return signature, codegen


def prefers_lanes(geom: Geometry, kernels: int) -> bool:
    """Whether a stride-1 2-D Conv with ``kernels`` output channels over ``geom`` runs faster here than in
    the flat variants (``jit_direct_same`` where it applies, else ``jit_direct``): the share of the
    computed products that are kept (positions and kernels padded to whole blocks here, flat positions to
    whole vectors there), this variant's discounted by ``LANES_SPEED`` (``ONE_BLOCK_SPEED`` for one block
    of kernels)."""
    rows, columns = geom.axes
    pixels = rows.out * columns.out
    if jit_direct_same.applies(geom):
        kept_flat = pixels / round_up(pixels, lv.LANES)
    else:
        kept_flat = pixels / flat_layout(geom).span
    kept_lanes = pixels / round_up(pixels, POSITION_BLOCK) * kernels / round_up(kernels, BLOCK_KERNELS)
    speed = LANES_SPEED if kernels > BLOCK_KERNELS else ONE_BLOCK_SPEED
    return kept_lanes * speed > kept_flat


#: Pixels per tile of the copy into Y's planes.
COPY_TILE = 16
#: This variant's speed per kept product relative to ``jit_direct``'s: its weights stream from L2 and
#: its products reach Y through a transposing copy. Sessions of one Conv (3x3 pad 1, fused Relu), both
#: variants in one process, Zen 4 VM (2026-12-06), the time ratio lanes / flat at one and two threads and
#: the speed it implies: 8x8 128 -> 128 (batch 16) 0.82 / 0.82, 0.98; 16x16 64 -> 64 0.97 / 1.00, 0.94-0.97;
#: 32x32 32 -> 32 1.04 / 1.08, 0.90-0.94; 28x28 16 -> 32 1.06 / 1.09, 0.88-0.90; 28x28 and 56x56 64 -> 64
#: (batch 4) 1.00-1.03, 0.94-0.97; 7x7 256 -> 256, 13x13 and 14x14 0.87-0.95 (lanes). It was 0.8 while
#: ``jit_direct`` rounded its span to blocks of 32 (an 8x8 map's 72 positions computed as 96). Against
#: ``jit_direct_same`` (no copies, masked loads) the same speed holds: one Conv and its Relu, 2 threads,
#: batch 1, same / lanes time (Zen 4 VM, 2026-12-06): 128 -> 128 at 8x8 0.94, 128 at 13x13 0.95, 64 at
#: 14x14 0.87, 256 at 7x7 1.13 (whose 49 positions there are 64, here 56).
LANES_SPEED = 0.93
#: ``LANES_SPEED`` for layers of one block of kernels (``BLOCK_KERNELS`` or fewer): an image's work then
#: does not split over two threads here, where ``jit_direct``'s blocks of 8 do. cifar10-quick at batch 1
#: (its 32-kernel 5x5 layers at 32x32 and 16x16 in lanes at 0.93): 0.15 -> 0.21 ms.
ONE_BLOCK_SPEED = 0.8


@functools.lru_cache(maxsize=1024)
def position_offsets(geom: Geometry) -> np.ndarray:
    """The flat offset (``r*width + s``) of every output pixel in row-major order, padded with the last
    one to whole blocks of POSITION_BLOCK (those rows of the products are never copied out)."""
    rows, columns = geom.axes
    width = flat_layout(geom).width
    pixels = (np.arange(rows.out)[:, None] * width + np.arange(columns.out)).reshape(-1).astype(np.int64)
    padded = np.full(round_up(pixels.size, POSITION_BLOCK), pixels[-1], np.int64)
    padded[: pixels.size] = pixels
    return padded


def computed_products(batch: int, channels: int, kernels: int, geom: Geometry) -> int:
    """Multiply-adds ``conv2d`` carries out, the dropped ones included: output pixels in whole position
    blocks, kernels in whole kernel blocks."""
    rows, columns = geom.axes
    pixels = round_up(rows.out * columns.out, POSITION_BLOCK)
    return batch * pixels * round_up(kernels, BLOCK_KERNELS) * channels * rows.kernel * columns.kernel


def buffer_shapes(channels: int, kernels: int, geom: Geometry) -> tuple[tuple[int, int], tuple[int, int]]:
    """One part's scratch: its padded planes ``(C, plane)`` and its position-major products ``(P rounded
    up to whole position blocks, K rounded up to whole kernel blocks)``."""
    rows, columns = geom.axes
    pixels = round_up(rows.out * columns.out, POSITION_BLOCK)
    return (channels, flat_layout(geom).plane), (pixels, round_up(kernels, BLOCK_KERNELS))


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
    """``jit_direct.conv2d`` with the kernels as the lanes: same arguments (``wt``: ``blocked_weights(w,
    BLOCK_KERNELS)``; ``buffers`` shaped by this module's ``buffer_shapes``), same results. The images are
    split over the kernel threads (with fewer images than threads, each image's kernel blocks are)."""
    call = conv_inputs(x, w, bias, geom, mask)
    wt = blocked_weights(w, BLOCK_KERNELS) if wt is None else wt
    kernels = int(w.shape[0])
    positions = position_offsets(geom)
    batch, blocks = int(x.shape[0]), int(wt.shape[0])
    threads = split_threads(computed_products(batch, int(x.shape[1]), kernels, geom), batch, blocks)
    threads, buffers = fit_buffers(threads, buffers, buffer_shapes(int(x.shape[1]), kernels, geom))
    shares, parts = call_parts(batch, threads)
    # Y as [N, K, P]: a view, as each image's planes are contiguous (also in a Concat's image-strided output).
    y_planes = y.reshape(batch, kernels, -1)
    assert np.may_share_memory(y_planes, y), "each image of Y must be contiguous"

    def run(part: int) -> None:
        if shares == 1:
            first, last = batch * part // parts, batch * (part + 1) // parts
            block_first, block_last = 0, blocks
        else:
            first, share = divmod(part, shares)
            last = first + 1
            block_first, block_last = blocks * share // shares, blocks * (share + 1) // shares
        # The part's products, position-major over its own kernel blocks.
        columns_here = (block_last - block_first) * BLOCK_KERNELS
        yt = buffers.products[part].reshape(-1)[: positions.size * columns_here].reshape(-1, columns_here)
        _images(x, call.mask, call.masking, first, last, call.pads, call.layout.width, positions, call.offsets, wt,
                block_first, block_last, call.bias, bounds, y_planes, buffers.planes[part], yt)  # fmt: skip

    parallel_for(run, parts, threads)
    return y


def bind_one_part(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    """``jit_direct.bind_one_part`` for this variant: ``run(x, wt, bias, y)`` (``wt`` blocked by
    ``BLOCK_KERNELS``), one thread, the scratch's first part, Y with C-contiguous images."""
    pads, width, offsets = loop_window(geom)
    positions = position_offsets(geom)
    batch, planes = int(x_shape[0]), buffers.planes[0]
    blocks = round_up(kernels, BLOCK_KERNELS) // BLOCK_KERNELS
    columns_here = blocks * BLOCK_KERNELS
    yt = buffers.products[0].reshape(-1)[: positions.size * columns_here].reshape(-1, columns_here)

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray) -> None:
        _images(x, x, False, 0, batch, pads, width, positions, offsets, wt, 0, blocks, bias, bounds,
                y.reshape(batch, kernels, -1), planes, yt)  # fmt: skip

    return run


def bind_block_split(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> BlockSplit:
    """``jit_direct.bind_block_split`` for this variant: each image's kernel blocks shared out over
    ``parts`` parts of ``buffers`` (a batch's images on the spinning pool), run by numba's threads or as
    a spin-pool job."""
    pads, width, offsets = loop_window(geom)
    positions = position_offsets(geom)
    batch = int(x_shape[0])
    products = buffers.products.reshape(buffers.products.shape[0], -1)

    def images_of(y: np.ndarray) -> OutputImages:
        # Y as [N, K, P] images: each image's planes are contiguous (also in a Concat's image-strided output).
        return output_images(y.reshape(batch, kernels, -1))

    def native(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> None:
        shares = block_shares(parts, batch, buffers)
        assert batch * shares <= buffers.planes.shape[0], "more images than parts of the scratch"
        images = images_of(y)
        _split_blocks(shares, x, pads, width, positions, offsets, wt, bias, bounds, images.flat, images.stride,
                      images.shape, buffers.planes, products)  # fmt: skip

    def job(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> Job:
        shares = block_shares(parts, batch, buffers)
        images = images_of(y)
        return share_job(_share_address(), (shares, bounds_word(bounds), *pads, width, *images.numbers), x,
                         (positions, offsets), wt, bias, images.flat, buffers.planes, products,
                         spin_chunks(parts, batch, shares, buffers))  # fmt: skip

    return BlockSplit(native, job)


@numba.njit(parallel=True, nogil=True, cache=True)
def _split_blocks(shares, x, pads, width, positions, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, planes,  # noqa: ANN001
                  products):  # fmt: skip
    """Every image's kernel blocks in ``shares`` shares (``_share``), the parts run by numba's threads."""
    for part in numba.prange(x.shape[0] * shares):
        _share(part, shares, x, pads, width, positions, offsets, wt, bias, bounds, y_flat, y_stride, y_shape,
               planes[part], products[part])  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _share(part, shares, x, pads, width, positions, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, xp,  # noqa: ANN001
           products):  # fmt: skip
    """Part ``part``: image ``part // shares``, its kernel-block share ``part % shares``, padding into
    ``xp`` and multiplying into ``products`` (one part of the scratch, flat); Y as
    ``jit_direct.OutputImages`` of ``[N, K, P]``."""
    blocks = wt.shape[0]
    image, share = part // shares, part % shares
    first, last = blocks * share // shares, blocks * (share + 1) // shares
    columns_here = (last - first) * BLOCK_KERNELS
    yt = products[: positions.shape[0] * columns_here].reshape((positions.shape[0], columns_here))
    _image(x, x, False, image, pads, width, positions, offsets, wt, first, last, bias, bounds,
           image_of(y_flat, y_stride, y_shape, image), xp, yt)  # fmt: skip


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_share`` over chunk ``chunk``'s run of parts as a spin-pool job (``jit_direct.pack_share``'s
    block, the positions before the offsets), in the chunk's part of the scratch."""
    x, planes, products = float32_4d(args, X_SLOT), float32_3d(args, 27), float32_2d(args, 31)
    stride, shape = args[IMAGE_STRIDE_SLOT], (args[IMAGE_STRIDE_SLOT + 1], args[IMAGE_STRIDE_SLOT + 2])
    first, last = chunk_parts(x.shape[0] * args[0], chunk, chunks)
    for part in range(first, last):
        _share(part, args[0], x, (args[2], args[3]), args[4], int64_1d(args, 14), int64_1d(args, 16),
               float32_4d(args, 18), float32_1d(args, 23), word_bounds(args[1]), float32_1d(args, 25), stride, shape,
               planes[chunk], products[chunk])  # fmt: skip


@functools.cache
def _share_address() -> int:
    return spin_pool.job(_share_job)


def direct_conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    geom: Geometry,
    bounds: Bounds,
    y: np.ndarray,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """``jit_direct.conv2d``, or a variant's where it keeps more of its work (``variant``)."""
    return variant(geom, int(w.shape[0]), x.shape).conv2d(x, w, bias, geom, bounds, y, mask=mask)


def variant(geom: Geometry, kernels: int, x_shape: Sequence[int]) -> ModuleType:
    """The direct kernel for these windows over an X of ``x_shape``: for strided ones ``jit_direct_stems``
    where it takes one image's (``jit_direct_stems.takes``: a 3x3/2 stem), else ``jit_direct_phases``;
    this module where it keeps more of its work (``prefers_lanes``), else ``jit_direct_same`` for those
    that keep the map's size and ``jit_direct`` for the others."""
    if any(axis.stride != 1 for axis in geom.axes):
        return jit_direct_stems if jit_direct_stems.takes(geom, x_shape) else jit_direct_phases
    if prefers_lanes(geom, kernels):
        return sys.modules[__name__]
    return jit_direct_same if jit_direct_same.applies(geom) else jit_direct


@numba.njit(nogil=True, cache=True)
def _images(x, mask, masking, first, last, pads, width, positions, offsets, wt, block_first, block_last,  # noqa: ANN001
            bias, bounds, y, xp, yt):  # fmt: skip
    """Images ``first .. last - 1`` (``_image``) into ``y [N, K, P]``."""
    for image in range(first, last):
        _image(x, mask, masking, image, pads, width, positions, offsets, wt, block_first, block_last, bias, bounds,
               y[image], xp, yt)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _image(x, mask, masking, image, pads, width, positions, offsets, wt, block_first, block_last,  # noqa: ANN001
           bias, bounds, y_image, xp, yt):  # fmt: skip
    """Image ``image``: pad its planes into ``xp``, multiply kernel blocks ``block_first .. block_last - 1``
    position block by position block into ``yt``, copy the products into ``y_image [K, P]``."""
    channels, plane = xp.shape[0], xp.shape[1]
    kernels = yt.shape[1]
    flat_x = xp.reshape(xp.size)
    flat_w = wt.reshape(wt.size)
    flat_y = yt.reshape(yt.size)
    block_weights = channels * offsets.shape[0] * BLOCK_KERNELS
    pad_image(x, mask, masking, image, pads, width, xp)
    for block in range(block_first, block_last):
        y_block = (block - block_first) * BLOCK_KERNELS
        for p in range(0, positions.shape[0], POSITION_BLOCK):
            _position_block(flat_x, np.int64(channels), np.int64(plane), positions, np.int64(p), offsets, flat_w,
                            np.int64(block * block_weights), flat_y, np.int64(p * kernels + y_block),
                            np.int64(kernels))  # fmt: skip
    _planes(yt, block_first * BLOCK_KERNELS, bias, bounds, y_image)


@numba.njit(nogil=True, cache=True)
def _planes(yt, kernel_first, bias, bounds, y_image):  # noqa: ANN001
    """Position-major products ``yt [P', K'']`` (kernel ``kernel_first`` onward) into ``y_image [K, P]``
    with the bias added, clamped to ``bounds``; kernels past K are dropped. Tiles of
    COPY_TILE pixels: their position-major rows stay in L1 while every kernel's part of Y is written."""
    kernels = min(yt.shape[1], y_image.shape[0] - kernel_first)
    pixels = y_image.shape[1]
    whole = pixels - pixels % COPY_TILE
    for tile in range(0, whole, COPY_TILE):
        for k in range(kernels):
            # A constant trip count: the tile's loop is unrolled.
            for p in range(tile, tile + COPY_TILE):
                y_image[kernel_first + k, p] = _output(yt[p, k], bias[kernel_first + k], bounds)
    for k in range(kernels):
        for p in range(whole, pixels):
            y_image[kernel_first + k, p] = _output(yt[p, k], bias[kernel_first + k], bounds)


@numba.njit(nogil=True, cache=True, inline="always")
def _output(product, bias, bounds):  # noqa: ANN001, ANN202
    return min(max(product + bias, bounds[0]), bounds[1])
