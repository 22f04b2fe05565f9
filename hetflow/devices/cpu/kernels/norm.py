"""CPU kernels: BatchNormalization and LRN.

float16 inputs are computed in float32 and rounded back (the ONNX spec asks for float statistics).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.norm import batchnorm_reduce_axes, lrn_window


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype.itemsize < 4 else dtype


@cpu_kernel("LRN")
def lrn(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """LRN over axis 1 of ``[N, C, ...]``; the channel window is summed with one slice-add per offset."""
    x = inputs[0]
    assert x is not None
    attrs = node.attrs
    compute = _compute_dtype(x.dtype)
    squares = np.square(x, dtype=compute)
    channels = x.shape[1]
    before, after = lrn_window(attrs.size)
    # NOTE: shifted slice-adds rather than a cumulative sum: a cumsum difference loses precision
    # when many channels are large.
    window = squares.copy()
    for offset in range(-before, after + 1):
        if offset == 0 or abs(offset) >= channels:
            continue
        if offset > 0:
            window[:, : channels - offset] += squares[:, offset:]
        else:
            window[:, -offset:] += squares[:, : channels + offset]
    window *= compute.type(attrs.alpha / attrs.size)
    window += compute.type(attrs.bias)
    np.power(window, compute.type(attrs.beta), out=window)
    return [np.divide(x, window, dtype=compute).astype(x.dtype, copy=False)]


@cpu_kernel("BatchNormalization")
def batch_normalization(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray | None]:
    """BatchNormalization on ``[N, C, ...]``: inference form, or training form with running statistics."""
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
    y = np.multiply(x, factor.reshape(shape), dtype=compute)
    y += shift.reshape(shape)
    return [y.astype(x.dtype, copy=False), *running]
