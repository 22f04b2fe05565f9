"""CPU kernels: Softmax and LogSoftmax (one numerically stable implementation for both)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node
from hetflow.ops.softmax import normalised_axes


@cpu_kernel("Softmax")
def softmax(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """Softmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved."""
    (x,) = inputs
    assert x is not None
    return [_softmax(x, normalised_axes(x.shape, node.attrs), log=False)]


@cpu_kernel("LogSoftmax")
def log_softmax(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    """LogSoftmax along ``axis`` (or ``axis..`` with ``coerce_2d``); float types, dtype preserved."""
    (x,) = inputs
    assert x is not None
    return [_softmax(x, normalised_axes(x.shape, node.attrs), log=True)]


def _softmax(x: np.ndarray, axes: tuple[int, ...], log: bool) -> np.ndarray:
    if x.size == 0:
        return np.empty_like(x)
    # NOTE: subtracting the row maximum keeps exp() <= 1, so large inputs neither overflow nor lose
    # the result; reducing over a tuple of axes covers the old-opset "flatten to 2-D" form without a copy.
    shifted = np.subtract(x, np.max(x, axis=axes, keepdims=True))
    exp = np.exp(shifted)
    total = np.sum(exp, axis=axes, keepdims=True)
    if log:
        shifted -= np.log(total)
        return shifted
    exp /= total
    return exp
