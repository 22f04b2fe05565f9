"""The residual Add (or two-input Sum) and its fused activation in one compiled pass.

ResNet's blocks end in ``Relu(Add(branch, shortcut))``: numpy's add and then the activation are two
passes over the tensor (read two, write one; read one, write one); here each plane is read from both
inputs and written once. Planes are split over the session's kernel threads; the loop releases the GIL.
"""

from __future__ import annotations

import numba
import numpy as np

from hetflow.devices.cpu.kernels.jit_epilogue import (
    CLIP,
    COMPILED_DTYPES,
    LEAKY_RELU,
    NO_ACTIVATION,
    RELU,
    activation_code,
    planes_view,
)
from hetflow.devices.cpu.threads import run_planes
from hetflow.ops.activation import FusedActivation


def compiled(a: np.ndarray, b: np.ndarray, y: np.ndarray) -> bool:
    """Whether ``add_activate`` takes these arrays: one shape (no broadcasting), one compiled dtype, and
    each viewable as ``[N, C, P]``."""
    if not (a.shape == b.shape == y.shape and a.dtype == b.dtype == y.dtype and y.dtype in COMPILED_DTYPES):
        return False
    return all(planes_view(array) is not None for array in (a, b, y))


def add_activate(
    a: np.ndarray, b: np.ndarray, y: np.ndarray, fused: FusedActivation | None, bias: np.ndarray | None = None
) -> bool:
    """``y = activation(a + b + bias[c])`` (``compiled(a, b, y)`` must hold; y may be a or b; ``bias``
    one value per channel, or none). Returns whether the activation was applied (Relu, Clip and
    LeakyRelu are; the caller applies any other)."""
    code, alpha, beta = activation_code(fused)
    constants = np.array([alpha, beta, 0.0], dtype=y.dtype)
    a3, b3, y3 = planes_view(a), planes_view(b), planes_view(y)
    offsets = np.zeros(y3.shape[1], y.dtype) if bias is None else np.ascontiguousarray(bias, y.dtype).reshape(-1)
    run_planes(_planes, _split, (a3, b3, y3), (code, constants, offsets), y3.shape[0] * y3.shape[1], y3.shape[2])
    return code != NO_ACTIVATION or fused is None


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, a, b, y, code, constants, bias):  # noqa: ANN001
    """``_planes`` over ``parts`` ranges of the planes, run by numba's threads."""
    planes = y.shape[0] * y.shape[1]
    for part in numba.prange(parts):
        _planes(a, b, y, planes * part // parts, planes * (part + 1) // parts, code, constants, bias)


@numba.njit(nogil=True, cache=True, fastmath=True)
def _planes(a, b, y, first, last, code, constants, bias):  # noqa: ANN001
    """Planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of ``[N, C, P]`` arrays, each
    plus its channel's ``bias``."""
    channels, size = y.shape[1], y.shape[2]
    alpha, beta, zero = constants[0], constants[1], constants[2]
    for plane in range(first, last):
        image, channel = plane // channels, plane % channels
        offset = bias[channel]
        if code == RELU:
            for p in range(size):
                value = a[image, channel, p] + b[image, channel, p] + offset
                y[image, channel, p] = zero if value < zero else value
        elif code == CLIP:
            for p in range(size):
                value = a[image, channel, p] + b[image, channel, p] + offset
                value = alpha if value < alpha else value
                y[image, channel, p] = beta if value > beta else value
        elif code == LEAKY_RELU:
            for p in range(size):
                value = a[image, channel, p] + b[image, channel, p] + offset
                y[image, channel, p] = value * alpha if value < zero else value
        else:
            for p in range(size):
                y[image, channel, p] = a[image, channel, p] + b[image, channel, p] + offset
