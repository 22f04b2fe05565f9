"""CPU kernels: activations (numpy, elementwise, dtype-preserving)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node


@cpu_kernel("Relu")
def relu(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``max(x, 0)`` for any numeric dtype."""
    (x,) = inputs
    assert x is not None
    return [np.maximum(x, x.dtype.type(0))]


@cpu_kernel("LeakyRelu")
def leaky_relu(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``x`` for ``x >= 0`` else ``alpha * x``; float types."""
    (x,) = inputs
    assert x is not None
    return [_negative_part_scaled(x, x.dtype.type(node.attrs.alpha))]


@cpu_kernel("PRelu")
def prelu(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``x`` for ``x >= 0`` else ``slope * x``; ``slope`` broadcasts to ``x``; float and integer types."""
    x, slope = inputs
    assert x is not None and slope is not None
    return [_negative_part_scaled(x, slope.astype(x.dtype, copy=False))]


def _negative_part_scaled(x: np.ndarray, factor: np.ndarray | np.generic) -> np.ndarray:
    # NOTE: np.where's result takes the promoted dtype of its branches; the factor already has x's dtype.
    return np.asarray(np.where(x < 0, x * factor, x), dtype=x.dtype)


@cpu_kernel("Sigmoid")
def sigmoid(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Logistic function; float types.

    Uses ``e = exp(-|x|) <= 1`` so nothing overflows: ``1 / (1 + e)`` for ``x >= 0`` and
    ``e / (1 + e)`` for ``x < 0``.
    """
    (x,) = inputs
    assert x is not None
    e = np.empty_like(x)
    np.abs(x, out=e)
    np.negative(e, out=e)
    with np.errstate(under="ignore"):  # exp(-|x|) flushing to 0 for huge |x| is the right answer
        np.exp(e, out=e)
    out = np.where(x >= 0, x.dtype.type(1), e)
    e += x.dtype.type(1)
    out /= e
    return [out]


@cpu_kernel("Tanh")
def tanh(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Hyperbolic tangent; float types."""
    (x,) = inputs
    assert x is not None
    return [np.tanh(x)]


@cpu_kernel("Clip")
def clip(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``min(max(x, lo), hi)`` with either bound optional; float and integer types.

    Bounds are cast to the data's dtype (opset < 11 bounds arrive as float32 whatever the data's float
    type). ``lo > hi`` gives ``hi`` everywhere, as ONNX specifies.
    """
    x = inputs[0]
    assert x is not None
    lo = _bound(inputs, 1, x.dtype)
    hi = _bound(inputs, 2, x.dtype)
    out = np.empty_like(x)
    if lo is not None:
        np.maximum(x, lo, out=out)
    else:
        out[...] = x
    if hi is not None:
        np.minimum(out, hi, out=out)
    return [out]


def _bound(inputs: Sequence[np.ndarray | None], index: int, dtype: np.dtype) -> np.generic | None:
    bound = inputs[index] if len(inputs) > index else None
    if bound is None:
        return None
    return bound.reshape(()).astype(dtype)[()]
