"""CPU kernels: broadcasting arithmetic."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.devices.cpu.kernels.buffers import Out, deliver
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_residual import add_activate, compiled
from hetflow.devices.cpu.table import cpu_kernel
from hetflow.graph import Node

Inputs = Sequence[np.ndarray | None]
Workspace = np.ndarray | None


def _binary(ufunc: np.ufunc, a: np.ndarray | None, b: np.ndarray | None, out: Out) -> np.ndarray:
    """``ufunc(a, b)`` written into ``out[0]`` when given (it may be ``a``'s or ``b``'s own memory)."""
    target = out[0] if out is not None else None
    if target is not None:
        try:
            return ufunc(a, b, out=target)
        except (ValueError, TypeError):
            # NOTE: the planned buffer does not fit the broadcast result (or the dtype): allocate.
            pass
    return ufunc(a, b)


@cpu_kernel("Add", writes_out=True, inplace=True)
def add(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    """Broadcasting ``a + b``, then the fused activation; may run in place (the residual Add writes into a
    dying input)."""
    a, b = inputs
    return [_sum_activated(node, a, b, out)]


def _sum_activated(node: Node, a: np.ndarray | None, b: np.ndarray | None, out: Out) -> np.ndarray:
    """``activation(a + b)``: one compiled pass for same-shape float operands with an activation, else
    numpy's add and the activation after it."""
    fused = getattr(node.attrs, "fused", None)  # NOTE: nodes built by hand may carry no attrs
    assert a is not None and b is not None
    target = out[0] if out is not None else None
    if fused is not None and a.shape == b.shape:
        y = target if target is not None and target.shape == a.shape else np.empty(a.shape, a.dtype)
        if compiled(a, b, y):
            if not add_activate(a, b, y, fused):
                apply_activation(y, fused)
            return y
    y = _binary(np.add, a, b, out)
    apply_activation(y, fused)
    return y


@cpu_kernel("Sub", writes_out=True, inplace=True)
def sub(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    a, b = inputs
    return [_binary(np.subtract, a, b, out)]


@cpu_kernel("Mul", writes_out=True, inplace=True)
def mul(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    a, b = inputs
    return [_binary(np.multiply, a, b, out)]


@cpu_kernel("Div", writes_out=True, inplace=True)
def div(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    a, b = inputs
    assert a is not None and b is not None
    if a.dtype.kind in "iu":
        # ONNX integer division truncates toward zero; numpy's // floors.
        with np.errstate(divide="ignore", invalid="ignore"):
            return [deliver(out, 0, np.trunc(np.true_divide(a, b)).astype(a.dtype))]
    return [_binary(np.divide, a, b, out)]


def _reduce_variadic(ufunc: np.ufunc, inputs: Inputs, out: Out) -> list[np.ndarray]:
    arrays = [x for x in inputs if x is not None]
    if len(arrays) == 1:
        # A copy, so that callers never alias the feed.
        return [deliver(out, 0, np.array(arrays[0], copy=True))]
    target = out[0] if out is not None else None
    if target is not None:
        # NOTE: in place, the target is one of the inputs: it must be consumed by the first operation
        # (the ufuncs here are commutative, so the order is free).
        arrays.sort(key=lambda x: not np.may_share_memory(x, target))
    result = _binary(ufunc, arrays[0], arrays[1], out)
    for x in arrays[2:]:
        if result.shape == np.broadcast_shapes(result.shape, x.shape):
            ufunc(result, x, out=result)
        else:
            result = ufunc(result, x)
    return [deliver(out, 0, result)]


@cpu_kernel("Sum", writes_out=True, inplace=True)
def sum_(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    """Variadic broadcasting sum, then the fused activation; may run in place."""
    arrays = [x for x in inputs if x is not None]
    if len(arrays) == 2:
        return [deliver(out, 0, _sum_activated(node, arrays[0], arrays[1], out))]
    (y,) = _reduce_variadic(np.add, inputs, out)
    apply_activation(y, getattr(node.attrs, "fused", None))
    return [y]


@cpu_kernel("Max", writes_out=True, inplace=True)
def max_(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    return _reduce_variadic(np.maximum, inputs, out)


@cpu_kernel("Min", writes_out=True, inplace=True)
def min_(node: Node, inputs: Inputs, out: Out = None, workspace: Workspace = None) -> list[np.ndarray]:
    return _reduce_variadic(np.minimum, inputs, out)
