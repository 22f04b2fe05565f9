"""Per-channel scale and shift, then an activation, in one compiled pass (inference BatchNormalization).

numpy's form is three passes over the tensor (multiply, add, then the activation fused into the
BatchNormalization by ``passes/fuse_activation``). DenseNet's pre-activation blocks run 62 of them on
values no Conv precedes, so they cannot be folded away: one pass per plane reads X once and writes Y
once. Planes are split over the session's kernel threads (the loop releases the GIL), on a spinning
run as a job of its pool.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels.buffers import flat_images, image_contiguous
from hetflow.devices.cpu.kernels.jit_epilogue import (
    CLIP,
    LEAKY_RELU,
    NO_ACTIVATION,
    RELU,
    activation_code,
)
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d
from hetflow.devices.cpu.threads import spin_parts, spin_split, split_planes
from hetflow.ops.activation import FusedActivation


class _Affine(NamedTuple):
    """``channel_affine``'s operands as its loops read them."""

    arrays: tuple[np.ndarray, ...]  # X's flat images, the factor, the shift, Y's flat images, the constants
    code: int
    planes: int
    layout: tuple[int, int, int, int]  # C, a plane's size, X's image stride, Y's image stride


def _affine(x: np.ndarray, factor: np.ndarray, shift: np.ndarray, y: np.ndarray, code: int, alpha: float,
            beta: float) -> _Affine:  # fmt: skip
    constants = np.array([alpha, beta, 0.0], dtype=y.dtype)
    x_images, y_images = flat_images(x), flat_images(y)
    assert x_images is not None and y_images is not None, "each image of X and Y must be contiguous"
    (x_flat, x_stride), (y_flat, y_stride) = x_images, y_images
    factor = np.ascontiguousarray(factor, y.dtype)
    shift = np.ascontiguousarray(shift, y.dtype)
    batch, channels = x.shape[0], x.shape[1]
    size = x.size // max(1, batch * channels)
    return _Affine((x_flat, factor, shift, y_flat, constants), code, batch * channels,
                   (channels, size, x_stride, y_stride))  # fmt: skip


def channel_affine(
    x: np.ndarray, factor: np.ndarray, shift: np.ndarray, y: np.ndarray, fused: FusedActivation | None
) -> bool:
    """``y[n, c] = activation(x[n, c] * factor[c] + shift[c])`` for ``x`` ``[N, C, ...]`` (y may be x;
    each image of each must be C-contiguous: ``takes``).

    Returns whether the activation was applied (Relu, Clip and LeakyRelu are; the caller applies any
    other).
    """
    code, alpha, beta = activation_code(fused)
    op = _affine(x, factor, shift, y, code, alpha, beta)
    found = spin_split(op.planes, op.layout[1], op.arrays)
    if found is not None:
        pool, shares = found
        _job_of(op, shares).run(pool)
        return code != NO_ACTIVATION or fused is None
    x_flat, factor, shift, y_flat, constants = op.arrays
    split_planes(
        lambda first, last: _planes(x_flat, factor, shift, y_flat, op.layout, first, last, code, constants),
        lambda parts: _split(parts, op.planes, x_flat, factor, shift, y_flat, op.layout, code, constants),
        op.planes, op.layout[1],
    )  # fmt: skip
    return code != NO_ACTIVATION or fused is None


def affine_job(
    x: np.ndarray, factor: np.ndarray, shift: np.ndarray, y: np.ndarray, fused: FusedActivation | None
) -> Job | None:
    """``channel_affine`` (float32) as one spin-pool job, split as a spinning run splits it; None where the
    activation is one the loop cannot apply."""
    code, alpha, beta = activation_code(fused)
    if code == NO_ACTIVATION and fused is not None:
        return None
    op = _affine(x, factor, shift, y, code, alpha, beta)
    return _job_of(op, spin_parts(op.planes, op.layout[1], op.arrays))


def _job_of(op: _Affine, shares: int) -> Job:
    block = argument_block(_BLOCK_SLOTS, op.arrays, (op.code, op.planes, *op.layout))
    return Job(_job_address(), block, shares, op.arrays)


def takes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether ``channel_affine`` takes X and Y: rank 3 or more, each image C-contiguous (a Concat's
    channel slice is)."""
    return x.ndim >= 3 and image_contiguous(x) and image_contiguous(y)


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, planes, x, factor, shift, y, layout, code, constants):  # noqa: ANN001
    """``_planes`` over ``parts`` ranges of the ``planes`` planes, run by numba's threads."""
    for part in numba.prange(parts):
        _planes(x, factor, shift, y, layout, planes * part // parts, planes * (part + 1) // parts, code, constants)


@numba.njit(nogil=True, cache=True, fastmath=True)
def _planes(x, factor, shift, y, layout, first, last, code, constants):  # noqa: ANN001
    """Planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of the flat images X and Y
    (``buffers.flat_images``); ``layout``: (C, the plane's size, X's image stride, Y's image stride)."""
    channels, size, x_stride, y_stride = layout
    alpha, beta, zero = constants[0], constants[1], constants[2]
    count = np.uint64(size)
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        a, b = factor[channel], shift[channel]
        # NOTE: unsigned offsets: numba's wraparound test on signed ones keeps the loops scalar.
        xo = np.uint64(image * x_stride + channel * size)
        yo = np.uint64(image * y_stride + channel * size)
        if code == RELU:
            for p in range(count):
                value = x[xo + p] * a + b
                y[yo + p] = zero if value < zero else value
        elif code == CLIP:
            for p in range(count):
                value = x[xo + p] * a + b
                value = alpha if value < alpha else value
                y[yo + p] = beta if value > beta else value
        elif code == LEAKY_RELU:
            for p in range(count):
                value = x[xo + p] * a + b
                y[yo + p] = value * alpha if value < zero else value
        else:
            for p in range(count):
                y[yo + p] = x[xo + p] * a + b


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block: X's flat images, the factor, the shift, Y's flat images, the
#: activation's constants (1-D each), then its code, the planes and ``_planes``' layout (4 numbers).
_BLOCK_SLOTS = 2 * 5 + 2 + 4


def _job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of the planes through ``_planes``, as a spin-pool job."""
    x, factor, shift, y = float32_1d(args, 0), float32_1d(args, 2), float32_1d(args, 4), float32_1d(args, 6)
    planes = args[11]
    layout = (args[12], args[13], args[14], args[15])
    _planes(x, factor, shift, y, layout, planes * chunk // chunks, planes * (chunk + 1) // chunks, args[10],
            float32_1d(args, 8))  # fmt: skip


@functools.cache
def _job_address() -> int:
    return spin_pool.job(_job)
