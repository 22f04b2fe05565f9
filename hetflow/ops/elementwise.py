"""Elementwise arithmetic with numpy (multidirectional) broadcasting: Add, Sub, Mul, Div, Sum, Max, Min."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import broadcast
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import Arrays, Grads, OpDef, TensorInfo, Wanted, reduce_to_shape, wants
from hetflow.ops.registry import register_op


class BroadcastOp(OpDef):
    """Family base: outputs take the broadcast shape of all inputs and the first input's dtype."""

    traits = frozenset({"elementwise"})

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        present = [i for i in inputs if i is not None]
        dtypes = {i.dtype for i in present}
        if len(dtypes) > 1:
            raise ValueError(f"inputs have different dtypes {sorted(map(str, dtypes))}")
        return [TensorInfo(broadcast(*(i.shape for i in present)), present[0].dtype)]


def _broadcast_grads(inputs, dy, wanted, local) -> Grads:
    """Per input, ``local(index, dy)`` (the gradient at the broadcast shape) summed back to the input's
    shape; None for omitted or unwanted inputs."""
    grads: Grads = [None] * len(inputs)
    if dy is None:
        return grads
    for index, x in enumerate(inputs):
        if x is not None and wants(wanted, index):
            grads[index] = reduce_to_shape(local(index, dy), x.shape).astype(x.dtype, copy=False)
    return grads


class BinaryOp(BroadcastOp):
    num_inputs = (2, 2)


@dataclass(frozen=True)
class SumAttrs:
    """Add's and Sum's attributes: none in ONNX."""

    #: hetflow-internal, not an ONNX attribute: the activation fused into the output (ResNet's residual
    #: Add followed by Relu).
    fused: FusedActivation | None = None


def _refuse_fused(node: Node) -> None:
    if getattr(node.attrs, "fused", None) is not None:
        raise ValueError(f"{node.op_type} '{node.name}' has a fused activation; train the unoptimised graph")


@register_op
class Add(BinaryOp):
    """``A + B`` with broadcasting."""

    op_type = "Add"
    Attrs = SumAttrs

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        _refuse_fused(node)
        return _broadcast_grads(inputs, grad_outputs[0], wanted, lambda i, dy: dy)


@register_op
class Sub(BinaryOp):
    """``A - B`` with broadcasting."""

    op_type = "Sub"

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        return _broadcast_grads(inputs, grad_outputs[0], wanted, lambda i, dy: dy if i == 0 else -dy)


@register_op
class Mul(BinaryOp):
    """``A * B`` with broadcasting."""

    op_type = "Mul"

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        a, b = inputs
        return _broadcast_grads(inputs, grad_outputs[0], wanted, lambda i, dy: dy * (b if i == 0 else a))


@register_op
class Div(BinaryOp):
    """``A / B`` with broadcasting; integer division truncates toward zero as in ONNX."""

    op_type = "Div"

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        a, b = inputs
        if a is not None and a.dtype.kind != "f":
            return [None, None]
        return _broadcast_grads(
            inputs, grad_outputs[0], wanted, lambda i, dy: dy / b if i == 0 else -dy * a / (b * b)
        )


class VariadicOp(BroadcastOp):
    num_inputs = (1, -1)


@register_op
class Sum(VariadicOp):
    """Sum of any number of inputs, with broadcasting."""

    op_type = "Sum"
    Attrs = SumAttrs

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        _refuse_fused(node)
        return _broadcast_grads(inputs, grad_outputs[0], wanted, lambda i, dy: dy)


class ExtremumOp(VariadicOp):
    """Family base of Max and Min: dY goes to the first input holding the winning value."""

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        y, dy = outputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if dy is None or y is None:
            return grads
        taken = np.zeros(y.shape, dtype=bool)
        for index, x in enumerate(inputs):
            if x is None:
                continue
            hit = (np.broadcast_to(x, y.shape) == y) & ~taken
            taken |= hit
            if wants(wanted, index):
                grads[index] = reduce_to_shape(np.where(hit, dy, 0), x.shape).astype(x.dtype, copy=False)
        return grads


@register_op
class Max(ExtremumOp):
    """Elementwise maximum of any number of inputs (NaN propagates)."""

    op_type = "Max"


@register_op
class Min(ExtremumOp):
    """Elementwise minimum of any number of inputs (NaN propagates)."""

    op_type = "Min"
