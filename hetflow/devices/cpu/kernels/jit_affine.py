"""Per-channel scale and shift, then an activation, in one compiled pass (inference BatchNormalization).

numpy's form is three passes over the tensor (multiply, add, then the activation fused into the
BatchNormalization by ``passes/fuse_activation``). DenseNet's pre-activation blocks run 62 of them on
values no Conv precedes, so they cannot be folded away: one pass per plane reads X once and writes Y
once. Planes are split over the session's kernel threads (the loop releases the GIL), on a spinning
run as a job of its pool.
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels.jit_epilogue import (
    CLIP,
    LEAKY_RELU,
    NO_ACTIVATION,
    RELU,
    activation_code,
    planes_view,
)
from hetflow.devices.cpu.spin_pool import argument_block, float32_1d, float32_3d
from hetflow.devices.cpu.threads import spin_split, split_planes
from hetflow.ops.activation import FusedActivation


def channel_affine(
    x: np.ndarray, factor: np.ndarray, shift: np.ndarray, y: np.ndarray, fused: FusedActivation | None
) -> bool:
    """``y[n, c] = activation(x[n, c] * factor[c] + shift[c])`` for ``x`` ``[N, C, ...]`` (y may be x;
    each must be viewable as ``[N, C, P]``).

    Returns whether the activation was applied (Relu, Clip and LeakyRelu are; the caller applies any
    other).
    """
    code, alpha, beta = activation_code(fused)
    constants = np.array([alpha, beta, 0.0], dtype=y.dtype)
    planes, targets = planes_view(x), planes_view(y)
    assert planes is not None and targets is not None
    factor = np.ascontiguousarray(factor, y.dtype)
    shift = np.ascontiguousarray(shift, y.dtype)

    count, size = planes.shape[0] * planes.shape[1], planes.shape[2]
    found = spin_split(count, size, (planes, factor, shift, targets, constants))
    if found is not None:
        pool, shares = found
        arrays = (planes, factor, shift, targets, constants)
        pool.run(_job_address(), argument_block(_BLOCK_SLOTS, arrays, (code,)), shares)
        return code != NO_ACTIVATION or fused is None
    split_planes(
        lambda first, last: _planes(planes, factor, shift, targets, first, last, code, constants),
        lambda parts: _split(parts, planes, factor, shift, targets, code, constants),
        planes.shape[0] * planes.shape[1], planes.shape[2],
    )  # fmt: skip
    return code != NO_ACTIVATION or fused is None


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, factor, shift, y, code, constants):  # noqa: ANN001
    """``_planes`` over ``parts`` ranges of the planes, run by numba's threads."""
    planes = x.shape[0] * x.shape[1]
    for part in numba.prange(parts):
        _planes(x, factor, shift, y, planes * part // parts, planes * (part + 1) // parts, code, constants)


@numba.njit(nogil=True, cache=True, fastmath=True)
def _planes(x, factor, shift, y, first, last, code, constants):  # noqa: ANN001
    """Planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of ``[N, C, P]`` arrays."""
    channels, size = x.shape[1], x.shape[2]
    alpha, beta, zero = constants[0], constants[1], constants[2]
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        a, b = factor[channel], shift[channel]
        if code == RELU:
            for p in range(size):
                value = x[image, channel, p] * a + b
                y[image, channel, p] = zero if value < zero else value
        elif code == CLIP:
            for p in range(size):
                value = x[image, channel, p] * a + b
                value = alpha if value < alpha else value
                y[image, channel, p] = beta if value > beta else value
        elif code == LEAKY_RELU:
            for p in range(size):
                value = x[image, channel, p] * a + b
                y[image, channel, p] = value * alpha if value < zero else value
        else:
            for p in range(size):
                y[image, channel, p] = x[image, channel, p] * a + b


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block: X (3-D), the factor, the shift (1-D), Y (3-D), the activation's
#: constants (1-D), then its code.
_BLOCK_SLOTS = 4 + 2 + 2 + 4 + 2 + 1


def _job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of the planes through ``_planes``, as a spin-pool job."""
    x, factor, shift, y = float32_3d(args, 0), float32_1d(args, 4), float32_1d(args, 6), float32_3d(args, 8)
    planes = x.shape[0] * x.shape[1]
    _planes(x, factor, shift, y, planes * chunk // chunks, planes * (chunk + 1) // chunks, args[14],
            float32_1d(args, 12))  # fmt: skip


@functools.cache
def _job_address() -> int:
    return spin_pool.job(_job)
