"""2-D depthwise convolution compiled with numba: one pass per output plane, bias and activation fused.

Depthwise layers do 9 multiply-adds per output element, so numpy's one-pass-per-tap form is memory
bound: every tap reads and writes the whole output again (9 passes plus the epilogue's). Here each
block of output rows is accumulated in an L1-sized buffer over the taps and written once, with the bias
and the activation applied on the way out.

Each input plane is copied once into zero-bordered phase planes (``jit_phases``), so that every tap over
a whole block of output rows is one contiguous vector loop. Measured on one core (minimums, 3x3, pad 1,
ReLU6, per image): numpy's tap passes -> a compiled loop per output row, 32x112x112 5.5 -> 0.6 ms,
144x56x56 4.3 -> 1.0 ms, 96x112x112 stride 2 4.4 -> 2.5 ms; that loop -> the flat blocks (A/B in one
process), 576x14x14 0.72 -> 0.26 ms, 960x7x7 1.02 -> 0.46 ms, 144x56x56 1.08 -> 0.59 ms, 96x112x112
stride 2 1.43 -> 0.88 ms. Rows are stored at unsigned flat offsets of Y (``buffers.flat_images``), so
the store loop vectorises: 144x56x56 0.49 -> 0.42 ms, 32x112x112 0.44 -> 0.40 ms, 7x7 and 14x14 maps
0-6% (one core, A/B in one process; at two threads within this VM's noise).

float32 layers with one kernel per channel and column stride 1 or 2 (every depthwise layer of the zoo)
run ``jit_depthwise_lanes`` instead: no phase planes, each tap a masked vector load straight from X
(square 3x3 and 5x5 windows swept a plane at a time by ``jit_depthwise_rows``).
A/B over whole networks (``benchmarks/ab.py``, 3 rounds of 10 runs, minimums): shufflenet 0.87x at
batch 1 and 0.86x at 16, mobilenetv2 0.86x and 0.83x. This kernel keeps channel multipliers, column
strides over 2 and float64.

The compiled function releases the GIL; ``depthwise_2d`` splits the planes over the CPU's kernel
threads (``parallel_for``), so the session's thread count holds here as for every other kernel.
"""

from __future__ import annotations

import numba
import numpy as np

from hetflow.devices.cpu.kernels import jit_depthwise_lanes
from hetflow.devices.cpu.kernels.buffers import flat_target
from hetflow.devices.cpu.kernels.jit_epilogue import CLIP, LEAKY_RELU, NO_ACTIVATION, RELU, activation_code
from hetflow.devices.cpu.kernels.jit_phases import fill_phases, layout, tap_start
from hetflow.devices.cpu.threads import split_planes
from hetflow.ops.activation import FusedActivation


def depthwise_2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    y: np.ndarray,
    strides: tuple[int, int],
    dilations: tuple[int, int],
    pads_begin: tuple[int, int],
    fused: FusedActivation | None,
    shuffle_groups: int = 0,
) -> bool:
    """``y`` = depthwise Conv of ``x`` ``[N, C, H, W]`` with ``w`` ``[C*m, 1, kh, kw]``, plus ``bias``.

    ``y`` (``[N, C*m, OH, OW]``, any strides) is written in place (through ``flat_target``: flat when each
    image is contiguous, else through a contiguous copy). ``x`` is read channel-shuffled in
    ``shuffle_groups`` when that is not 0 (``ConvAttrs.shuffle_groups``). Returns whether the fused
    activation was applied too (Relu, Clip and LeakyRelu are; the caller applies any other).
    """
    code, alpha, beta = activation_code(fused)
    if y.size == 0:
        return True
    # The epilogue's constants in Y's dtype, so the compiled store never widens to float64.
    constants = np.array([alpha, beta, 0.0], dtype=y.dtype)
    bias = np.zeros(y.shape[1], y.dtype) if bias is None else np.ascontiguousarray(bias, y.dtype)

    target, flat_y, image_stride = flat_target(y)
    window = (strides[0], strides[1], dilations[0], dilations[1], pads_begin[0], pads_begin[1])
    if jit_depthwise_lanes.applies(x.dtype, int(x.shape[1]), int(y.shape[1]), strides[1]):
        activation = jit_depthwise_lanes.activation_constants(code, alpha, beta)
        out_hw = (int(y.shape[2]), int(y.shape[3]))
        jit_depthwise_lanes.depthwise(
            x, w, bias, flat_y, image_stride, out_hw, (*w.shape[2:], *window), activation, shuffle_groups
        )
    else:
        source = shuffled_channels(x, shuffle_groups) if shuffle_groups else x
        _phase_planes(source, w, bias, flat_y, image_stride, y.shape, window, code, constants)
    if target is not y:
        np.copyto(y, target)
    return code != NO_ACTIVATION or fused is None


def shuffled_channels(x: np.ndarray, groups: int) -> np.ndarray:
    """``x`` ``[N, C, ...]`` channel-shuffled in ``groups``, as a new contiguous array: channel c is x's
    channel ``(c % groups) * (C // groups) + c // groups`` (ShuffleNet's Reshape -> Transpose -> Reshape)."""
    batch, channels = x.shape[:2]
    split = x.reshape(batch, groups, channels // groups, *x.shape[2:])
    return np.ascontiguousarray(np.swapaxes(split, 1, 2)).reshape(x.shape)


def _phase_planes(x, w, bias, flat_y, image_stride, y_shape, window, code, constants) -> None:  # noqa: ANN001
    """The phase-plane kernel (``_planes``) over every output plane, split over the kernel threads."""
    out = (image_stride, int(y_shape[1]), int(y_shape[2]), int(y_shape[3]))
    split_planes(
        lambda first, last: _planes(x, w, bias, flat_y, *out, first, last, *window, code, constants),
        lambda parts: _split(parts, x, w, bias, flat_y, *out, *window, code, constants),
        y_shape[0] * y_shape[1], int(y_shape[2]) * int(y_shape[3]),
    )  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, w, bias, y, image_stride, kernels, out_h, out_w,  # noqa: ANN001
           sh, sw, dh, dw, pad_top, pad_left, code, constants):  # fmt: skip
    """``_planes`` over ``parts`` ranges of Y's planes, run by numba's threads."""
    planes = x.shape[0] * kernels
    for part in numba.prange(parts):
        first, last = planes * part // parts, planes * (part + 1) // parts
        _planes(x, w, bias, y, image_stride, kernels, out_h, out_w, first, last,
                sh, sw, dh, dw, pad_top, pad_left, code, constants)  # fmt: skip


@numba.njit(nogil=True, cache=True, fastmath=True)
def _planes(x, w, bias, y, image_stride, kernels, out_h, out_w, first, last,  # noqa: ANN001
            sh, sw, dh, dw, pad_top, pad_left, code, constants):  # fmt: skip
    """Output planes ``first .. last - 1`` (plane p = image p // K, channel p % K) of the flat Y ``y``
    (images ``image_stride`` elements apart, each ``[K, OH, OW]`` contiguous)."""
    channels = x.shape[1]
    kh, kw = w.shape[2], w.shape[3]
    multiplier = kernels // channels
    span, depth, block_rows = layout(out_h, out_w, kh, kw, sh, sw, dh, dw)
    phases = np.zeros((sh * sw, depth * span), x.dtype)  # zero padding, written once
    acc = np.empty(block_rows * span, x.dtype)
    for plane in range(first, last):
        image, kernel = plane // kernels, plane % kernels
        channel = kernel // multiplier
        if plane == first or kernel % multiplier == 0:
            fill_phases(x, image, channel, phases, sh, sw, pad_top, pad_left, span, depth)
        for first_row in range(0, out_h, block_rows):
            rows = min(block_rows, out_h - first_row)
            count = np.uint64(rows * span)
            for p in range(count):
                acc[p] = bias[kernel]
            for i in range(kh):
                for j in range(kw):
                    weight = w[kernel, 0, i, j]
                    index, offset = tap_start(i, j, first_row, span, sh, sw, dh, dw)
                    for p in range(count):
                        acc[p] += weight * phases[index, offset + p]
            start = np.uint64(image * image_stride + (kernel * out_h + first_row) * out_w)
            _store_rows(acc, span, y, start, out_w, rows, code, constants)


@numba.njit(nogil=True, cache=True, inline="always")
def _store_rows(acc, span, y, start, out_w, rows, code, constants):  # noqa: ANN001
    """``rows`` rows of the flat Y from offset ``start`` = activation of ``acc``'s rows (``span`` apart,
    the first ``out_w`` of each; see ``jit_epilogue.store_activated``)."""
    alpha, beta, zero = constants[0], constants[1], constants[2]
    width = np.uint64(out_w)
    for index in range(rows):
        base = np.uint64(index * span)
        target = start + np.uint64(index) * width
        if code == RELU:
            for c in range(width):
                value = acc[base + c]
                y[target + c] = zero if value < zero else value
        elif code == CLIP:
            for c in range(width):
                value = acc[base + c]
                value = alpha if value < alpha else value
                y[target + c] = beta if value > beta else value
        elif code == LEAKY_RELU:
            for c in range(width):
                value = acc[base + c]
                y[target + c] = value * alpha if value < zero else value
        else:
            for c in range(width):
                y[target + c] = acc[base + c]
