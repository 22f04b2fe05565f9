"""What the compiled CPU kernels (``jit_*``) share: the dtypes they run, and the activation epilogue
(which fused activations a compiled loop applies itself, and the store that applies one to a run of
values).

Relu, Clip and LeakyRelu are applied inside the loops; Sigmoid and Tanh (transcendental, rare after the
kernels that fuse them) are left to ``epilogue.apply_activation`` afterwards.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, float32_1d, float32_2d, put_arrays, put_values
from hetflow.devices.cpu.threads import owns_threads, run_planes
from hetflow.ops.activation import FusedActivation

#: dtypes the compiled loops run (other dtypes keep the kernels' numpy paths).
COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: Activation codes the compiled loop applies itself; others run afterwards in numpy.
NO_ACTIVATION, RELU, CLIP, LEAKY_RELU = 0, 1, 2, 3
_CODES = {"Relu": RELU, "Clip": CLIP, "LeakyRelu": LEAKY_RELU}


def planes_view(array: np.ndarray) -> np.ndarray | None:
    """``array`` as ``[N, C, P]`` without a copy (``[1, 1, size]`` below rank 3), or None if impossible
    (the compiled per-plane loops write through it, so a copy would lose their writes)."""
    shape = (array.shape[0], array.shape[1], -1) if array.ndim >= 3 else (1, 1, -1)
    try:
        return np.reshape(array, shape, copy=False)
    except ValueError:
        return None


def activation_code(fused: FusedActivation | None) -> tuple[int, float, float]:
    """(code, alpha, beta) for the compiled epilogue; code 0 when it cannot apply ``fused`` itself."""
    if fused is None or fused.op_type not in _CODES:
        return NO_ACTIVATION, 0.0, 0.0
    return _CODES[fused.op_type], float(fused.alpha), float(fused.beta)


@numba.njit(nogil=True, cache=True, inline="always")
def store_activated(acc, target, code, constants):  # noqa: ANN001
    """``target = activation(acc)``; comparisons written so that NaN passes through, as in numpy.
    ``constants`` holds (alpha, beta, 0) in the output's dtype. One loop per activation: a branch on the
    activation inside the loop keeps the compiler from vectorising it."""
    alpha, beta, zero = constants[0], constants[1], constants[2]
    if code == RELU:
        for c in range(acc.shape[0]):
            target[c] = zero if acc[c] < zero else acc[c]
    elif code == CLIP:
        for c in range(acc.shape[0]):
            value = acc[c]
            value = alpha if value < alpha else value
            target[c] = beta if value > beta else value
    elif code == LEAKY_RELU:
        for c in range(acc.shape[0]):
            target[c] = acc[c] * alpha if acc[c] < zero else acc[c]
    else:
        target[:] = acc


#: ``finish_planes``'s bias argument when there is none (one zero per dtype; never read past index 0).
_NO_BIAS = {dtype: np.zeros(1, dtype) for dtype in COMPILED_DTYPES}


def finish_planes(y: np.ndarray, bias: np.ndarray | None, fused: FusedActivation | None) -> bool:
    """``y[:, c] = activation(y[:, c] + bias[c])`` in one compiled pass, in place; False (``y``
    untouched) when it cannot: a dtype or activation the loop does not take, or ``y`` not viewable as
    ``[N, C, P]``.

    numpy's bias add and activation are two passes over Y: on a 64x111x111 map 465 us against 140 here
    (one pass, vectorised), 2.0 ms against 0.6 at 16 images of 64x55x55. A run on its own threads (a
    batch) splits the planes over them: mobilenetv2 at batch 16, whose pointwise outputs are up to 77
    MB, 0.93x (A/B); its epilogues took 12 of its 95 ms on one thread.
    """
    if bias is None and fused is None:
        return True
    code, alpha, beta = activation_code(fused)
    if y.dtype not in COMPILED_DTYPES or (fused is not None and code == NO_ACTIVATION):
        return False
    planes = planes_view(y)
    if planes is None or planes.shape[1] == 0:
        return False
    offsets = _NO_BIAS[y.dtype] if bias is None else np.ascontiguousarray(bias, y.dtype).reshape(-1)
    constants = np.array([alpha, beta, 0.0], y.dtype)
    head = (planes, offsets, bias is not None, code, constants)
    count = planes.shape[0] * planes.shape[1]
    if owns_threads():
        run_planes(_finish, _split, head, (), count, planes.shape[2])
    else:
        # NOTE: beside BLAS's threads, still spinning from the product that made Y, a split of this
        # memory-bound pass lost: mobilenetv2 at batch 1 1.02x with its 1.2 M-element outputs split.
        _finish(*head, 0, count)
    return True


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _finish(planes, bias, has_bias, code, constants, first, last):  # noqa: ANN001, ANN202
    """Planes ``first .. last - 1`` (plane p = ``planes[p // C, p % C]``) plus ``bias[c]``, activated by
    ``code`` (NaN passes through)."""
    channels = planes.shape[1]
    for plane in range(first, last):
        n, c = plane // channels, plane % channels
        offset = bias[c] if has_bias else constants[2]
        _finish_row(planes[n, c], offset, code, constants)


@numba.njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def _split(parts, planes, bias, has_bias, code, constants):  # noqa: ANN001, ANN202
    """``_finish`` over ``parts`` ranges of the planes, run by numba's threads."""
    count = planes.shape[0] * planes.shape[1]
    for part in numba.prange(parts):
        _finish(planes, bias, has_bias, code, constants, count * part // parts, count * (part + 1) // parts)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def finish_rows(y, bias, has_bias, code, constants):  # noqa: ANN001, ANN202
    """Each row ``y[i] = activation(y[i] + bias)`` (``bias`` one value per column, unread without
    ``has_bias``), in place: a fully connected layer's epilogue, one dispatch (numpy's add and clip cost
    ~5 us of wrappers at a batch of one)."""
    for i in range(y.shape[0]):
        row = y[i]
        if has_bias:
            for j in range(row.shape[0]):
                row[j] += bias[j]
        store_activated(row, row, code, constants)


#: Slots of ``finish_rows_job``'s block: Y (2-D), the bias and the constants (1-D), has_bias, the code.
_ROWS_BLOCK_SLOTS = 9


def finish_rows_job(y: np.ndarray, bias: np.ndarray, has_bias: bool, code: int, constants: np.ndarray) -> Job:
    """``finish_rows`` on float32 arrays (``y`` C-contiguous) as a spin-pool job of one chunk."""
    block = np.zeros(_ROWS_BLOCK_SLOTS, np.int64)
    put_values(block, put_arrays(block, 0, (y, bias, constants)), (int(has_bias), code))
    return Job(_rows_address(), block, 1, (y, bias, constants))


def _rows_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``finish_rows`` as a spin-pool job (``finish_rows_job``'s block)."""
    finish_rows(float32_2d(args, 0), float32_1d(args, 3), args[7] != 0, args[8], float32_1d(args, 5))


@functools.cache
def _rows_address() -> int:
    return spin_pool.job(_rows_job)


def activation_job(
    x: np.ndarray, y: np.ndarray, code: int, alpha: float = 0.0, beta: float = 0.0, chunks: int = 1
) -> Job:
    """``y = activation(x)`` (``code``, one of the codes ``store_activated`` applies) over flat float32
    arrays, which may be the same memory, as a spin-pool job of ``chunks`` contiguous ranges: what a
    captured run replays for an activation no kernel before it took (ShuffleNet's Relu after each
    Concat, a Clip after a direct Conv)."""
    constants = np.array([alpha, beta, 0.0], np.float32)
    block = np.zeros(_ACTIVATION_BLOCK_SLOTS, np.int64)
    put_values(block, put_arrays(block, 0, (x, y, constants)), (code,))
    return Job(_activation_address(), block, chunks, (x, y, constants))


#: Slots of ``activation_job``'s block: X, Y and the constants (1-D each), the code.
_ACTIVATION_BLOCK_SLOTS = 7


def _activation_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``store_activated`` over chunk ``chunk``'s range as a spin-pool job (``activation_job``'s block)."""
    x, y = float32_1d(args, 0), float32_1d(args, 2)
    first, last = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
    store_activated(x[first:last], y[first:last], args[6], float32_1d(args, 4))


@functools.cache
def _activation_address() -> int:
    return spin_pool.job(_activation_job)


@numba.njit(nogil=True, cache=True, error_model="numpy", inline="always")
def _finish_row(row, offset, code, constants):  # noqa: ANN001, ANN202
    """``row = activation(row + offset)``; one loop per activation so that each vectorises."""
    alpha, beta, zero = constants[0], constants[1], constants[2]
    count = np.uint64(row.shape[0])
    if code == RELU:
        for j in range(count):
            value = row[j] + offset
            row[j] = zero if value < zero else value
    elif code == CLIP:
        for j in range(count):
            value = row[j] + offset
            value = alpha if value < alpha else value
            row[j] = beta if value > beta else value
    elif code == LEAKY_RELU:
        for j in range(count):
            value = row[j] + offset
            row[j] = value * alpha if value < zero else value
    else:
        for j in range(count):
            row[j] += offset


#: Slots of ``gathered_planes_job``'s block: the products, Y, the residual, the bias and the constants
#: (1-D each), then count, kernels, positions, the products' image and kernel strides, Y's image stride,
#: has_bias, has_residual, code.
_GATHERED_BLOCK_SLOTS = 19


def gathered_planes_job(
    products: np.ndarray, y: tuple[np.ndarray, int], shape: tuple[int, int, int], residual: np.ndarray | None,
    bias: np.ndarray | None, strides: tuple[int, int], code: int, constants: np.ndarray, chunks: int,
) -> Job:  # fmt: skip
    """``Y[i, k] = activation(products[i * strides[0] + k * strides[1] ...] + bias[k] + residual[i, k])``
    for a Y of ``shape`` ``(n, K, P)`` given as ``buffers.flat_images`` gives it (its flat memory and
    image stride: each image C-contiguous, the images may lie apart), in one pass, as a spin-pool job of
    ``chunks`` runs of planes: a chunk of images' products laid out kernel-major (one GEMM's ``[K, n *
    P]``: strides ``(P, n * P)``) gathered into Y, or Y's own products finished in place (``products`` Y's
    flat memory, strides Y's). ``residual`` (C-contiguous, Y's shape; it may be Y's own memory where the
    products are not) and ``bias`` may be None."""
    flat_y, image_stride = y
    count, kernels, positions = shape
    block = np.zeros(_GATHERED_BLOCK_SLOTS, np.int64)
    arrays = (products.reshape(-1), flat_y, flat_y if residual is None else residual.reshape(-1),
              constants if bias is None else bias, constants)  # fmt: skip
    numbers = (count, kernels, positions, *strides, image_stride, int(bias is not None), int(residual is not None),
               code)  # fmt: skip
    put_values(block, put_arrays(block, 0, arrays), numbers)
    return Job(_gathered_address(), block, max(1, min(chunks, count * kernels)), arrays)


def _gathered_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``gathered_planes_job``'s planes of chunk ``chunk``."""
    products, y, residual = float32_1d(args, 0), float32_1d(args, 2), float32_1d(args, 4)
    bias, constants = float32_1d(args, 6), float32_1d(args, 8)
    count, kernels, positions, image_stride, kernel_stride = args[10], args[11], args[12], args[13], args[14]
    y_image_stride, has_bias, has_residual, code = args[15], args[16] != 0, args[17] != 0, args[18]
    planes = count * kernels
    for plane in range(planes * chunk // chunks, planes * (chunk + 1) // chunks):
        image, kernel = plane // kernels, plane % kernels
        source = kernel * kernel_stride + image * image_stride
        start = image * y_image_stride + kernel * positions
        row = y[start : start + positions]
        offset = bias[kernel] if has_bias else constants[2]
        if has_residual:
            for p in range(positions):
                row[p] = products[source + p] + offset + residual[plane * positions + p]
        else:
            for p in range(positions):
                row[p] = products[source + p] + offset
        store_activated(row, row, code, constants)


@functools.cache
def _gathered_address() -> int:
    return spin_pool.job(_gathered_job)
