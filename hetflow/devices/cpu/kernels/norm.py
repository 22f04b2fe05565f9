"""CPU kernels: BatchNormalization and LRN.

float16 inputs are computed in float32 and rounded back (the ONNX spec asks for float statistics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetflow.devices.cpu.kernels.buffers import Out, Scratch, aligned, deliver, output
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_affine import channel_affine
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES, planes_view
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.devices.cpu.threads import available_cores, parallel_for
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.norm import batchnorm_reduce_axes, lrn_window


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


#: Work per LRN block: about half of a core's L2, so the ~10 passes over a block hit the cache
#: instead of memory (1.3-1.6x at batch 16 over whole-tensor passes).
_LRN_BLOCK_BYTES = 1 << 20
#: Below this many input bytes LRN stays on one thread (the hand-off costs more than it saves).
_LRN_PARALLEL_BYTES = 4 << 20


def _lrn_block_bytes(shape: tuple[int, int, int], itemsize: int, before: int, after: int) -> int:
    """Scratch of the largest block: its scaled squares (with the window's halo) and its window sums."""
    largest = 0
    channels = shape[1]
    for n0, n1, c0, c1 in _lrn_blocks(shape, itemsize):
        halo = min(c1 + after, channels) - max(c0 - before, 0)
        squares = aligned((n1 - n0) * halo * shape[2] * itemsize)
        largest = max(largest, squares + aligned((n1 - n0) * (c1 - c0) * shape[2] * itemsize))
    return largest


def _lrn_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    """One block's scratch per thread that may run LRN blocks at once."""
    x = inputs[0]
    if x is None:
        return 0
    shape = (int(x.shape[0]), int(x.shape[1]), math.prod(int(d) for d in x.shape[2:]))
    before, after = lrn_window(node.attrs.size)
    return _lrn_block_bytes(shape, _compute_dtype(x.dtype).itemsize, before, after) * available_cores()


@cpu_kernel("LRN", writes_out=True, workspace=_lrn_workspace)
def lrn(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """LRN over axis 1 of ``[N, C, ...]``, in cache-sized blocks of (images, channels) spread over the
    session's threads.

    Per block: the squares (pre-scaled by ``sqrt(alpha / size)``) of the block's channels plus the
    window's halo, the window sum as ``size - 1`` shifted slice-adds, then the power. ``beta`` of 0.75
    (AlexNet, GoogLeNet, ZFNet), 0.5 and 1 avoid ``np.power``, which takes ~85% of the time otherwise:
    ``d ** 0.75 = sqrt(d) * sqrt(sqrt(d))``.
    """
    x = inputs[0]
    assert x is not None
    compute = _compute_dtype(x.dtype)
    source = x.astype(compute, copy=False).reshape(x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    y = output(out, 0, x.shape, compute)
    if not y.flags.c_contiguous:
        y = np.empty(x.shape, compute)
    result = y.reshape(source.shape)
    params = _LrnParams.of(node.attrs, compute)
    blocks = _lrn_blocks(source.shape, source.itemsize)
    threads = None if source.nbytes >= _LRN_PARALLEL_BYTES else 1
    free = _scratch_slots(workspace, _lrn_block_bytes(source.shape, source.itemsize, params.before, params.after))

    def run_block(index: int) -> None:
        # NOTE: list.pop/append are atomic: each running block holds its own slot of the workspace.
        try:
            slot = free.pop()
        except IndexError:
            slot = Scratch(None)
        try:
            _lrn_block(source, result, blocks[index], params, slot)
        finally:
            slot.reset()
            free.append(slot)

    parallel_for(run_block, len(blocks), threads)
    return [deliver(out, 0, y.astype(x.dtype, copy=False))]


def _scratch_slots(workspace: np.ndarray | None, nbytes: int) -> list[Scratch]:
    """``workspace`` cut into as many scratches of ``nbytes`` as fit."""
    if workspace is None or nbytes == 0:
        return []
    return [Scratch(workspace[start : start + nbytes]) for start in range(0, workspace.nbytes - nbytes + 1, nbytes)]


@dataclass(frozen=True)
class _LrnParams:
    before: int
    after: int
    scale: np.floating  # sqrt(|alpha / size|): squares of x * scale are the scaled squares
    negative: bool  # alpha < 0
    bias: np.floating
    beta: float

    @staticmethod
    def of(attrs: Any, compute: np.dtype) -> _LrnParams:
        before, after = lrn_window(attrs.size)
        coefficient = attrs.alpha / attrs.size
        return _LrnParams(before, after, compute.type(np.sqrt(abs(coefficient))), coefficient < 0,
                          compute.type(attrs.bias), float(attrs.beta))


def _lrn_blocks(shape: tuple[int, ...], itemsize: int) -> list[tuple[int, int, int, int]]:
    """(n0, n1, c0, c1) blocks of about ``_LRN_BLOCK_BYTES``: whole images grouped when an image is
    small, else one image cut into channel ranges (the window's halo is recomputed per block)."""
    batch, channels, plane = shape
    image_bytes = max(channels * plane * itemsize, 1)
    if image_bytes <= _LRN_BLOCK_BYTES:
        step = max(_LRN_BLOCK_BYTES // image_bytes, 1)
        return [(n, min(n + step, batch), 0, channels) for n in range(0, batch, step)]
    step = max(_LRN_BLOCK_BYTES // max(plane * itemsize, 1), 1)
    return [(n, n + 1, c, min(c + step, channels)) for n in range(batch) for c in range(0, channels, step)]


def _lrn_block(
    x: np.ndarray, out: np.ndarray, block: tuple[int, int, int, int], p: _LrnParams, scratch: Scratch
) -> None:
    n0, n1, c0, c1 = block
    lo, hi = max(c0 - p.before, 0), min(c1 + p.after, x.shape[1])
    squares = scratch.take((n1 - n0, hi - lo, x.shape[2]), x.dtype)
    np.multiply(x[n0:n1, lo:hi], p.scale, out=squares)
    np.square(squares, out=squares)
    if p.negative:
        np.negative(squares, out=squares)
    # window[j] (channel c0 + j) = bias + sum of squares[c0 + j + offset - lo] over the offsets in range.
    window = scratch.take((n1 - n0, c1 - c0, x.shape[2]), x.dtype)
    np.add(squares[:, c0 - lo : c1 - lo], p.bias, out=window)
    for offset in range(-p.before, p.after + 1):
        first, last = max(0, lo - c0 - offset), min(c1 - c0, hi - c0 - offset)
        if offset == 0 or last <= first:
            continue
        shift = c0 - lo + offset
        np.add(window[:, first:last], squares[:, first + shift : last + shift], out=window[:, first:last])
    _power(window, p.beta, scratch=squares[:, c0 - lo : c1 - lo])
    np.divide(x[n0:n1, c0:c1], window, out=out[n0:n1, c0:c1])


def _power(values: np.ndarray, beta: float, scratch: np.ndarray) -> None:
    """``values **= beta`` in place, through square roots for the common exponents."""
    if beta == 1.0:
        return
    if beta == 0.5:
        np.sqrt(values, out=values)
    elif beta == 0.75:
        np.sqrt(values, out=scratch)
        np.sqrt(scratch, out=values)
        values *= scratch
    else:
        np.power(values, values.dtype.type(beta), out=values)


@cpu_kernel("BatchNormalization", writes_out=True, inplace=True)
def batch_normalization(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray | None]:
    """BatchNormalization on ``[N, C, ...]``: inference form, or training form with running statistics.

    May run in place (the statistics are read before Y is written)."""
    x, scale, bias, mean, var = inputs
    assert x is not None and scale is not None and bias is not None and mean is not None and var is not None
    attrs = node.attrs
    compute = _compute_dtype(x.dtype)
    running: list[np.ndarray | None] = [None, None]
    if attrs.training_mode:
        axes = batchnorm_reduce_axes(x.ndim, attrs.spatial)
        batch_mean = np.mean(x, axis=axes, dtype=compute)
        batch_var = np.var(x, axis=axes, dtype=compute)
        momentum = attrs.momentum
        running = [
            (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype, copy=False),
            (var * momentum + batch_var * (1 - momentum)).astype(var.dtype, copy=False),
        ]
        mean, var = batch_mean, batch_var
    # Parameters broadcast as [C, 1, ..., 1] (per channel) or [C, D1, ...] (spatial=0).
    shape = scale.shape + (1,) * (x.ndim - 1 - scale.ndim)
    factor = scale.astype(compute) / np.sqrt(var.astype(compute) + compute.type(attrs.epsilon))
    shift = bias.astype(compute) - mean.astype(compute) * factor
    if compute != x.dtype:
        y = np.multiply(x, factor.reshape(shape), dtype=compute)
        y += shift.reshape(shape)
        apply_activation(y, attrs.fused)
        return [deliver(out, 0, y.astype(x.dtype)), *running]
    y = output(out, 0, x.shape, x.dtype)
    if _compiled(x, y, attrs.spatial):
        activated = channel_affine(x, factor, shift, y, attrs.fused)
    else:
        np.multiply(x, factor.reshape(shape), out=y)
        y += shift.reshape(shape)
        activated = False
    if not activated:
        apply_activation(y, attrs.fused)
    return [y, *running]


def _compiled(x: np.ndarray, y: np.ndarray, spatial: int) -> bool:
    """Whether the compiled one-pass kernel takes this BatchNormalization: per-channel parameters, a float
    dtype it compiles, and X and Y each viewable as ``[N, C, P]`` (a Concat slice is, per image)."""
    if not spatial or x.ndim < 3 or x.dtype not in COMPILED_DTYPES:
        return False
    return planes_view(x) is not None and planes_view(y) is not None
