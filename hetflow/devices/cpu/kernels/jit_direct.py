"""Direct 2-D convolution (stride 1, group 1, float32) over flattened zero-bordered planes, written as
explicit 16-lane vector FMAs.

Why direct: im2col copies each input value ``kh*kw`` times before a GEMM reads it, and Winograd's
transforms are passes of their own. On small channel counts those copies cost more than the
multiply-adds (the mentee's 32 -> 32 channel 32x32 layer at batch 128, one core: im2col + GEMM 37 ms,
Winograd F(4,3) 25 ms, this kernel 16 ms plus its two copies), and a 3 -> 32 channel layer, whose
GEMM is only 27 deep, runs 4x faster here.

Layout. Each input plane is copied once into a zero-bordered plane whose rows are ``width`` long: W
plus the wider of the two column pads, as one gap of zeros between two rows serves as the right padding
of the first and the left padding of the second. Output position q = ``oy * width + ox`` then reads tap
(i, j) at
``q + i*dh*width + j*dw``: every tap of 16 consecutive positions is one contiguous vector load, and the
columns past OW (``width - OW`` of each row) are computed and dropped when the planes are copied out
(``crop_products``, which also adds the bias and clamps to a fused Relu's or Clip's bounds). So any map
size, padding and dilation run one loop, and no layout other than NCHW appears.

The product (``_fma_block``): ``POSITION_VECTORS`` vectors of 16 positions times ``KERNEL_BLOCK``
kernels are 16 accumulators, held in registers across the whole reduction over channels and taps;
each step loads 2 input vectors and broadcasts 8 weights for 16 FMAs (a span of an odd number of
vectors ends in a block of one: 16x16 maps had run 288 positions for 272). numba's own loops do not
get there (16-lane loops stay scalar, and a fully unrolled block spilled its accumulators: 50-80 GFLOP/s
on one core), so the block is emitted as LLVM IR, with the reduction as IR loops so that LLVM keeps
the accumulators in registers. Measured on one core of the 2-core reference VM (AVX-512, batch 128,
3x3 pad 1): 32 -> 32 at 32x32 144 GFLOP/s, 64 -> 64 at 16x16 138, 64 -> 128 at 8x8 105 (a quarter of
its positions are dropped columns). Where the CPU lacks AVX-512, LLVM splits each 16-lane operation
in two; the results are the same.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.devices.cpu.kernels.jit_math import float32_from_bits
from hetflow.devices.cpu.spin_pool import (
    Job,
    SpinPool,
    float32_1d,
    float32_3d,
    float32_4d,
    int64_1d,
    put_array,
    put_arrays,
    put_values,
)
from hetflow.devices.cpu.threads import intra_op_threads, parallel_for
from hetflow.ops.spatial import AxisGeometry, Geometry

#: Vectors of positions per block.
POSITION_VECTORS = 2
#: Kernels per block: each broadcast weight feeds POSITION_VECTORS FMAs.
KERNEL_BLOCK = 8
#: Output positions per block.
BLOCK_POSITIONS = lv.LANES * POSITION_VECTORS


#: (low, high) a direct Conv clamps its outputs to as it copies them out: no activation (``NO_BOUNDS``), a
#: Relu (``RELU_BOUNDS``) or a Clip's (``bounds_of``). Float32 both, so the compiled loops compare in float32.
Bounds = tuple[np.float32, np.float32]
NO_BOUNDS: Bounds = (np.float32(-np.inf), np.float32(np.inf))
RELU_BOUNDS: Bounds = (np.float32(0.0), np.float32(np.inf))


def bounds_of(low: float, high: float) -> Bounds:
    """``Bounds`` from two numbers (``own_gemm.clamp_bounds``' pair)."""
    return np.float32(low), np.float32(high)


def bounds_word(bounds: Bounds) -> int:
    """``bounds`` as one int64 of a share job's argument block: low's float32 bits, then high's above them
    (``word_bounds`` reads them back)."""
    low, high = (int(np.float32(v).view(np.uint32)) for v in bounds)
    return int(np.uint64(low | (high << 32)).view(np.int64))


@numba.njit(nogil=True, cache=True, inline="always")
def word_bounds(word):  # noqa: ANN001, ANN201
    """The ``Bounds`` that ``bounds_word`` packed into ``word``."""
    return float32_from_bits(word), float32_from_bits(word >> 32)


#: Positions the computed span is rounded up to: a span of an odd number of vectors ends in a block of
#: one vector (``_FMA_TAIL``). Rounding to whole blocks of 32 computed a 16x16 map's 272 positions as 288.
SPAN_POSITIONS = lv.LANES


def _fma_block_intrinsic(vectors: int):  # noqa: ANN202
    """The compiled block of ``vectors`` vectors of positions (see ``_fma_block``'s docstring)."""

    @intrinsic
    def block(typingctx, xp, x_start, plane, channels, offsets, wt, w_start, yb, y_start, y_plane):  # noqa: ANN001, ANN202
        signature = types.void(xp, x_start, plane, channels, offsets, wt, w_start, yb, y_start, y_plane)

        def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
            xp_v, x_start_v, plane_v, channels_v, offsets_v, wt_v, w_start_v, yb_v, y_start_v, y_plane_v = args
            x_data = lv.array_data(context, builder, sig.args[0], xp_v)
            offsets_array = context.make_array(sig.args[4])(context, builder, offsets_v)
            offsets_data = offsets_array.data
            taps = builder.extract_value(offsets_array.shape, 0)
            w_data = lv.array_data(context, builder, sig.args[5], wt_v)
            y_data = lv.array_data(context, builder, sig.args[7], yb_v)
            fma = lv.fused_multiply_add(builder)
            slots = lv.accumulators(builder, KERNEL_BLOCK, vectors)
            block_weights = builder.mul(taps, lv.INT(KERNEL_BLOCK))
            with cgutils.for_range(builder, channels_v) as channel_loop:
                channel = channel_loop.index
                x_channel = builder.add(x_start_v, builder.mul(channel, plane_v))
                w_channel = builder.add(w_start_v, builder.mul(channel, block_weights))
                with cgutils.for_range(builder, taps) as tap_loop:
                    tap = tap_loop.index
                    x_tap = builder.add(x_channel, lv.load_scalar(builder, offsets_data, tap))
                    w_tap = builder.add(w_channel, builder.mul(tap, lv.INT(KERNEL_BLOCK)))
                    inputs = lv.load_vectors(builder, x_data, x_tap, vectors)
                    for k in range(KERNEL_BLOCK):
                        weight = lv.load_scalar(builder, w_data, builder.add(w_tap, lv.INT(k)))
                        lv.multiply_add_broadcast(builder, fma, inputs, weight, slots[k])
            lv.store_accumulators(builder, slots, y_data, y_start_v, y_plane_v)
            return context.get_dummy_value()

        return signature, codegen

    return block


#: One block of outputs, stored (not added) into ``yb``:
#:
#: ``yb[y_start + k*y_plane + p*16 + lane] = sum over c, t of
#: xp[x_start + c*plane + offsets[t] + p*16 + lane] * wt[w_start + (c*taps + t)*KERNEL_BLOCK + k]``
#:
#: for k < KERNEL_BLOCK, p < POSITION_VECTORS (taps = ``len(offsets)``); ``_FMA_TAIL`` the same for one
#: vector of positions (p = 0).
_fma_block = _fma_block_intrinsic(POSITION_VECTORS)
_FMA_TAIL = _fma_block_intrinsic(1)


@dataclass(frozen=True)
class FlatLayout:
    """Where a 2-D Conv's planes lie when flattened (see the module docstring).

    Attributes:
        width: the row length: W plus the wider column pad (rows share the gap between them).
        plane: elements of a zero-bordered input plane (every tap of every block stays inside it).
        span: output positions computed per plane (``OH * width`` rounded up to whole blocks).
        offsets: each tap's offset from its output position, in kernel order.
        offset_array: ``offsets`` as the int64 array the compiled loops take (shared by every call: never
            written; not flagged read-only, which numba would compile as another type).
    """

    width: int
    plane: int
    span: int
    offsets: tuple[int, ...]
    offset_array: np.ndarray = field(compare=False, repr=False)


#: Computed products (padding included) below which a share of a direct Conv is not worth a thread:
#: about 65 us of one core. The kernel threads are a Python pool whose sleeping workers take ~100 us to
#: wake on this VM; batch 1, 2 threads against 1 (16 -> 32 3x3 at 14x14: 1.0M products 35 -> 70-87 us,
#: 64 -> 32 at 28x28: 14M, 237-250 -> 279-345 us), batch 4 and 16 (20 -> 50 5x5 at 12x12: 11M, 275 ->
#: 205 us; 1 -> 20 5x5 at 28x28: 6.5M, 288 -> 212 us; 16 -> 32 3x3 at 14x14: 4.1M, 88 -> 168 us).
MIN_PRODUCTS_PER_THREAD = 3_000_000


def computed_products(batch: int, channels: int, kernels: int, geom: Geometry) -> int:
    """Multiply-adds ``conv2d`` carries out, the dropped ones included: every flat position of the span
    (pad columns too) for every kernel of whole blocks."""
    layout = flat_layout(geom)
    return batch * layout.span * round_up(kernels, KERNEL_BLOCK) * channels * len(layout.offsets)


#: Computed products a share of one image's kernel blocks needs on the Python pool (fewer images than
#: threads). Quiet VM, batch 1, 2 threads against 1, min us: 20 -> 50 5x5 at 12x12 (5.4M) 71 -> 115,
#: 32 -> 32 5x5 at 16x16 (7.4M) 94 -> 127, 16 -> 32 5x5 at 28x28 (11M) 141 -> 163, but 32 -> 64 5x5 at
#: 28x28 (44M) 509 -> 357, 64 -> 64 3x3 at 56x56 (118M) 1679 -> 1041, 64 -> 128 5x5 at 56x56 (669M)
#: 8160 -> 4251.
MIN_PRODUCTS_PER_SHARE = 20_000_000


def most_threads(products: int, batch: int, blocks: int) -> int:
    """The most threads ``conv2d`` (either variant's) splits a call of ``products`` computed products
    over, whatever the kernel threads: images from ``MIN_PRODUCTS_PER_THREAD`` a share; with fewer
    images than that, shares of an image's ``blocks`` kernel blocks from ``MIN_PRODUCTS_PER_SHARE``."""
    cap = min(products // MIN_PRODUCTS_PER_THREAD, batch * blocks)
    if batch < cap:
        cap = max(batch, min(cap, products // MIN_PRODUCTS_PER_SHARE))
    return max(1, cap)


def split_threads(products: int, batch: int, blocks: int) -> int:
    """Threads for a direct Conv: the kernel threads, no more than ``most_threads``."""
    return max(1, min(intra_op_threads(), most_threads(products, batch, blocks)))


def round_up(count: int, block: int) -> int:
    """``count`` rounded up to whole blocks of ``block``."""
    return -(-count // block) * block


# NOTE: cached: a session calls it for every direct Conv of every run, and at LeNet's sizes working
# it out again cost more than the layer's products.
@functools.lru_cache(maxsize=4096)
def flat_layout(geom: Geometry) -> FlatLayout:
    """The flattened planes of a 2-D Conv over ``geom``'s windows (stride 1)."""
    rows, columns = geom.axes
    # One gap of zeros between rows serves as the right padding of a row and the left of the next.
    width = columns.size + max(columns.pad_begin, columns.pad_end)
    offsets = tuple(
        i * rows.dilation * width + j * columns.dilation
        for i in range(rows.kernel)
        for j in range(columns.kernel)
    )
    span = round_up(rows.out * width, SPAN_POSITIONS)
    plane = max(span + offsets[-1], rows.padded * width)
    return FlatLayout(width, plane, span, offsets, np.array(offsets, np.int64))


def supports(geom: Geometry, group: int, dtype: np.dtype) -> str | None:
    """Why the direct kernel cannot compute a Conv over ``geom``, or None when it can."""
    if dtype != np.float32:
        return f"the direct Conv computes float32, not {dtype}"
    if len(geom.axes) != 2:
        return "the direct Conv is 2-D"
    if group != 1:
        return "the direct Conv computes group 1"
    if any(axis.stride != 1 for axis in geom.axes):
        return "the direct Conv computes stride 1"
    return None


def input_gradient_geometry(geom: Geometry) -> Geometry | None:
    """The windows of a stride-1 Conv's input gradient as a Conv of its own: dX is dY correlated with
    the flipped weights ``W^T`` over ``d*(k-1) - pad`` padding on each side; None where a pad exceeds
    ``d*(k-1)`` (those input positions are read by no window)."""
    axes = []
    for axis in geom.axes:
        reach = axis.dilation * (axis.kernel - 1)
        begin, end = reach - axis.pad_begin, reach - axis.pad_end
        if axis.stride != 1 or axis.overhang or begin < 0 or end < 0:
            return None
        axes.append(AxisGeometry(axis.out, axis.size, begin, end, 0, axis.kernel, 1, axis.dilation))
    return Geometry(tuple(axes))


def flipped_weights(w: np.ndarray) -> np.ndarray:
    """W ``[K, C, kh, kw]`` as the input gradient's weights ``[C, K, kh, kw]``, each window flipped."""
    return np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])


def blocked_weights(w: np.ndarray, block: int = KERNEL_BLOCK) -> np.ndarray:
    """W ``[K, C, kh, kw]`` as the blocks read it: ``[ceil(K/block), C, kh*kw, block]`` float32, the
    kernels past K zero."""
    kernels, channels = w.shape[:2]
    blocks = -(-kernels // block)
    padded = np.zeros((blocks * block, channels, math.prod(w.shape[2:])), np.float32)
    padded[:kernels] = w.reshape(kernels, channels, -1)
    return np.ascontiguousarray(padded.reshape(blocks, block, channels, -1).transpose(0, 2, 3, 1))


@dataclass(frozen=True)
class ConvInputs:
    """What both direct kernels (this one and ``jit_direct_lanes``) derive from a Conv's arguments.

    Attributes:
        layout: the flattened planes (``flat_layout``).
        offsets: each tap's offset from its output position (int64).
        bias: the bias, float32 (zeros without one).
        mask: the mask X is read through, or X itself (unread) without one.
        masking: whether there is a mask.
        pads: the padding before the rows and before the columns.
    """

    layout: FlatLayout
    offsets: np.ndarray
    bias: np.ndarray
    mask: np.ndarray
    masking: bool
    pads: tuple[int, int]


def conv_inputs(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, geom: Geometry, mask: np.ndarray | None
) -> ConvInputs:
    """``ConvInputs`` of ``conv2d``'s arguments."""
    layout = flat_layout(geom)
    rows, columns = geom.axes
    kernels = int(w.shape[0])
    return ConvInputs(
        layout,
        layout.offset_array,
        np.zeros(kernels, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32),
        x if mask is None else mask,
        mask is not None,
        (rows.pad_begin, columns.pad_begin),
    )


@dataclass(frozen=True)
class PartBuffers:
    """Scratch of a direct Conv, one slice per part of its work (``parts`` is the first axis):

    ``planes [parts, C, plane]`` for the zero-bordered input planes and ``products [parts, rows,
    columns]`` for the blocks' products (``buffer_shapes`` gives a part's). From a runtime workspace, or
    allocated per call (``allocate``).
    """

    planes: np.ndarray
    products: np.ndarray

    @staticmethod
    def allocate(parts: int, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> PartBuffers:
        planes, products = shapes
        return PartBuffers(np.empty((parts, *planes), np.float32), np.empty((parts, *products), np.float32))


def fit_buffers(
    threads: int, buffers: PartBuffers | None, shapes: tuple[tuple[int, ...], tuple[int, ...]]
) -> tuple[int, PartBuffers]:
    """The threads a call runs and its scratch: ``buffers`` when given (no more threads than its parts),
    else scratch of ``shapes`` allocated for ``threads`` parts."""
    if buffers is not None:
        return min(threads, buffers.planes.shape[0]), buffers
    return threads, PartBuffers.allocate(threads, shapes)


def buffer_shapes(channels: int, kernels: int, geom: Geometry) -> tuple[tuple[int, int], tuple[int, int]]:
    """One part's scratch: its padded planes ``(C, plane)`` and its products ``(K rounded up to whole
    blocks, span)``."""
    layout = flat_layout(geom)
    return (channels, layout.plane), (round_up(kernels, KERNEL_BLOCK), layout.span)


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
    """``y = W * X + B``, clamped to ``bounds``, for X ``[N, C, H, W]`` and W ``[K, C, kh, kw]``
    float32, C-contiguous; ``y`` ``[N, K, OH, OW]`` float32 with C-contiguous images.

    ``mask``: an array of X's shape; X is then read as ``X * (mask > 0)`` (a Relu's backward, applied as
    the planes are copied). ``wt``: ``blocked_weights(w)`` when the caller keeps it; ``buffers``: the
    scratch (else allocated), whose parts bound the threads. The images are split over the kernel
    threads (with fewer images than threads, each image's kernel blocks are).
    """
    call = conv_inputs(x, w, bias, geom, mask)
    layout, offsets, pads = call.layout, call.offsets, call.pads
    wt = blocked_weights(w) if wt is None else wt
    kernels = int(w.shape[0])
    batch, blocks = int(x.shape[0]), int(wt.shape[0])
    threads = split_threads(computed_products(batch, int(x.shape[1]), kernels, geom), batch, blocks)
    threads, buffers = fit_buffers(threads, buffers, buffer_shapes(int(x.shape[1]), kernels, geom))

    if batch >= threads:

        def images(part: int) -> None:
            first, last = batch * part // threads, batch * (part + 1) // threads
            _images(x, call.mask, call.masking, first, last, pads, layout.width, offsets, wt, call.bias, bounds, y,
                    buffers.planes[part], buffers.products[part])  # fmt: skip

        parallel_for(images, threads, threads)
        return y
    # Fewer images than threads: each image's kernel blocks are split (its planes are padded once).
    xp = buffers.planes[:batch]
    for image in range(batch):
        pad_image(x, call.mask, call.masking, image, pads, layout.width, xp[image])

    shares = max(1, threads // batch)

    def kernel_blocks(part: int) -> None:
        image, share = divmod(part, shares)
        first, last = blocks * share // shares, blocks * (share + 1) // shares
        yb = buffers.products[part][: (last - first) * KERNEL_BLOCK]
        multiply_blocks(xp[image], layout.plane, offsets, wt, first, last, layout.span, yb)
        crop_products(yb, first * KERNEL_BLOCK, layout.width, call.bias, bounds, y[image])

    parallel_for(kernel_blocks, batch * shares, threads)
    return y


def call_parts(batch: int, threads: int) -> tuple[int, int]:
    """How a variant's ``conv2d`` splits a call of ``batch`` images over ``threads``: (shares of each
    image's kernel blocks, parts): runs of whole images, one part a thread, or (fewer images than threads)
    each image's kernel blocks in ``threads // batch`` shares, one part a share."""
    shares = 1 if batch >= threads else max(1, threads // batch)
    return shares, threads if shares == 1 else batch * shares


def loop_window(geom: Geometry) -> tuple[tuple[int, int], int, np.ndarray]:
    """What the compiled loops of both variants take of ``geom``'s flat layout: the padding before the
    rows and the columns, the padded row length, and the taps' offsets."""
    layout = flat_layout(geom)
    rows, columns = geom.axes
    return (rows.pad_begin, columns.pad_begin), layout.width, layout.offset_array


def block_shares(parts: int, batch: int, buffers: PartBuffers) -> int:
    """Shares of each image's kernel blocks when ``batch`` images split over ``parts`` parts of
    ``buffers`` (``bind_block_split``): every share one part of the scratch; one share an image when
    there are at least as many images as parts."""
    return max(1, min(parts, buffers.planes.shape[0]) // batch)


def spin_chunks(parts: int, batch: int, shares: int, buffers: PartBuffers) -> int:
    """Chunks of a spin job over ``batch * shares`` parts of work: one a scratch part, each taking a
    contiguous run of the work's parts (``chunk_parts``), no more chunks than ``parts`` threads."""
    return max(1, min(batch * shares, parts, buffers.planes.shape[0]))


@numba.njit(nogil=True, cache=True)
def chunk_parts(total, chunk, chunks):  # noqa: ANN001, ANN201
    """The parts ``first .. last - 1`` of ``total`` that chunk ``chunk`` of ``chunks`` runs."""
    return total * chunk // chunks, total * (chunk + 1) // chunks


def bind_one_part(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]:
    """``conv2d`` without a mask, on one thread, bound to X's shape and the scratch's first part:
    ``run(x, wt, bias, y)`` (``wt`` blocked, ``bias`` float32) computes every image into ``y`` with its
    arguments worked out once."""
    pads, width, offsets = loop_window(geom)
    batch, planes, products = int(x_shape[0]), buffers.planes[0], buffers.products[0]

    def run(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray) -> None:
        _images(x, x, False, 0, batch, pads, width, offsets, wt, bias, bounds, y, planes, products)

    return run


class BlockSplit:
    """A direct Conv bound to shares of each image's kernel blocks (``bind_block_split``):
    ``split(x, wt, bias, y, parts, pool=None)`` runs it in ``parts`` parts of its scratch, on numba's
    threads (``native``) or as the chunks of a spin-pool job (``job``, which a captured run replays)."""

    def __init__(self, native: Callable[..., None], job: Callable[..., Job]):
        self.native = native
        self.job = job

    def __call__(
        self, x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int, pool: SpinPool | None = None
    ) -> None:
        if pool is None:
            self.native(x, wt, bias, y, parts)
        else:
            self.job(x, wt, bias, y, parts).run(pool)


def share_job(
    address: int, numbers: tuple[int, ...], x: np.ndarray, tables: tuple[np.ndarray, ...], wt: np.ndarray,
    bias: np.ndarray, y_flat: np.ndarray, planes: np.ndarray, products: np.ndarray, chunks: int,
) -> Job:  # fmt: skip
    """A direct Conv share job (``pack_share``'s block, its own) in ``chunks`` chunks."""
    block = np.zeros(SHARE_BLOCK_SLOTS, np.int64)
    pack_share(block, numbers, x, tables, wt, bias, y_flat, planes, products)
    return Job(address, block, chunks, (x, *tables, wt, bias, y_flat, planes, products))


def bind_block_split(
    x_shape: tuple[int, ...], kernels: int, geom: Geometry, bounds: Bounds, buffers: PartBuffers
) -> BlockSplit:
    """``conv2d`` without a mask, each image's kernel blocks shared out over ``parts`` parts of
    ``buffers``: the parts run by numba's threads (``_split_blocks``, a batch smaller than the threads,
    where splitting images leaves threads idle), or as the chunks of a job on the spinning pool (a batch
    of at least as many images as parts gives each chunk a run of whole images). X C-contiguous; each
    image of Y contiguous (a Concat's image-strided slice too)."""
    pads, width, offsets = loop_window(geom)
    batch = int(x_shape[0])

    def native(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> None:
        shares = block_shares(parts, batch, buffers)
        assert batch * shares <= buffers.planes.shape[0], "more images than parts of the scratch"
        images = output_images(y)
        _split_blocks(shares, x, pads, width, offsets, wt, bias, bounds, images.flat, images.stride, images.shape,
                      buffers.planes, buffers.products)  # fmt: skip

    def job(x: np.ndarray, wt: np.ndarray, bias: np.ndarray, y: np.ndarray, parts: int) -> Job:
        shares = block_shares(parts, batch, buffers)
        images = output_images(y)
        return share_job(_share_address(), (shares, bounds_word(bounds), *pads, width, *images.numbers), x, (offsets,), wt,
                         bias, images.flat, buffers.planes, buffers.products,
                         spin_chunks(parts, batch, shares, buffers))  # fmt: skip

    return BlockSplit(native, job)


@dataclass(frozen=True)
class OutputImages:
    """Y as a share job reads it: ``flat`` its memory from its first element to its last
    (``buffers.flat_images``), ``stride`` the elements between its images, ``shape`` one image's."""

    flat: np.ndarray
    stride: int
    shape: tuple[int, ...]

    @property
    def numbers(self) -> tuple[int, ...]:
        """The stride, then the image's shape: what an argument block holds of Y beside ``flat``."""
        return (self.stride, *self.shape)


def output_images(y: np.ndarray) -> OutputImages:
    """``OutputImages`` of a Y whose images are each C-contiguous."""
    found = flat_images(y)
    assert found is not None, "each image of Y must be contiguous"
    return OutputImages(found[0], found[1], tuple(int(d) for d in y.shape[1:]))


@numba.njit(nogil=True, cache=True, inline="always")
def image_of(flat, stride, shape, image):  # noqa: ANN001, ANN201
    """Image ``image`` of Y held as ``OutputImages`` (``flat``, ``stride``, ``shape``): a C-contiguous view."""
    size = 1
    for extent in shape:
        size *= extent
    start = image * stride
    return flat[start : start + size].reshape(shape)


@numba.njit(parallel=True, nogil=True, cache=True)
def _split_blocks(shares, x, pads, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, planes, products):  # noqa: ANN001
    """Every image's kernel blocks in ``shares`` shares (``_share``), the parts run by numba's threads."""
    for part in numba.prange(x.shape[0] * shares):
        _share(part, shares, x, pads, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, planes[part],
               products[part])  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _share(part, shares, x, pads, width, offsets, wt, bias, bounds, y_flat, y_stride, y_shape, xp, products):  # noqa: ANN001
    """Part ``part``: image ``part // shares``, its kernel-block share ``part % shares``, padding into
    ``xp`` and multiplying into ``products`` (one part of the scratch); Y as ``OutputImages``."""
    blocks = wt.shape[0]
    image, share = part // shares, part % shares
    first, last = blocks * share // shares, blocks * (share + 1) // shares
    pad_image(x, x, False, image, pads, width, xp)
    yb = products[: (last - first) * KERNEL_BLOCK]
    multiply_blocks(xp, xp.shape[1], offsets, wt, first, last, yb.shape[1], yb)
    crop_products(yb, first * KERNEL_BLOCK, width, bias, bounds, image_of(y_flat, y_stride, y_shape, image))


#: Slots of a direct Conv share job's argument block (``pack_share``): 9 numbers (5 of the variant's, then
#: Y's image stride and image shape, padded to 4 with zeros), then x (4-D), the int64 tables (1-D each;
#: the lanes variant's two and the phases' two), wt (4-D), bias (1-D), Y's flat memory (1-D) and the
#: scratch's planes and products (3-D, or the lanes' 2-D).
SHARE_BLOCK_SLOTS = 9 + 5 + 2 * 2 + 5 + 2 + 2 + 4 + 4
#: Where a share job's block holds Y's image stride (``pack_share``'s numbers), then its image shape.
IMAGE_STRIDE_SLOT = 5
#: Where a share job's block holds X (the first array).
X_SLOT = 9


@numba.njit(nogil=True, cache=True)
def pack_share(block, numbers, x, tables, wt, bias, y_flat, planes, products):  # noqa: ANN001, ANN201
    """The argument block of a direct Conv share job (``SHARE_BLOCK_SLOTS``): ``numbers`` (shares, the
    bounds as ``bounds_word`` packs them and three of the variant's, then Y's image stride and image
    shape, ``OutputImages.numbers``) from slot 0,
    then from ``X_SLOT`` X, the int64 ``tables`` (the taps' offsets; the lanes variant's positions first,
    the phases' window first), the weights, the bias, Y's flat memory and the scratch (``put_array`` each)."""
    block[:X_SLOT] = 0
    put_values(block, 0, numbers)
    slot = put_array(block, X_SLOT, x)
    for table in tables:
        slot = put_array(block, slot, table)
    put_arrays(block, slot, (wt, bias, y_flat, planes, products))


@numba.njit(nogil=True, cache=True, inline="always")
def job_image_shape_3d(args):  # noqa: ANN001, ANN201
    """Y's image stride and 3-D image shape as ``pack_share`` wrote them."""
    return args[IMAGE_STRIDE_SLOT], (args[IMAGE_STRIDE_SLOT + 1], args[IMAGE_STRIDE_SLOT + 2], args[IMAGE_STRIDE_SLOT + 3])


def _share_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_share`` over chunk ``chunk``'s run of parts as a spin-pool job (``pack_share``'s block), in
    the chunk's part of the scratch."""
    x, planes, products = float32_4d(args, 9), float32_3d(args, 25), float32_3d(args, 29)
    stride, shape = job_image_shape_3d(args)
    first, last = chunk_parts(x.shape[0] * args[0], chunk, chunks)
    for part in range(first, last):
        _share(part, args[0], x, (args[2], args[3]), args[4], int64_1d(args, 14), float32_4d(args, 16),
               float32_1d(args, 21), word_bounds(args[1]), float32_1d(args, 23), stride, shape, planes[chunk],
               products[chunk])  # fmt: skip


@functools.cache
def _share_address() -> int:
    return spin_pool.job(_share_job)


@numba.njit(nogil=True, cache=True)
def _images(x, mask, masking, first, last, pads, width, offsets, wt, bias, bounds, y, xp, yb):  # noqa: ANN001
    """Images ``first .. last - 1``: pad their planes into ``xp``, multiply every kernel block into ``yb``,
    crop into ``y``."""
    blocks = wt.shape[0]
    for image in range(first, last):
        pad_image(x, mask, masking, image, pads, width, xp)
        multiply_blocks(xp, xp.shape[1], offsets, wt, 0, blocks, yb.shape[1], yb)
        crop_products(yb, 0, width, bias, bounds, y[image])


@numba.njit(nogil=True, cache=True)
def pad_image(x, mask, masking, image, pads, width, xp):  # noqa: ANN001
    """Image ``image`` of X (times ``mask > 0`` when ``masking``) into zero-bordered planes ``xp [C, plane]``
    with rows ``width`` long, X's pixel (r, c) at row ``pads[0] + r``, column ``pads[1] + c``.

    Each element of ``xp`` is written once, through slices: indexing a plane as ``start + c`` made numba
    check every index for wrap-around, and a test of ``masking`` inside the row loop kept it scalar too
    (14-17 us for a 32-channel 32x32 image on one core, 6 us so).
    """
    channels, height, columns = x.shape[1], x.shape[2], x.shape[3]
    top, left = pads
    first = top * width + left
    for channel in range(channels):
        _zero_borders(xp[channel], first, width, height, columns)
    if masking:
        for channel in range(channels):
            for r in range(height):
                source, gate = x[image, channel, r], mask[image, channel, r]
                row = xp[channel, first + r * width : first + r * width + columns]
                for c in range(columns):
                    row[c] = source[c] if gate[c] > 0 else np.float32(0.0)
    else:
        for channel in range(channels):
            for r in range(height):
                source = x[image, channel, r]
                row = xp[channel, first + r * width : first + r * width + columns]
                for c in range(columns):
                    row[c] = source[c]


@numba.njit(nogil=True, cache=True, inline="always")
def _zero_borders(plane, first, width, height, columns):  # noqa: ANN001
    """Zeros wherever no pixel lands in a padded plane whose ``height`` rows of ``columns`` pixels start at
    ``first``, ``width`` apart: before the first row, in the gap after each row, after the last."""
    zero = np.float32(0.0)
    head = plane[:first]
    for i in range(head.size):
        head[i] = zero
    for r in range(height):
        gap = plane[first + r * width + columns : first + (r + 1) * width]
        for i in range(gap.size):
            gap[i] = zero
    tail = plane[first + (height - 1) * width + columns :]
    for i in range(tail.size):
        tail[i] = zero


@numba.njit(nogil=True, cache=True)
def multiply_blocks(xp, plane, offsets, wt, block_first, block_last, span, yb):  # noqa: ANN001
    """``yb [(block_last - block_first) * 8, span]``: kernel blocks ``block_first .. block_last - 1`` of one
    image's padded planes ``xp [C, plane]``."""
    channels = xp.shape[0]
    flat_x = xp.reshape(xp.size)
    flat_w = wt.reshape(wt.size)
    flat_y = yb.reshape(yb.size)
    block_weights = channels * offsets.shape[0] * KERNEL_BLOCK
    for block in range(block_first, block_last):
        y_block = (block - block_first) * KERNEL_BLOCK * span
        whole = span - span % BLOCK_POSITIONS
        for position in range(0, whole, BLOCK_POSITIONS):
            _fma_block(flat_x, np.int64(position), np.int64(plane), np.int64(channels), offsets,
                       flat_w, np.int64(block * block_weights), flat_y, np.int64(y_block + position), np.int64(span))  # fmt: skip
        if whole < span:
            _FMA_TAIL(flat_x, np.int64(whole), np.int64(plane), np.int64(channels), offsets,
                      flat_w, np.int64(block * block_weights), flat_y, np.int64(y_block + whole), np.int64(span))  # fmt: skip


@numba.njit(nogil=True, cache=True)
def crop_products(yb, kernel_first, width, bias, bounds, y_image):  # noqa: ANN001
    """Planes of ``yb`` (kernel ``kernel_first`` onward, rows ``width`` long) into ``y_image [K, OH, OW]``
    with the bias added, clamped to ``bounds``; blocks' kernels past K are dropped."""
    kernels, out_h, out_w = y_image.shape
    # max() and min() with infinite bounds where there is no activation: a branch-free row loop LLVM
    # vectorizes (a branch per element ran 3-4x slower), and NaN stays NaN as in the Relu and Clip ops.
    low, high = bounds
    for k in range(min(yb.shape[0], kernels - kernel_first)):
        kernel = kernel_first + k
        b = bias[kernel]
        for r in range(out_h):
            products = yb[k, r * width : r * width + out_w]
            row = y_image[kernel, r]
            for c in range(out_w):
                row[c] = min(max(products[c] + b, low), high)
