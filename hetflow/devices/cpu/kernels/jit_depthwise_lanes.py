"""The float32 2-D depthwise Conv (one kernel per channel) with column strides 1 and 2, over 16-lane
vectors of outputs in LLVM IR, bias and activation fused.

Why: the phase-plane kernel (``jit_depthwise._planes``) copies each input plane into its phases, a
strided gather that runs scalar, and on small maps its vector loops are shorter than one unrolled
iteration, so they run scalar too. Here each tap is read straight from X by masked loads
(``window_lanes``, the pools' layout), multiplied by the plane's weight and accumulated in registers.
Measured on one core, 3x3 pad 1, two images, phase planes -> vectors (minimums): 544x7x7 233 -> 58 us,
960x7x7 411 -> 104, 272x14x14 157 -> 80, 136x28x28 224 -> 142, 144x56x56 789 -> 599, 32x112x112 721 ->
441, stride 2 on 112x56x56 408 -> 194 and on 96x112x112 1391 -> 635. A fixed cost per vector of
outputs remains (~2.5 ns a plane, ~15 ns a block of planes): a 1x1 window over 136x28x28 takes 33 us
where a copy of it takes 11.

Accumulators start at the bias. The activation is a multiply and two clamps with constants from
``activation_code``: Relu is (slope 1, 0, +inf), Clip (1, min, max), LeakyRelu (alpha, -inf, +inf), none
(1, -inf, +inf); NaN passes through, as in the phase kernel's store.

The bodies for the three vector shapes and both strides are compiled into one function, once per
machine (cached on disk).

Square 3x3 and 5x5 windows at equal strides of 1 or 2 without dilation (every depthwise layer of the
zoo) are swept a plane at a time by ``jit_depthwise_rows`` instead (``vector_planes`` hands them over):
the weights stay in registers and each input row is loaded once for the output rows that read it.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_depthwise_rows
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels import window_lanes as wl
from hetflow.devices.cpu.kernels.jit_epilogue import CLIP, LEAKY_RELU, RELU
from hetflow.devices.cpu.kernels.window_lanes import LANES, PLANE_BLOCK, STRIDES, VectorShape
from hetflow.devices.cpu.spin_pool import Job, argument_block, float32_1d, float32_4d
from hetflow.devices.cpu.threads import run_planes, spin_split

_FLOAT32 = np.dtype(np.float32)
_SHAPES = tuple(VectorShape(rows, stride) for rows in (1, 2, 4) for stride in STRIDES)


def applies(dtype: np.dtype, channels: int, kernels: int, column_stride: int) -> bool:
    """Whether this kernel runs a 2-D depthwise Conv: float32, one kernel per channel (no channel
    multiplier), column stride 1 or 2 (any window, row stride, dilation and padding)."""
    return dtype == _FLOAT32 and kernels == channels and column_stride in STRIDES


@functools.lru_cache(maxsize=64)
def activation_constants(code: int, alpha: float, beta: float) -> np.ndarray:
    """(slope, low, high) of the fused activation ``code`` (``jit_epilogue.activation_code``): the
    output is min(max(v < 0 ? v * slope : v, low), high). Shared between calls: never written."""
    inf = float("inf")
    if code == RELU:
        return np.array([1.0, 0.0, inf], np.float32)
    if code == CLIP:
        return np.array([1.0, alpha, beta], np.float32)
    if code == LEAKY_RELU:
        return np.array([alpha, -inf, inf], np.float32)
    return np.array([1.0, -inf, inf], np.float32)


def depthwise(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, y: np.ndarray, image_stride: int,
    out: tuple[int, int], window: tuple[int, ...], activation: np.ndarray, shuffle_groups: int = 0,
) -> None:  # fmt: skip
    """Depthwise Conv of float32 ``x`` ``[N, C, H, W]`` with ``w`` ``[C, 1, kh, kw]`` plus ``bias`` ``[C]``
    into the flat Y ``y`` (``buffers.flat_images``: images ``image_stride`` apart) of ``out`` (OH, OW),
    ``window`` (kh, kw, sh, sw, dh, dw, pad_top, pad_left), then the ``activation_constants``; X read
    channel-shuffled in ``shuffle_groups`` (``ConvAttrs.shuffle_groups``) when that is not 0."""
    flat_w = w.reshape(-1)
    tail = (*window, max(1, shuffle_groups))
    planes = x.shape[0] * x.shape[1]
    found = spin_split(planes, out[0] * out[1], (x, flat_w, bias, activation, y))
    if found is not None:
        pool, shares = found
        planes_job(x, w, bias, y, image_stride, out, window, activation, shuffle_groups, shares).run(pool)
        return
    head = (x, flat_w, bias, activation, y, image_stride, *out)
    run_planes(vector_planes, _split, head, tail, planes, out[0] * out[1])


def planes_job(
    x: np.ndarray, w: np.ndarray, bias: np.ndarray, y: np.ndarray, image_stride: int, out: tuple[int, int],
    window: tuple[int, ...], activation: np.ndarray, shuffle_groups: int, shares: int,
) -> Job:  # fmt: skip
    """``depthwise`` (its arguments as there; every array C-contiguous float32) as a spin-pool job of
    ``shares`` ranges of X's planes."""
    flat_w = w.reshape(-1)
    numbers = (image_stride, *out, *window, max(1, shuffle_groups))
    block = argument_block(_BLOCK_SLOTS, (x, flat_w, bias, activation, y), numbers)
    return Job(_job_address(), block, shares, (x, flat_w, bias, activation, y))


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a job's argument block: X (4-D), W, the bias, the activation and Y (1-D each), then 12
#: numbers: image_stride, out_h, out_w, kh, kw, sh, sw, dh, dw, pad_top, pad_left, groups.
_BLOCK_SLOTS = 25


def _planes_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of X's planes through ``vector_planes``, as a spin-pool job."""
    x = float32_4d(args, 0)
    w, bias, activation, y = float32_1d(args, 5), float32_1d(args, 7), float32_1d(args, 9), float32_1d(args, 11)
    planes = x.shape[0] * x.shape[1]
    vector_planes(x, w, bias, activation, y, args[13], args[14], args[15], planes * chunk // chunks,
                  planes * (chunk + 1) // chunks, args[16], args[17], args[18], args[19], args[20], args[21],
                  args[22], args[23], args[24])  # fmt: skip


@functools.cache
def _job_address() -> int:
    return spin_pool.job(_planes_job)


@intrinsic
def _depthwise_vectors(
    typingctx, x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
    kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, w, w_start, w_plane, bias, bias_start,
    bias_step, activation, rows, stride,
):  # noqa: ANN001, ANN202  # fmt: skip
    """One vector of outputs for each of ``planes`` (<= PLANE_BLOCK) planes, ``plane_step`` floats apart
    from ``x_start`` in the flat X ``x``, read and stored as ``window_lanes.Window`` and ``Outputs`` say:
    bias[bias_start + p*bias_step] plus, per tap (i, j), the tap times w[w_start + p*w_plane + i*kw + j],
    then the activation (``activation_constants``). ``rows`` and ``stride`` pick one of the bodies compiled for
    ``_SHAPES``.
    """
    arguments = (x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
                 kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, w, w_start, w_plane, bias,
                 bias_start, bias_step, activation, rows, stride)  # fmt: skip
    for array in (x, y, w, bias, activation):  # the IR reads and writes floats through data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_depthwise_vectors takes flat float32 arrays, not {array}")
    signature = types.void(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args[:27])
        for index in (0, 15, 20, 23, 26):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        x_start_v, planes_v, plane_step_v = values[1:4]
        window = wl.Window(values[0], *values[4:15])
        outputs = wl.Outputs(*values[15:20])
        weights = values[20:23]
        bias_p, bias_start_v, bias_step_v, activation_p = values[23:27]
        rows_v, stride_v = args[27:]
        for shape in _SHAPES:
            chosen = builder.and_(
                builder.icmp_signed("==", rows_v, lv.INT(shape.rows)),
                builder.icmp_signed("==", stride_v, lv.INT(shape.stride)),
            )
            with builder.if_then(chosen):
                starts = wl.plane_starts(builder, x_start_v, planes_v, plane_step_v)
                planes = _clamped(builder, planes_v)
                biases = [
                    lv.broadcast(
                        builder,
                        lv.load_scalar(
                            builder, bias_p, builder.add(bias_start_v, builder.mul(p, bias_step_v))
                        ),
                    )
                    for p in planes
                ]
                totals = _accumulate(builder, shape, window, starts, weights, planes, biases)
                constants = [
                    lv.broadcast(builder, lv.load_scalar(builder, activation_p, lv.INT(i))) for i in range(3)
                ]
                results = [lv.activate(builder, constants, value) for value in totals]
                masks, shifts = wl.row_masks(builder, shape.rows, window.segments, outputs)
                wl.store_planes(builder, outputs, planes_v, masks, shifts, results)
        return context.get_dummy_value()

    return signature, codegen


def _clamped(builder: ir.IRBuilder, planes: ir.Value) -> list[ir.Value]:
    """The block's plane indices, slots past ``planes`` repeating the last (never stored)."""
    return [wl.clamped_plane(builder, plane, planes) for plane in range(PLANE_BLOCK)]


def _accumulate(
    builder: ir.IRBuilder, shape: VectorShape, window: wl.Window, starts: list[ir.Value],
    weights: list[ir.Value], planes: list[ir.Value], biases: list[ir.Value],
) -> list[ir.Value]:  # fmt: skip
    """Each plane's sum over the taps of tap times weight, from its bias."""
    w_p, w_start, w_plane = weights
    fma = lv.fused_multiply_add(builder)
    totals = [wl.slot(builder, bias) for bias in biases]
    plane_weights = [builder.add(w_start, builder.mul(plane, w_plane)) for plane in planes]

    def multiply_add(plane: int, values: ir.Value, row_tap: ir.Value, column_tap: ir.Value) -> None:
        tap = builder.add(builder.mul(row_tap, window.kw), column_tap)
        weight = lv.broadcast(builder, lv.load_scalar(builder, w_p, builder.add(plane_weights[plane], tap)))
        total = totals[plane]
        builder.store(builder.call(fma, [values, weight, builder.load(total)]), total)

    wl.walk_taps(builder, shape, window, starts, 0.0, multiply_add)
    return [builder.load(total) for total in totals]


@numba.njit(nogil=True, cache=True)
def vector_planes(x, w, bias, activation, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001, ANN201
                  kh, kw, sh, sw, dh, dw, pad_top, pad_left, groups):  # fmt: skip
    """The output planes that read X's planes ``first .. last - 1`` (X's plane p: image p // C, channel p %
    C) into the flat Y ``y`` (images ``image_stride`` elements apart, each ``[C, OH, OW]`` contiguous;
    ``buffers.flat_images``), up to ``PLANE_BLOCK`` consecutive planes of X at a time, each a vector of
    outputs at a time; ``w`` is the flat ``[C, 1, kh, kw]`` weights.

    With X read channel-shuffled in ``groups`` (1: as it lies), output channel ``i*groups + g`` reads X's
    channel ``g*(C/groups) + i``: a block of X's consecutive planes writes every ``groups``-th plane of Y.
    """
    if jit_depthwise_rows.sweeps(kh, kw, sh, sw, dh, dw):
        jit_depthwise_rows.swept_planes(x, w, bias, activation, y, image_stride, out_h, out_w, first, last, kh,
                                        sh, pad_top, pad_left, groups)  # fmt: skip
        return
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    per_group = channels // groups
    taps = kh * kw
    flat_x = x.reshape(-1)
    out_size = out_h * out_w
    rows = wl.rows_per_vector(out_w)
    lanes = LANES // rows
    streams = x.size >= wl.PREFETCH_MIN_FLOATS
    plane = first
    while plane < last:
        image, source = plane // channels, plane % channels
        channel = (source % per_group) * groups + source // per_group  # the output channel reading it
        planes = min(PLANE_BLOCK, last - plane, per_group - source % per_group)
        y_plane = image * image_stride + channel * out_size
        for oy in range(0, out_h, rows):
            segments, top, first_tap, last_tap = wl.row_taps(oy, rows, out_h, kh, sh, dh, pad_top, height)
            if streams:
                wl.prefetch_rows_below(flat_x, plane * height * width, planes, height * width, top, segments, rows, kh,
                                       sh, dh, height, width)  # fmt: skip
            for ox in range(0, out_w, lanes):
                _depthwise_vectors(flat_x, plane * height * width, planes, height * width, top, sh, segments,
                                   height, width, first_tap, last_tap, kw, dh, dw, ox * sw - pad_left,
                                   y, y_plane + oy * out_w + ox, groups * out_size, out_w,
                                   min(lanes, out_w - ox), w, channel * taps, groups * taps, bias, channel,
                                   groups, activation, rows, sw)  # fmt: skip
        plane += planes


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, w, bias, activation, y, image_stride, out_h, out_w,  # noqa: ANN001, ANN201
           kh, kw, sh, sw, dh, dw, pad_top, pad_left, groups):  # fmt: skip
    """``vector_planes`` over ``parts`` ranges of X's planes, run by numba's threads."""
    planes = x.shape[0] * x.shape[1]
    for part in numba.prange(parts):
        vector_planes(x, w, bias, activation, y, image_stride, out_h, out_w, planes * part // parts,
                      planes * (part + 1) // parts, kh, kw, sh, sw, dh, dw, pad_top, pad_left,
                      groups)  # fmt: skip
