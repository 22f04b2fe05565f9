"""Weight gradient of a stride-1 2-D Conv (float32, group 1) over ``jit_direct``'s zero-bordered planes,
as explicit 16-lane vector FMAs with the lanes over the kernels.

For a Conv ``Y = W * X``, with X's planes laid out as in ``jit_direct`` (rows ``width`` long, tap t at
``offsets[t]`` from its output position)::

    dW[k, c, t] = sum over images n and output pixels (r, s) of
                  dY[n, k, r, s] * Xp[n, c, r*width + s + offsets[t]]

Why the lanes run over the kernels: a reduction over positions (lanes over positions) loads both
operands as vectors for every product; with kernels as lanes, dY is first copied position-major
(``[P, K]``, the Relu's mask applied and dB summed in the same pass), and then each output pixel is
``KERNEL_VECTORS`` vector loads of dY and one scalar of X per (channel, tap) pair, broadcast into an
FMA with each of them -- the shape of a GEMM's inner kernel, with X read straight from its planes (no
im2col columns). A block of ``PAIR_BLOCK`` pairs x ``KERNEL_VECTORS`` x 16 kernels is held in registers
across every pixel of a chunk of images and added into dW once.

The pairs are listed by their offsets in the padded image (``c*plane + offsets[t]``), so any window and
channel count is one loop; the pair list is padded to whole blocks with pairs whose sums are dropped.

Measured at batch 128, 3x3 pad 1, a Relu's mask, against the chunked im2col GEMMs it replaces
(``conv_train``), one core / two threads in ms: 3 -> 32 at 32x32 9.2 -> 5.4 / 5.2 -> 3.1, 32 -> 32 at
32x32 30.7 -> 20.2 / 22.2 -> 11.7, 64 -> 64 at 16x16 21.7 -> 17.8 / 15.6 -> 10.3, 64 -> 128 at 8x8
8.6 -> 9.3 / 6.9 -> 5.2. The products alone run at about 150 GFLOP/s on a core; the rest is the two
copies, which read X, dY and the mask from memory once.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_direct import flat_layout, pad_image, round_up
from hetflow.devices.cpu.threads import intra_op_threads, parallel_for
from hetflow.ops.spatial import Geometry

#: Vectors of 16 kernels per block.
KERNEL_VECTORS = 2
#: (channel, tap) pairs per block: KERNEL_VECTORS * PAIR_BLOCK accumulators, plus the dY vectors, in
#: the 32 vector registers.
PAIR_BLOCK = 9
#: Kernels per block.
BLOCK_KERNELS = lv.LANES * KERNEL_VECTORS
#: Bytes of padded X and position-major dY per chunk of images (the part of the L2 cache they share).
CHUNK_BYTES = 1 << 20
#: Positions per tile of dY's transposing copy: their position-major rows (K' floats each) stay in L1.
TRANSPOSE_TILE = 16


@intrinsic
def _gradient_block(  # noqa: ANN202
    typingctx, xp, x_start, x_image, dyt, dy_start, dy_image, dy_row, images, rows, columns, width,  # noqa: ANN001
    pair_offsets, pair_start, dwt, dw_start, dw_row,  # noqa: ANN001
):  # fmt: skip
    """Add one block of sums into ``dwt``:

    ``dwt[dw_start + j*dw_row + v*16 + lane] += sum over n < images, r < rows, s < columns of
    dyt[dy_start + n*dy_image + (r*columns + s)*dy_row + v*16 + lane] *
    xp[x_start + n*x_image + r*width + s + pair_offsets[pair_start + j]]``

    for j < PAIR_BLOCK, v < KERNEL_VECTORS.
    """
    signature = types.void(xp, x_start, x_image, dyt, dy_start, dy_image, dy_row, images, rows, columns, width,
                           pair_offsets, pair_start, dwt, dw_start, dw_row)  # fmt: skip

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        (xp_v, x_start_v, x_image_v, dyt_v, dy_start_v, dy_image_v, dy_row_v, images_v, rows_v, columns_v,
         width_v, offsets_v, pair_start_v, dwt_v, dw_start_v, dw_row_v) = args  # fmt: skip
        x_data = lv.array_data(context, builder, sig.args[0], xp_v)
        dy_data = lv.array_data(context, builder, sig.args[3], dyt_v)
        offsets_data = lv.array_data(context, builder, sig.args[11], offsets_v)
        dw_data = lv.array_data(context, builder, sig.args[13], dwt_v)
        fma = lv.fused_multiply_add(builder)
        offsets = [
            lv.load_scalar(builder, offsets_data, builder.add(pair_start_v, lv.INT(j)))
            for j in range(PAIR_BLOCK)
        ]
        slots = lv.accumulators(builder, PAIR_BLOCK, KERNEL_VECTORS)
        with cgutils.for_range(builder, images_v) as image_loop:
            image = image_loop.index
            x_image_start = builder.add(x_start_v, builder.mul(image, x_image_v))
            dy_image_start = builder.add(dy_start_v, builder.mul(image, dy_image_v))
            with cgutils.for_range(builder, rows_v) as row_loop:
                row = row_loop.index
                x_row = builder.add(x_image_start, builder.mul(row, width_v))
                dy_row_start = builder.add(dy_image_start, builder.mul(builder.mul(row, columns_v), dy_row_v))
                with cgutils.for_range(builder, columns_v) as column_loop:
                    column = column_loop.index
                    x_pixel = builder.add(x_row, column)
                    dy_pixel = builder.add(dy_row_start, builder.mul(column, dy_row_v))
                    grads = lv.load_vectors(builder, dy_data, dy_pixel, KERNEL_VECTORS)
                    for j in range(PAIR_BLOCK):
                        value = lv.load_scalar(builder, x_data, builder.add(x_pixel, offsets[j]))
                        lv.multiply_add_broadcast(builder, fma, grads, value, slots[j])
        lv.store_accumulators(builder, slots, dw_data, dw_start_v, dw_row_v, add=True)
        return context.get_dummy_value()

    return signature, codegen


def pair_offsets(channels: int, plane: int, offsets: tuple[int, ...]) -> np.ndarray:
    """Each (channel, tap) pair's offset ``c*plane + offsets[t]`` in channel-major order, padded with 0 to
    whole blocks of PAIR_BLOCK."""
    pairs = (np.arange(channels, dtype=np.int64)[:, None] * plane + np.array(offsets, np.int64)).reshape(-1)
    padded = np.zeros(round_up(pairs.size, PAIR_BLOCK), np.int64)
    padded[: pairs.size] = pairs
    return padded


def weight_gradient(
    x: np.ndarray, dy: np.ndarray, geom: Geometry, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """dW ``[K, C, kh, kw]`` and dB ``[K]`` of a stride-1 group-1 2-D Conv over ``geom`` from X
    ``[N, C, H, W]`` and dY ``[N, K, OH, OW]`` (float32, C-contiguous); dY is read as ``dY * (mask > 0)``
    when ``mask`` (dY's shape: a fused Relu's output) is given. The images are split over the kernel
    threads, each summing its own dW, added up at the end."""
    layout = flat_layout(geom)
    rows, columns = geom.axes
    batch, channels = int(x.shape[0]), int(x.shape[1])
    kernels = int(dy.shape[1])
    taps = len(layout.offsets)
    padded_kernels = round_up(kernels, BLOCK_KERNELS)
    plane = layout.plane
    offsets = pair_offsets(channels, plane, layout.offsets)
    positions = rows.out * columns.out
    image_bytes = 4 * (channels * plane + positions * padded_kernels)
    images = max(1, min(batch, CHUNK_BYTES // image_bytes))
    threads = max(1, min(intra_op_threads(), batch))
    bounds = [batch * part // threads for part in range(threads + 1)]
    masking = mask is not None
    # dY and the mask as [N, K, P] (views).
    dy_images = dy.reshape(batch, kernels, -1)
    mask_images = dy_images if mask is None else mask.reshape(batch, kernels, -1)
    pads = (rows.pad_begin, columns.pad_begin)
    # dB in float64: each thread's sums run over all of its images' positions, one at a time.
    partials: list[tuple[np.ndarray, np.ndarray]] = [
        (np.zeros((offsets.size, padded_kernels), np.float32), np.zeros(padded_kernels, np.float64))
        for _ in range(threads)
    ]

    def run(part: int) -> None:
        dwt, db = partials[part]
        _chunks(x, dy_images, mask_images, masking, bounds[part], bounds[part + 1], images, pads,
                (rows.out, columns.out), layout.width, plane, offsets, dwt, db)  # fmt: skip

    parallel_for(run, threads, threads)
    dwt = partials[0][0]
    db = partials[0][1]
    for more_dwt, more_db in partials[1:]:
        dwt += more_dwt
        db += more_db
    dw = dwt[: channels * taps, :kernels].T.reshape(kernels, channels, *geom.kernel)
    return np.ascontiguousarray(dw), db[:kernels].astype(np.float32)


@numba.njit(nogil=True, cache=True)
def _chunks(x, dy, mask, masking, first, last, images, pads, out_shape, width, plane, offsets, dwt, db):  # noqa: ANN001
    """Images ``first .. last - 1``, ``images`` at a time: pad X's planes and lay dY ``[N, K, P]`` (P =
    ``out_shape``'s pixels) out position-major, then add every block's sums into ``dwt [pairs, K']`` and
    dY's sums into ``db``."""
    channels = x.shape[1]
    rows, columns = out_shape
    padded_kernels = dwt.shape[1]
    positions = rows * columns
    xp = np.empty((images, channels, plane), np.float32)
    dyt = np.zeros((images, positions, padded_kernels), np.float32)
    flat_x = xp.reshape(xp.size)
    flat_dy = dyt.reshape(dyt.size)
    flat_dw = dwt.reshape(dwt.size)
    for start in range(first, last, images):
        count = min(images, last - start)
        for n in range(count):
            pad_image(x, x, False, start + n, pads, width, xp[n])
            _position_major(dy, mask, masking, start + n, dyt[n], db)
        for kernel_block in range(0, padded_kernels, BLOCK_KERNELS):
            for pair in range(0, offsets.shape[0], PAIR_BLOCK):
                _gradient_block(flat_x, np.int64(0), np.int64(channels * plane), flat_dy, np.int64(kernel_block),
                                np.int64(positions * padded_kernels), np.int64(padded_kernels), np.int64(count),
                                np.int64(rows), np.int64(columns), np.int64(width), offsets, np.int64(pair),
                                flat_dw, np.int64(pair * padded_kernels + kernel_block), np.int64(padded_kernels))  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _position_major(dy, mask, masking, image, dyt, db):  # noqa: ANN001
    """Image ``image`` of dY ``[N, K, P]`` (times ``mask > 0`` when ``masking``) into ``dyt [P, K']``, its
    sums added to ``db``; the kernels past K stay as they were (zero). Tiles of TRANSPOSE_TILE positions
    keep the rows being written in the L1 cache."""
    kernels, positions = dy.shape[1], dy.shape[2]
    whole = positions - positions % TRANSPOSE_TILE
    for first in range(0, whole, TRANSPOSE_TILE):
        for k in range(kernels):
            # A constant trip count: the tile's loop is unrolled.
            for p in range(first, first + TRANSPOSE_TILE):
                dyt[p, k] = _masked(dy, mask, masking, image, k, p)
    for k in range(kernels):
        for p in range(whole, positions):
            dyt[p, k] = _masked(dy, mask, masking, image, k, p)
    # dB from the rows: whole rows of kernels at a time (a running sum per kernel would wait on every add).
    for p in range(positions):
        for k in range(kernels):
            db[k] += dyt[p, k]


@numba.njit(nogil=True, cache=True, inline="always")
def _masked(dy, mask, masking, image, k, p):  # noqa: ANN001, ANN202
    value = dy[image, k, p]
    if masking:
        # A product, not a select, as the numpy rule: a NaN or inf in dY stays NaN.
        value = value * (np.float32(1) if mask[image, k, p] > 0 else np.float32(0))
    return value
