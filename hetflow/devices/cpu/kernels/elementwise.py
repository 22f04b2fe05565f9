"""CPU kernels: broadcasting arithmetic."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node


@cpu_kernel("Add")
def add(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs
    return [np.add(a, b)]


@cpu_kernel("Sub")
def sub(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs
    return [np.subtract(a, b)]


@cpu_kernel("Mul")
def mul(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs
    return [np.multiply(a, b)]


@cpu_kernel("Div")
def div(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    a, b = inputs
    assert a is not None and b is not None
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero; numpy's // floors.
        with np.errstate(divide="ignore", invalid="ignore"):
            return [np.trunc(np.true_divide(a, b)).astype(a.dtype)]
    return [np.divide(a, b)]


def _reduce_variadic(ufunc: np.ufunc, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    arrays = [x for x in inputs if x is not None]
    result = functools.reduce(ufunc, arrays[1:], arrays[0])
    # A single input is returned as a copy so that callers never alias the feed.
    return [np.array(result, copy=True) if len(arrays) == 1 else result]


@cpu_kernel("Sum")
def sum_(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return _reduce_variadic(np.add, inputs)


@cpu_kernel("Max")
def max_(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return _reduce_variadic(np.maximum, inputs)


@cpu_kernel("Min")
def min_(node: Node, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray]:
    return _reduce_variadic(np.minimum, inputs)
