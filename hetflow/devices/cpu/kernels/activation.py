"""CPU kernels: activations (numpy, elementwise, dtype-preserving)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.base import BoundCall
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, output, scratch_bytes
from hetflow.devices.cpu.kernels.jit_epilogue import RELU, activation_job
from hetflow.devices.cpu.kernels.one_pass import captured_as_one_job, float32_target
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo

Workspace = np.ndarray | None


def _prepare_relu(node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: Workspace) -> BoundCall | None:
    """A float32 Relu bound to the Y the plan placed (its input's memory, or its own): captured as one
    compiled pass (``jit_epilogue.activation_job``; see ``one_pass``)."""
    target = float32_target(inputs[0], out)
    if target is None:
        return None
    return captured_as_one_job(
        lambda arrays: relu(node, arrays, out),
        target,
        lambda x: activation_job(x.reshape(-1), target.reshape(-1), RELU),
    )


@cpu_kernel("Relu", writes_out=True, inplace=True, prepare=_prepare_relu)
def relu(node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    """``max(x, 0)`` for any numeric dtype; may run in place."""
    (x,) = inputs
    assert x is not None
    return [np.maximum(x, x.dtype.type(0), out=output(out, 0, x.shape, x.dtype))]


@cpu_kernel("LeakyRelu", writes_out=True)
def leaky_relu(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """``x`` for ``x >= 0`` else ``alpha * x``; float types.

    For ``0 <= alpha <= 1`` that is ``max(x, alpha * x)`` (and ``min`` for ``alpha > 1``): two passes
    into the output and no temporary.
    """
    (x,) = inputs
    assert x is not None
    alpha = x.dtype.type(node.attrs.alpha)
    if alpha < 0:
        return [_negative_part_scaled(x, alpha)]
    y = output(out, 0, x.shape, x.dtype)
    np.multiply(x, alpha, out=y)
    (np.maximum if alpha <= 1 else np.minimum)(y, x, out=y)
    return [y]


@cpu_kernel("PRelu")
def prelu(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """``x`` for ``x >= 0`` else ``slope * x``; ``slope`` broadcasts to ``x``; float and integer types."""
    x, slope = inputs
    assert x is not None and slope is not None
    return [_negative_part_scaled(x, slope.astype(x.dtype, copy=False))]


def _negative_part_scaled(x: np.ndarray, factor: np.ndarray | np.generic) -> np.ndarray:
    # NOTE: np.where's result takes the promoted dtype of its branches; the factor already has x's dtype.
    return np.asarray(np.where(x < 0, x * factor, x), dtype=x.dtype)


def _same_size_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    x = inputs[0]
    return 0 if x is None else scratch_bytes([(tuple(x.shape), x.dtype)])


@cpu_kernel("Sigmoid", writes_out=True, workspace=_same_size_workspace)
def sigmoid(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None
) -> list[np.ndarray]:
    """Logistic function; float types.

    With ``e = exp(-|x|) <= 1`` nothing overflows: ``1 / (1 + e)`` for ``x >= 0`` and ``e / (1 + e)``
    for ``x < 0``, i.e. ``exp(min(x, 0)) / (1 + e)`` everywhere (no mask, one temporary).
    """
    (x,) = inputs
    assert x is not None
    y = output(out, 0, x.shape, x.dtype)
    e = Scratch(workspace).take(x.shape, x.dtype)
    np.abs(x, out=e)
    np.negative(e, out=e)
    with np.errstate(under="ignore"):  # exp(-|x|) flushing to 0 for huge |x| is the right answer
        np.exp(e, out=e)
        np.add(e, x.dtype.type(1), out=y)
        np.reciprocal(y, out=y)
        np.minimum(x, x.dtype.type(0), out=e)
        np.exp(e, out=e)
    y *= e
    return [y]


@cpu_kernel("Tanh", writes_out=True, inplace=True)
def tanh(node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    """Hyperbolic tangent; float types; may run in place."""
    (x,) = inputs
    assert x is not None
    return [np.tanh(x, out=output(out, 0, x.shape, x.dtype))]


@cpu_kernel("Clip", writes_out=True, inplace=True)
def clip(node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    """``min(max(x, lo), hi)`` with either bound optional; float and integer types.

    Bounds are cast to the data's dtype (opset < 11 bounds arrive as float32 whatever the data's float
    type). ``lo > hi`` gives ``hi`` everywhere, as ONNX specifies.
    """
    x = inputs[0]
    assert x is not None
    lo = _bound(inputs, 1, x.dtype)
    hi = _bound(inputs, 2, x.dtype)
    y = output(out, 0, x.shape, x.dtype)
    if lo is not None:
        np.maximum(x, lo, out=y)
    elif y is not x:
        np.copyto(y, x)
    if hi is not None:
        np.minimum(y, hi, out=y)
    return [y]


def _bound(inputs: Sequence[np.ndarray | None], index: int, dtype: np.dtype) -> np.generic | None:
    bound = inputs[index] if len(inputs) > index else None
    if bound is None:
        return None
    return bound.reshape(()).astype(dtype)[()]
