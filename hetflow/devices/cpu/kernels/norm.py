"""CPU kernels: BatchNormalization and LRN.

float16 inputs are computed in float32 and rounded back (the ONNX spec asks for float statistics).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetflow.devices.base import BoundCall, with_capture
from hetflow.devices.cpu.kernels import jit_lrn
from hetflow.devices.cpu.kernels.buffers import Out, deliver, output
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_affine import affine_job, channel_affine, takes
from hetflow.devices.cpu.kernels.jit_epilogue import COMPILED_DTYPES
from hetflow.devices.cpu.kernels.one_pass import captured_as_one_job, float32_target
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.norm import batchnorm_reduce_axes, lrn_window


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


def _prepare_lrn(node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None) -> BoundCall | None:
    """A float32 LRN bound to the Y the plan placed: captured as the compiled pass's job
    (``jit_lrn.lrn_job``; see ``one_pass``)."""
    target = float32_target(inputs[0], out)
    if target is None or target.ndim < 3:
        return None
    before, after = lrn_window(node.attrs.size)
    attrs = node.attrs
    planes = (target.shape[0], target.shape[1], math.prod(target.shape[2:]))

    def job_for(x: np.ndarray) -> Job:
        return jit_lrn.lrn_job(x.reshape(planes), target.reshape(planes), before, after, attrs.alpha, attrs.beta,
                               attrs.bias)  # fmt: skip

    return captured_as_one_job(lambda arrays: lrn(node, arrays, out), target, job_for)


@cpu_kernel("LRN", writes_out=True, prepare=_prepare_lrn)
def lrn(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """LRN over axis 1 of ``[N, C, ...]`` by the compiled pass (``jit_lrn``), float16 computed in float32."""
    x = inputs[0]
    assert x is not None
    compute = _compute_dtype(x.dtype)
    shape = (x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    source = np.ascontiguousarray(x.reshape(shape), compute)
    y = output(out, 0, x.shape, compute)
    if not y.flags.c_contiguous:
        y = np.empty(x.shape, compute)
    before, after = lrn_window(node.attrs.size)
    jit_lrn.lrn(source, y.reshape(shape), before, after, node.attrs.alpha, node.attrs.beta, node.attrs.bias)
    return [deliver(out, 0, y.astype(x.dtype, copy=False))]


def _factor_shift(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float, compute: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The per-channel ``y = x * factor + shift`` that normalises with these statistics."""
    factor = scale.astype(compute) / np.sqrt(var.astype(compute) + compute.type(epsilon))
    return factor, bias.astype(compute) - mean.astype(compute) * factor


def _prepare_batchnorm(
    node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
) -> BoundCall | None:
    """Inference BatchNormalization on float32 bound to its planned Y: a call as the kernel makes it, and
    the capture of the compiled pass as a job, its factor and shift worked out once (the statistics are
    weights: a capture holds them fixed)."""
    x_info = inputs[0]
    target = out[0] if out is not None else None
    attrs = node.attrs
    if x_info is None or target is None or attrs.training_mode or not attrs.spatial or x_info.dtype != np.float32:
        return None
    if target.shape != tuple(x_info.shape) or target.dtype != np.float32:
        return None

    def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
        return batch_normalization(node, arrays, out, workspace)

    def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray | None], list[Job]] | None:
        x, scale, bias, mean, var = arrays
        if not takes(x, target):  # type: ignore[arg-type]
            return None
        factor, shift = _factor_shift(scale, bias, mean, var, attrs.epsilon, np.dtype(np.float32))  # type: ignore[arg-type]
        job = affine_job(x, factor, shift, target, attrs.fused)  # type: ignore[arg-type]
        return None if job is None else ([target, None, None], [job])

    return with_capture(call, capture)


@cpu_kernel("BatchNormalization", writes_out=True, inplace=True, prepare=_prepare_batchnorm)
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
    factor, shift = _factor_shift(scale, bias, mean, var, attrs.epsilon, compute)
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
    dtype it compiles, and each image of X and Y contiguous (a Concat slice's is: ``jit_affine.takes``)."""
    return bool(spatial) and x.dtype in COMPILED_DTYPES and takes(x, y)
