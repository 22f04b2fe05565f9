"""CPU kernels: Softmax and LogSoftmax (one numerically stable implementation for both)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.buffers import Out, Scratch, output, scratch_bytes
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.softmax import normalised_axes


@cpu_kernel("Softmax", writes_out=True, inplace=True)
def softmax(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """Softmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved; may run
    in place."""
    (x,) = inputs
    assert x is not None
    return [_softmax(x, normalised_axes(x.shape, node.attrs), output(out, 0, x.shape, x.dtype), None)]


def _exp_workspace(node: Node, inputs: Sequence[TensorInfo | None]) -> int:
    x = inputs[0]
    return 0 if x is None else scratch_bytes([(tuple(x.shape), x.dtype)])


@cpu_kernel("LogSoftmax", writes_out=True, inplace=True, workspace=_exp_workspace)
def log_softmax(
    node: Node, inputs: Sequence[np.ndarray | None], out: Out = None, workspace: np.ndarray | None = None
) -> list[np.ndarray]:
    """LogSoftmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved; may
    run in place."""
    (x,) = inputs
    assert x is not None
    y = output(out, 0, x.shape, x.dtype)
    return [_softmax(x, normalised_axes(x.shape, node.attrs), y, Scratch(workspace))]


def _softmax(x: np.ndarray, axes: tuple[int, ...], y: np.ndarray, log: Scratch | None) -> np.ndarray:
    """Softmax (LogSoftmax when ``log`` gives the scratch for the exponentials) of ``x`` into ``y``."""
    if x.size == 0:
        return y
    # NOTE: subtracting the row maximum keeps exp() <= 1, so large inputs neither overflow nor lose
    # the result; reducing over a tuple of axes covers the old-opset "flatten to 2-D" form without a copy.
    np.subtract(x, np.max(x, axis=axes, keepdims=True), out=y)
    if log is not None:
        exp = log.take(x.shape, x.dtype)
        np.exp(y, out=exp)
        y -= np.log(np.sum(exp, axis=axes, keepdims=True))
        return y
    np.exp(y, out=y)
    y /= np.sum(y, axis=axes, keepdims=True)
    return y
