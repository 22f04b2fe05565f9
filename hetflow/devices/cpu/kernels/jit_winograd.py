"""Winograd's input and output transforms compiled with numba, with the padding, crop, bias and activation.

In numpy the transforms were a gather copy of every tile, a GEMM with the 36x36 Kronecker matrix
``B^T (x) B^T``, another with ``A^T (x) A^T`` and a transposing scatter: five passes over arrays 2.25x
the input's size, and 1296 multiply-adds per tile element where the separable form needs 432 (most of
them by 0 or +-1). On one core they took twice as long as the layer's GEMMs (VGG-19's 64x224x224 layer:
42 of 61 ms). Here each plane is read once and its transform written once:

* input (``input_transform``): for a row of tiles, the a input rows (zero outside X) are combined
  with B^T's coefficients down the columns, the result is split into the a column phases of every tile
  (so that the next step reads contiguous runs), and the phases are combined with B^T's coefficients
  across, into ``V [a*a, C, T]``, the layout the batched GEMM reads;
* output (``output_transform``): the reverse, from the products ``M [a*a, K, T]`` to Y rows, with the
  bias added, the activation applied and the tiles past the output's edge cropped on the way out.

The matrices come in as tuples of scalars: their size is then part of the compiled function's type,
so the loops over a tile's a coefficients are unrolled and each output is summed in a register
(1.7x faster than accumulating in memory, coefficient by coefficient). Tiles are processed in bands
of whole tile rows so that the loops over tiles stay long on small maps. Planes (image x channel) are
split over the session's kernel threads (``parallel_planes``; the compiled loops release the GIL), or,
on a spinning run, shared out on its pool (``_spin_input``, ``output_transform``): at batch 1 the
transforms of F(4,3) on 64x56x56 took 760 us on one thread beside a 190 us GEMM.

On a CPU with AVX-512's gathers, float32 transforms of C-contiguous arrays run with 16 tiles in the
vector lanes instead (``jit_winograd_lanes``: 2-4.6x faster, one core, from 7x7 to 56x56 maps); these
loops are what other CPUs, float64 and strided arrays run.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_winograd_lanes
from hetflow.devices.cpu.kernels.buffers import flat_images
from hetflow.devices.cpu.kernels.jit_epilogue import NO_ACTIVATION, activation_code, store_activated
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_3d, float32_4d
from hetflow.devices.cpu.threads import parallel_planes, spin_split
from hetflow.ops.activation import FusedActivation

Coefficients = tuple[tuple[float, ...], ...]


def coefficients(matrix: np.ndarray, dtype: np.dtype) -> Coefficients:
    """``matrix`` as the compiled transforms take it: a tuple of rows of ``dtype`` scalars."""
    scalar = np.dtype(dtype).type
    return tuple(tuple(scalar(value) for value in row) for row in matrix)


def input_transform(
    x: np.ndarray, bt: Coefficients, m: int, pads: tuple[int, int], tiles: tuple[int, int], v: np.ndarray
) -> None:
    """``v [a*a, C, N*tiles_h*tiles_w]`` = ``B^T d B`` of every a x a tile of ``x [N, C, H, W]``.

    Tile (n, i, j) starts at padded row ``i*m``, column ``j*m``, with ``pads`` = (top, left) zero rows
    and columns before X; ``bt`` is ``coefficients(B^T, x.dtype)``.
    """
    if _in_lanes(x, v):
        jit_winograd_lanes.input_transform(x, m, pads, tiles, v)
        return
    batch, channels = x.shape[:2]
    planes, per_plane = batch * channels, tiles[0] * tiles[1] * len(bt) ** 2
    numbers = (m, pads[0], pads[1], tiles[0], tiles[1], _band(tiles))
    if _spin_input(x, bt, v, numbers, planes, per_plane):
        return

    def run(first: int, last: int) -> None:
        _input_planes(x, bt, v, first, last, m, pads[0], pads[1], tiles[0], tiles[1], _band(tiles))

    parallel_planes(run, planes, per_plane)


def output_transform(
    products: np.ndarray, at: Coefficients, bias: np.ndarray | None, y: np.ndarray, tiles: tuple[int, int],
    fused: FusedActivation | None,
) -> bool:
    """``y [N, K, OH, OW]`` = ``A^T M A`` of every tile of ``products [a*a, K, N*tiles_h*tiles_w]``.

    ``at`` is ``coefficients(A^T, y.dtype)``. Tiles past OH/OW are cropped; ``bias`` is added; returns
    whether the fused activation was applied too (Relu, Clip and LeakyRelu are; the caller applies any
    other). Y's images may lie apart (a Concat's slice): the loops write through its flat memory.
    """
    code, alpha, beta = activation_code(fused)
    flat = flat_images(y)
    if flat is None:  # images not contiguous themselves: through a contiguous Y
        contiguous = np.empty(y.shape, y.dtype)
        applied = output_transform(products, at, bias, contiguous, tiles, fused)
        y[...] = contiguous
        return applied
    bias, constants, numbers = _output_arguments(y, flat[1], bias, tiles, code, alpha, beta)
    planes, per_plane = y.shape[0] * y.shape[1], int(y.shape[2]) * int(y.shape[3])
    if _in_lanes(products, flat[0]) and jit_winograd_lanes.output_transform(products, bias, flat, y.shape, tiles, fused):
        return True
    found = spin_split(planes, per_plane, (products, bias, flat[0], constants))
    if found is not None:
        _bound_output(products, at, bias, flat[0], constants, numbers, found[1]).run(found[0])
    else:

        def run(first: int, last: int) -> None:
            _output_planes(products, at, bias, flat[0], *numbers[:4], first, last, *numbers[4:], constants)

        parallel_planes(run, planes, per_plane)
    return code != NO_ACTIVATION or fused is None


def _in_lanes(*arrays: np.ndarray) -> bool:
    """Whether a transform over ``arrays`` runs with its tiles in the vector lanes (``jit_winograd_lanes``):
    float32 and C-contiguous, on a CPU with AVX-512's gathers."""
    return all(a.flags.c_contiguous for a in arrays) and jit_winograd_lanes.applies(arrays[0].dtype)


def _output_arguments(
    y: np.ndarray, image_stride: int, bias: np.ndarray | None, tiles: tuple[int, int], code: int, alpha: float,
    beta: float,
) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:  # fmt: skip
    """What an output pass reads besides the products and Y: the bias (zeros without one), the
    activation's constants, and the numbers (Y's image stride, images, OH, OW, tiles_h, tiles_w, band,
    the activation's code)."""
    bias = np.zeros(y.shape[1], y.dtype) if bias is None else np.ascontiguousarray(bias, y.dtype)
    constants = np.array([alpha, beta, 0.0], dtype=y.dtype)
    return bias, constants, (image_stride, y.shape[0], y.shape[2], y.shape[3], tiles[0], tiles[1], _band(tiles), code)


#: Tiles a compiled transform handles per pass (a band of whole tile rows): long enough for the
#: inner loops to vectorise on small maps (a 28x28 map has rows of 7 tiles), short enough that the
#: band's temporaries (a*a values per tile) stay in the L1/L2 caches.
BAND_TILES = 256


def _band(tiles: tuple[int, int]) -> int:
    """Tile rows per pass for a map of ``tiles`` = (tiles_h, tiles_w)."""
    return max(1, min(tiles[0], BAND_TILES // tiles[1]))


# NOTE on the compiled loops: no array views are taken inside them (each view costs a reference-count
# update, which measured slower than the arithmetic it feeds), and every offset added to an inner loop's
# index is unsigned: numba wraps negative indices around, and that test on a signed sum keeps the
# loop from vectorising. ``len(bt)`` and ``len(row)`` are constants of the tuples' types.
@numba.njit(nogil=True, cache=True, fastmath=True)
def _input_planes(x, bt, v, first, last, m, pad_top, pad_left, tiles_h, tiles_w, band):  # noqa: ANN001
    """Input planes ``first .. last - 1`` (plane p = image p // C, channel p % C)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    a = len(bt)
    span = tiles_w * m + a - m  # padded columns the tiles of one row read
    left = np.uint64(pad_left)
    filled = np.uint64(max(0, min(span - pad_left, width)))  # columns of X inside the span
    source = np.zeros((a, span), x.dtype)  # the a padded input rows of one row of tiles
    rows = np.empty((a, span), x.dtype)  # B^T applied down the columns of one row of tiles
    phases = np.empty((a, a, band * tiles_w), x.dtype)  # rows[i, t*m + q] as phases[i, q, t]
    count, step = np.uint64(tiles_w), np.uint64(m)
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        for band_start in range(0, tiles_h, band):
            band_rows = min(band, tiles_h - band_start)
            for tile_row in range(band_start, band_start + band_rows):
                for r in range(a):
                    source_row = tile_row * m + r - pad_top
                    inside = 0 <= source_row < height
                    for col in range(filled):
                        source[r, left + col] = x[image, channel, source_row, col] if inside else 0
                for i in range(a):
                    row = bt[i]
                    for col in range(span):
                        total = row[0] * source[0, col]
                        for r in range(1, a):
                            total += row[r] * source[r, col]
                        rows[i, col] = total
                base = np.uint64((tile_row - band_start) * tiles_w)
                for i in range(a):
                    for q in range(a):
                        offset = np.uint64(q)
                        for t in range(count):
                            phases[i, q, base + t] = rows[i, t * step + offset]
            # NOTE: V's a*a rows lie C*T elements apart, so each is written once, in a run of the band.
            start = np.uint64((image * tiles_h + band_start) * tiles_w)
            for i in range(a):
                for j in range(a):
                    row = bt[j]
                    element = i * a + j
                    for t in range(np.uint64(band_rows * tiles_w)):
                        total = row[0] * phases[i, 0, t]
                        for q in range(1, a):
                            total += row[q] * phases[i, q, t]
                        v[element, channel, start + t] = total


@numba.njit(nogil=True, cache=True, fastmath=True)
def _output_planes(products, at, bias, y, y_image, images, out_h, out_w, first, last, tiles_h, tiles_w, band, code,  # noqa: ANN001
                   constants):  # fmt: skip
    """Output planes ``first .. last - 1`` (plane p = image p // K, kernel p % K) of the flat Y ``y``, its
    images ``y_image`` elements apart, each ``[K, out_h, out_w]``."""
    kernels = products.shape[1]
    m, a = len(at), len(at[0])
    columns = np.empty((a, m, band * tiles_w), y.dtype)  # A^T applied across each tile's a columns
    lines = np.empty((m, m, band * tiles_w), y.dtype)  # output (i, t*m + j) of a band's tile at [i, j, t]
    flat_lines = lines.reshape(m * m * band * tiles_w)
    step = np.uint64(m)
    for plane in range(first, last):
        image, kernel = plane // kernels, plane % kernels
        for band_start in range(0, tiles_h, band):
            band_rows = min(band, tiles_h - band_start)
            tiles = band_rows * tiles_w
            start = np.uint64((image * tiles_h + band_start) * tiles_w)
            for r in range(a):
                first_element = r * a
                for j in range(m):
                    row = at[j]
                    for t in range(np.uint64(tiles)):
                        total = row[0] * products[first_element, kernel, start + t]
                        for s in range(1, a):
                            total += row[s] * products[first_element + s, kernel, start + t]
                        columns[r, j, t] = total
            for i in range(m):
                row = at[i]
                for j in range(m):
                    for t in range(tiles):
                        total = bias[kernel] + row[0] * columns[0, j, t]
                        for r in range(1, a):
                            total += row[r] * columns[r, j, t]
                        lines[i, j, t] = total
            store_activated(flat_lines, flat_lines, code, constants)
            for tile_row in range(band_start, band_start + band_rows):
                base = np.uint64((tile_row - band_start) * tiles_w)
                for i in range(m):
                    out_row = tile_row * m + i
                    if out_row >= out_h:
                        break
                    row_start = np.uint64(image * y_image + (kernel * out_h + out_row) * out_w)
                    for j in range(m):
                        offset = row_start + np.uint64(j)
                        for t in range(np.uint64((out_w - j + m - 1) // m)):  # the columns t*m + j < OW
                            y[t * step + offset] = lines[i, j, base + t]


# -- on the spinning pool ----------------------------------------------------------------------------
# A job's function has one signature for every call, so the coefficients travel as a flat float32 array
# and are turned back into the tuples of the transforms' F(2,3) or F(4,3) type inside it.
#: Slots of an input job's argument block: X (4-D), B^T (1-D), V (3-D), then m, pad_top, pad_left,
#: tiles_h, tiles_w, band.
_INPUT_SLOTS = 5 + 2 + 4 + 6
#: Slots of an output job's argument block: the products (3-D), A^T, the bias, the activation's
#: constants, the flat Y (1-D each), then ``_output_arguments``' numbers.
_OUTPUT_SLOTS = 4 + 2 + 2 + 2 + 2 + 8


@functools.lru_cache(maxsize=16)
def _flat(matrix: Coefficients) -> np.ndarray:
    """A coefficient matrix as the flat float32 array a job reads (never written: shared by calls)."""
    return np.array(matrix, np.float32).reshape(-1)


def _spin_input(x: np.ndarray, bt: Coefficients, v: np.ndarray, numbers: tuple[int, ...], planes: int,
                per_plane: int) -> bool:  # fmt: skip
    """``_input_planes`` over every plane on a spinning run's pool; False where it does not split there."""
    found = spin_split(planes, per_plane, (x, v))
    if found is None:
        return False
    pool, shares = found
    _bound_input(x, bt, v, numbers, shares).run(pool)
    return True


def input_job(x: np.ndarray, bt: Coefficients, m: int, pads: tuple[int, int], tiles: tuple[int, int],
              v: np.ndarray) -> Job:  # fmt: skip
    """``input_transform`` (float32, C-contiguous arrays) as a spin-pool job, what a captured run replays:
    in the shares a spinning run splits it into (``spin_split``), else in one chunk."""
    if _in_lanes(x, v):
        return jit_winograd_lanes.input_job(x, m, pads, tiles, v)
    planes, per_plane = x.shape[0] * x.shape[1], tiles[0] * tiles[1] * len(bt) ** 2
    found = spin_split(planes, per_plane, (x, v))
    numbers = (m, pads[0], pads[1], tiles[0], tiles[1], _band(tiles))
    return _bound_input(x, bt, v, numbers, 1 if found is None else found[1])


def output_job(products: np.ndarray, at: Coefficients, bias: np.ndarray | None, y: np.ndarray,
               tiles: tuple[int, int], fused: FusedActivation | None) -> Job | None:  # fmt: skip
    """``output_transform`` (float32, each image of Y C-contiguous: ``buffers.flat_images``) as a spin-pool
    job, split as ``input_job`` is; None when the compiled loop cannot apply ``fused`` (``output_transform``
    leaves it to the caller) or Y's images are not contiguous."""
    code, alpha, beta = activation_code(fused)
    flat = flat_images(y)
    if (code == NO_ACTIVATION and fused is not None) or flat is None:
        return None
    bias, constants, numbers = _output_arguments(y, flat[1], bias, tiles, code, alpha, beta)
    planes, per_plane = y.shape[0] * y.shape[1], int(y.shape[2]) * int(y.shape[3])
    if _in_lanes(products, flat[0]):
        return jit_winograd_lanes.output_job(products, bias, flat, y.shape, tiles, fused)
    found = spin_split(planes, per_plane, (products, bias, flat[0], constants))
    return _bound_output(products, at, bias, flat[0], constants, numbers, 1 if found is None else found[1])


def _bound_input(x: np.ndarray, bt: Coefficients, v: np.ndarray, numbers: tuple[int, ...], shares: int) -> Job:
    arrays = (x, _flat(bt), v)
    return Job(_input_address(), argument_block(_INPUT_SLOTS, arrays, numbers), shares, arrays)


def _bound_output(products: np.ndarray, at: Coefficients, bias: np.ndarray, y: np.ndarray, constants: np.ndarray,
                  numbers: tuple[int, ...], shares: int) -> Job:  # fmt: skip
    arrays = (products, _flat(at), bias, constants, y)
    return Job(_output_address(), argument_block(_OUTPUT_SLOTS, arrays, numbers), shares, arrays)


@numba.njit(nogil=True, cache=True, inline="always")
def _row4(c, start):  # noqa: ANN001, ANN202
    """Four coefficients from ``start`` of the flat ``c`` as a tuple (a row of F(2,3)'s matrices)."""
    return (c[start], c[start + 1], c[start + 2], c[start + 3])


@numba.njit(nogil=True, cache=True, inline="always")
def _row6(c, start):  # noqa: ANN001, ANN202
    """Six coefficients from ``start`` of the flat ``c`` as a tuple (a row of F(4,3)'s matrices)."""
    return (c[start], c[start + 1], c[start + 2], c[start + 3], c[start + 4], c[start + 5])


def _input_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of X's planes through ``_input_planes`` (``_spin_input``'s block)."""
    x, c, v = float32_4d(args, 0), float32_1d(args, 5), float32_3d(args, 7)
    planes = x.shape[0] * x.shape[1]
    first, last = planes * chunk // chunks, planes * (chunk + 1) // chunks
    m, pad_top, pad_left, tiles_h, tiles_w, band = args[11], args[12], args[13], args[14], args[15], args[16]
    if c.shape[0] == 16:  # F(2,3): B^T is 4x4
        bt4 = (_row4(c, 0), _row4(c, 4), _row4(c, 8), _row4(c, 12))
        _input_planes(x, bt4, v, first, last, m, pad_top, pad_left, tiles_h, tiles_w, band)
    else:  # F(4,3): 6x6
        bt6 = (_row6(c, 0), _row6(c, 6), _row6(c, 12), _row6(c, 18), _row6(c, 24), _row6(c, 30))
        _input_planes(x, bt6, v, first, last, m, pad_top, pad_left, tiles_h, tiles_w, band)


def _output_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of Y's planes through ``_output_planes`` (``output_job``'s block)."""
    products, c, bias = float32_3d(args, 0), float32_1d(args, 4), float32_1d(args, 6)
    constants, y = float32_1d(args, 8), float32_1d(args, 10)
    y_image, images, out_h, out_w, tiles_h, tiles_w, band, code = (
        args[12], args[13], args[14], args[15], args[16], args[17], args[18], args[19]
    )  # fmt: skip
    planes = images * products.shape[1]
    first, last = planes * chunk // chunks, planes * (chunk + 1) // chunks
    if c.shape[0] == 8:  # F(2,3): A^T is 2x4
        at2 = (_row4(c, 0), _row4(c, 4))
        _output_planes(products, at2, bias, y, y_image, images, out_h, out_w, first, last, tiles_h, tiles_w, band,
                       code, constants)  # fmt: skip
    else:  # F(4,3): 4x6
        at4 = (_row6(c, 0), _row6(c, 6), _row6(c, 12), _row6(c, 18))
        _output_planes(products, at4, bias, y, y_image, images, out_h, out_w, first, last, tiles_h, tiles_w, band,
                       code, constants)  # fmt: skip


@functools.cache
def _input_address() -> int:
    return spin_pool.job(_input_job)


@functools.cache
def _output_address() -> int:
    return spin_pool.job(_output_job)
