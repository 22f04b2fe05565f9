"""The float32 2-D pools of ``jit_pool`` with column strides 1 and 2, over 16-lane vectors of outputs.

Why: the phase-plane loop (``jit_pool._planes``) copies each input plane into its phases first, a
strided gather that ran scalar, and on small maps its rows are too short for numba's vector loops.
cifar10-quick at batch 1, one core: 3x3/2 max on 32x32x32 spent 17 of its 32 us copying. Here nothing
is copied: each window tap is read straight from X by masked vector loads (LLVM IR, as ``jit_direct``),
and no scratch is needed.

Layout and window walk: ``window_lanes`` (shared with the depthwise Conv). Lanes in the padding read
-inf for a maximum, 0 for a sum; the ``PLANE_BLOCK`` planes' accumulators are independent chains (a
plane alone waits on each tap's max before the next).

Max: NaN propagates as with np.maximum. The accumulator keeps the larger value (x86's maxps, which
skips a NaN tap), and a second accumulator sums max(0, tap): NaN exactly when some tap is NaN (no -inf
in that sum, so no inf - inf), turning the result into NaN at the end. That sum costs a fifth of a small
map's time (3x3/2 on 32x32x32, one core: 6.9 us without it, 8.4 with) and nothing measurable on large
ones. Padding never wins: it is -inf. Average: the sum times ``scale`` (the reciprocal window counts).

The bodies for every vector shape, stride and reduction (``_VARIANTS``) are compiled into one function,
about 3 s once per machine (cached on disk).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.errors import TypingError
from numba.extending import intrinsic

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_pool_rows, jit_pool_same, jit_pool_strided
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.window_lanes import (
    LANES,
    PLANE_BLOCK,
    PREFETCH_MIN_FLOATS,
    STRIDES,
    Outputs,
    VectorShape,
    Window,
    plane_starts,
    prefetch_rows_below,
    row_masks,
    row_taps,
    rows_per_vector,
    slot,
    store_planes,
    walk_taps,
)
from hetflow.devices.cpu.spin_pool import (
    Job,
    float32_1d,
    float32_2d,
    float32_4d,
    put_array,
    put_arrays,
    put_values,
)
from hetflow.devices.cpu.threads import run_planes, spin_split
from hetflow.ops.spatial import Geometry

__all__ = ["PLANE_BLOCK", "applies", "pool", "rows_per_vector", "vector_planes"]


def applies(geo: Geometry, dtype: np.dtype) -> bool:
    """Whether this kernel pools ``geo``'s windows over an X of ``dtype``: float32, column stride 1 or 2
    (any window, row stride, dilation and padding)."""
    return dtype == _FLOAT32 and geo.axes[1].stride in STRIDES


_FLOAT32 = np.dtype(np.float32)  # NOTE: a dtype compared with np.float32 itself costs ~0.3 us


def pool(
    x: np.ndarray, y: np.ndarray, image_stride: int, out: tuple[int, int], window: tuple[int, ...],
    is_max: bool, scale: np.ndarray,
) -> None:  # fmt: skip
    """``jit_pool.pool_2d`` on float32 ``x`` into the flat Y ``y`` (``buffers.flat_images``: images
    ``image_stride`` apart) of ``out`` (OH, OW), ``window`` (kh, kw, sh, sw, dh, dw, pad_top, pad_left):
    the maximum, or the sum times ``scale`` [OH, OW]."""
    planes = x.shape[0] * x.shape[1]
    found = spin_split(planes, out[0] * out[1], (x, y, scale))
    if found is not None:
        pool, shares = found
        planes_job(x, y, (image_stride, *out, *window, int(is_max)), scale, shares).run(pool)
        return
    head = (x, y, image_stride, *out)
    tail = (*window, is_max, scale)
    run_planes(vector_planes, _split, head, tail, planes, out[0] * out[1])


@dataclass(frozen=True)
class _Variant:
    """One compiled body of ``_window_vectors``: the vector shape and the reduction, fixed in the IR."""

    shape: VectorShape
    is_max: bool

    @property
    def pad(self) -> float:
        """What a lane in the padding reads."""
        return float("-inf") if self.is_max else 0.0


_VARIANTS = tuple(
    _Variant(VectorShape(rows, stride), is_max)
    for rows in (1, 2, 4)
    for stride in STRIDES
    for is_max in (True, False)
)


@intrinsic
def _window_vectors(
    typingctx, x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
    kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, scale, scale_start, rows, stride, is_max,
):  # noqa: ANN001, ANN202  # fmt: skip
    """One vector of outputs for each of ``planes`` (<= PLANE_BLOCK) planes, ``plane_step`` floats apart
    from ``x_start`` in the flat X ``x``, read and stored as ``window_lanes.Window`` and ``Outputs`` say:
    the maximum, or the sum times ``scale`` from ``scale_start``. ``rows``, ``stride`` and ``is_max`` pick
    one of the bodies compiled for ``_VARIANTS``.
    """
    arguments = (x, x_start, planes, plane_step, top, row_step, segments, height, width, first_tap, last_tap,
                 kw, dh, dw, col_start, y, y_start, y_plane, y_row, count, scale, scale_start, rows, stride,
                 is_max)  # fmt: skip
    for array in (x, y, scale):  # the IR reads and writes floats through their data pointers
        if not (isinstance(array, types.Array) and array.dtype == types.float32 and array.ndim == 1):
            raise TypingError(f"_window_vectors takes flat float32 arrays, not {array}")
    signature = types.void(*arguments)

    def codegen(context, builder, sig, args):  # noqa: ANN001, ANN202
        values = list(args[:22])
        for index in (0, 15, 20):  # the arrays' data pointers
            values[index] = lv.array_data(context, builder, sig.args[index], args[index])
        x_p, x_start_v, planes_v, plane_step_v = values[:4]
        window = Window(x_p, *values[4:15])
        outputs = Outputs(*values[15:20])
        scale_p, scale_start_v = values[20:22]
        rows_v, stride_v, is_max_v = args[22:]
        for variant in _VARIANTS:
            chosen = builder.and_(
                builder.and_(
                    builder.icmp_signed("==", rows_v, lv.INT(variant.shape.rows)),
                    builder.icmp_signed("==", stride_v, lv.INT(variant.shape.stride)),
                ),
                builder.icmp_unsigned("==", is_max_v, ir.Constant(is_max_v.type, int(variant.is_max))),
            )
            with builder.if_then(chosen):
                starts = plane_starts(builder, x_start_v, planes_v, plane_step_v)
                _emit(builder, variant, window, outputs, starts, planes_v, (scale_p, scale_start_v))
        return context.get_dummy_value()

    return signature, codegen


def _emit(
    builder: ir.IRBuilder, variant: _Variant, window: Window, outputs: Outputs, starts: list[ir.Value],
    planes: ir.Value, scale: tuple[ir.Value, ir.Value],
) -> None:  # fmt: skip
    """The body of ``_window_vectors`` for one variant: taps accumulated, then stored."""
    totals = [slot(builder, lv.float_vector(LANES, variant.pad)) for _ in starts]
    nans = [slot(builder, lv.float_vector(LANES, 0.0)) for _ in starts] if variant.is_max else []

    def accumulate(plane: int, values: ir.Value, row_tap: ir.Value, column_tap: ir.Value) -> None:
        _accumulate(builder, variant, values, totals[plane], nans[plane] if nans else None)

    walk_taps(builder, variant.shape, window, starts, variant.pad, accumulate)
    masks, shifts = row_masks(builder, variant.shape.rows, window.segments, outputs)
    results = [builder.load(total) for total in totals]
    if variant.is_max:
        # A maximum is NaN where a tap was (its NaN-flag sum is).
        flags = [builder.load(nan) for nan in nans]
        results = [
            builder.select(builder.fcmp_unordered("uno", f, f), f, r)
            for f, r in zip(flags, results, strict=True)
        ]
    else:
        scale_p, scale_start = scale
        factors = lv.float_vector(LANES, 0.0)
        for mask, shift in zip(masks, shifts, strict=True):
            factors = lv.masked_load(builder, scale_p, builder.add(scale_start, shift), mask, factors)
        results = [builder.fmul(r, factors) for r in results]
    store_planes(builder, outputs, planes, masks, shifts, results)


def _accumulate(
    builder: ir.IRBuilder, variant: _Variant, values: ir.Value, total: ir.Value, nan: ir.Value | None
) -> None:
    """``total`` = max(total, values) (and ``nan`` += max(0, values)) or ``total`` += values."""
    old = builder.load(total)
    if not variant.is_max:
        builder.store(builder.fadd(old, values), total)
        return
    # NOTE: select(a > b, a, b) is one maxps; a NaN in ``values`` leaves ``old`` and is caught by ``nan``.
    builder.store(builder.select(builder.fcmp_ordered(">", values, old), values, old), total)
    zero = lv.float_vector(LANES, 0.0)
    positive = builder.select(builder.fcmp_ordered(">", zero, values), zero, values)
    builder.store(builder.fadd(builder.load(nan), positive), nan)


@numba.njit(nogil=True, cache=True)
def vector_planes(x, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001, ANN201
                  kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # fmt: skip
    """Output planes ``first .. last - 1`` (plane p = image p // C, channel p % C) of the flat Y ``y``
    (images ``image_stride`` elements apart, each ``[C, OH, OW]`` contiguous; ``buffers.flat_images``):
    in two separable passes over flat planes where ``jit_pool_same`` takes the window (3x3/1 padded by
    one), in strips of 16 output columns where ``jit_pool_strided`` does (3x3/2), swept in rows
    where ``jit_pool_rows`` does (a plane whose maximum met a NaN computed again here, as in the
    strips), else ``_vector_planes``."""
    if jit_pool_same.takes(kh, kw, sh, sw, dh, dw, pad_top, pad_left, x.shape[2], x.shape[3], out_h, out_w):
        jit_pool_same.pool_planes(x, y, image_stride, first, last, is_max, scale)
        return
    if jit_pool_strided.takes(kh, kw, sh, sw, dh, dw):
        channels, height, width = x.shape[1], x.shape[2], x.shape[3]
        flat_x, flat_scale = x.reshape(-1), scale.reshape(-1)
        for plane in range(first, last):
            y_at = (plane // channels) * image_stride + (plane % channels) * out_h * out_w
            if jit_pool_strided.pool_plane(flat_x, plane * height * width, height, width, pad_top, pad_left, y, y_at,
                                           out_h, out_w, is_max, flat_scale):  # fmt: skip
                _vector_planes(x, y, image_stride, out_h, out_w, plane, plane + 1, kh, kw, sh, sw, dh, dw, pad_top,
                               pad_left, is_max, scale)  # fmt: skip
        return
    if not jit_pool_rows.sweeps(kh, kw, sh, sw, dh, dw, out_w):
        _vector_planes(x, y, image_stride, out_h, out_w, first, last, kh, kw, sh, sw, dh, dw, pad_top, pad_left,
                       is_max, scale)  # fmt: skip
        return
    for plane in range(first, last):
        if jit_pool_rows.sweep_plane(x, y, image_stride, out_h, out_w, plane, sh, pad_top, pad_left, is_max,
                                     scale):  # fmt: skip
            _vector_planes(x, y, image_stride, out_h, out_w, plane, plane + 1, kh, kw, sh, sw, dh, dw, pad_top,
                           pad_left, is_max, scale)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _vector_planes(x, y, image_stride, out_h, out_w, first, last,  # noqa: ANN001, ANN201
                   kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # fmt: skip
    """``vector_planes``' planes ``PLANE_BLOCK`` at a time, each a vector of outputs at a time
    (``_window_vectors``): any window, the maximum exact where a NaN is loaded."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    flat_x, flat_scale = x.reshape(-1), scale.reshape(-1)
    out_size = out_h * out_w
    # A block may run on into the next image only where Y's images lie end to end.
    contiguous = image_stride == channels * out_size
    rows = rows_per_vector(out_w)
    lanes = LANES // rows
    streams = x.size >= PREFETCH_MIN_FLOATS
    plane = first
    while plane < last:
        channel = plane % channels
        planes = min(PLANE_BLOCK, last - plane, last - plane if contiguous else channels - channel)
        y_plane = (plane // channels) * image_stride + channel * out_size
        for oy in range(0, out_h, rows):
            segments, top, first_tap, last_tap = row_taps(oy, rows, out_h, kh, sh, dh, pad_top, height)
            if streams:
                prefetch_rows_below(flat_x, plane * height * width, planes, height * width, top, segments, rows, kh,
                                    sh, dh, height, width)  # fmt: skip
            for ox in range(0, out_w, lanes):
                _window_vectors(flat_x, plane * height * width, planes, height * width, top, sh, segments,
                                height, width, first_tap, last_tap, kw, dh, dw, ox * sw - pad_left,
                                y, y_plane + oy * out_w + ox, out_size, out_w, min(lanes, out_w - ox),
                                flat_scale, oy * out_w + ox, rows, sw, is_max)  # fmt: skip
        plane += planes


@numba.njit(parallel=True, nogil=True, cache=True)
def _split(parts, x, y, image_stride, out_h, out_w,  # noqa: ANN001, ANN201
          kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale):  # fmt: skip
    """``vector_planes`` over ``parts`` ranges of Y's planes, run by numba's threads."""
    planes = x.shape[0] * x.shape[1]
    for part in numba.prange(parts):
        vector_planes(x, y, image_stride, out_h, out_w, planes * part // parts, planes * (part + 1) // parts,
                      kh, kw, sh, sw, dh, dw, pad_top, pad_left, is_max, scale)  # fmt: skip


# -- on the spinning pool ----------------------------------------------------------------------------
#: Slots of a planes job's argument block (``_pack_planes``): X (4-D), Y (1-D), 12 numbers, the scale (2-D).
_PLANES_BLOCK_SLOTS = 24


def planes_job(x: np.ndarray, y: np.ndarray, numbers: tuple[int, ...], scale: np.ndarray, parts: int) -> Job:
    """``vector_planes`` over every plane of ``x`` in ``parts`` contiguous ranges, as a spin-pool job on
    its own block. ``numbers``: image_stride, out_h, out_w, then the window (kh, kw, sh, sw, dh, dw,
    pad_top, pad_left), then is_max (0 or 1).

    Why split on the spinning pool: at batch 1 the Conv before a pool splits its channels over the same
    pool, so each thread pools the planes its own Conv share left in its caches; cifar10-quick's 3x3/2
    max on 32x32x32 took 12 us on the caller alone, half of its input coming from the other core. A large
    pool split on the Python pool instead waits for a thread that has no core beside the spinning worker.
    """
    block = np.zeros(_PLANES_BLOCK_SLOTS, np.int64)
    _pack_planes(block, x, y, numbers, scale)
    return Job(_planes_address(), block, parts, (x, y, scale))


@numba.njit(nogil=True, cache=True)
def _pack_planes(block, x, y, numbers, scale):  # noqa: ANN001, ANN202
    put_array(block, put_values(block, put_arrays(block, 0, (x, y)), numbers), scale)


def _planes_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """A range of ``vector_planes`` as a spin-pool job (``_pack_planes``'s argument block)."""
    x, y, scale = float32_4d(args, 0), float32_1d(args, 5), float32_2d(args, 19)
    planes = x.shape[0] * x.shape[1]
    vector_planes(x, y, args[7], args[8], args[9], planes * chunk // chunks, planes * (chunk + 1) // chunks,
                  args[10], args[11], args[12], args[13], args[14], args[15], args[16], args[17], args[18] != 0,
                  scale)  # fmt: skip


@functools.cache
def _planes_address() -> int:
    return spin_pool.job(_planes_job)
