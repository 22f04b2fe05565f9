"""Softmax and LogSoftmax: normalised exponentials along an axis (or, for old opsets, trailing axes)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Shape, normalize_axis
from hetflow.ops.base import Arrays, Cost, Grads, OpDef, TensorInfo, Wanted, nbytes, numel, wants
from hetflow.ops.registry import register_op


@dataclass(frozen=True)
class SoftmaxAttrs:
    """Attributes of Softmax and LogSoftmax.

    Attributes:
        axis: the axis to normalise along (negative counts from the end).
        coerce_2d: not an ONNX attribute: 1 for models of opset < 13, where the input is viewed as a
            2-D matrix ``[prod(shape[:axis]), prod(shape[axis:])]`` and normalised over every axis
            from ``axis`` on. The importer sets it (and the old default ``axis=1``).
    """

    axis: int = -1
    coerce_2d: int = 0


def normalised_axes(shape: Shape, attrs: SoftmaxAttrs) -> tuple[int, ...]:
    """The axes one softmax row spans: ``(axis,)``, or ``axis..rank-1`` with ``coerce_2d``."""
    rank = len(shape)
    axis = normalize_axis(attrs.axis, rank)
    if attrs.coerce_2d:
        return tuple(range(axis, rank))
    if rank == 0:
        raise ValueError("Softmax needs an input of rank >= 1")
    return (axis,)


class SoftmaxFamily(OpDef):
    """Family base: output has the input's shape and dtype; one implementation for both ops."""

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), (0,)

    Attrs = SoftmaxAttrs
    #: ``max`` compare, subtract, exp, sum and a final divide/subtract per element.
    flops_per_element: ClassVar[int] = 5
    #: transcendental ops per row (LogSoftmax's log of the sum).
    flops_per_row: ClassVar[int] = 0

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        normalised_axes(x.shape, node.attrs)
        if x.dtype.kind != "f":
            raise ValueError(f"{self.op_type} needs a float input, got {x.dtype}")
        return [TensorInfo(x.shape, x.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        x = inputs[0]
        assert x is not None
        elements = numel(x)  # 0 while the shape is symbolic
        rows = 0
        if elements:
            row_length = int(np.prod([x.shape[a] for a in normalised_axes(x.shape, node.attrs)]))
            rows = elements // row_length
        return Cost(
            flops=self.flops_per_element * elements + self.flops_per_row * rows,
            bytes_read=nbytes(x),
            bytes_written=sum(nbytes(o) for o in outputs),
        )


@register_op
class Softmax(SoftmaxFamily):
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Attributes:
        axis: the normalised axis (default -1); see ``SoftmaxAttrs`` for ``coerce_2d``.
    """

    op_type = "Softmax"

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """``dx = y (dy - sum(dy y))`` over each normalised row."""
        y, dy = outputs[0], grad_outputs[0]
        if dy is None or not wants(wanted, 0):
            return [None]
        axes = normalised_axes(y.shape, node.attrs)
        return [y * (dy - np.sum(dy * y, axis=axes, keepdims=True))]


@register_op
class LogSoftmax(SoftmaxFamily):
    """``(x - max) - log(sum(exp(x - max)))`` along ``axis``.

    Attributes:
        axis: the normalised axis (default -1); see ``SoftmaxAttrs`` for ``coerce_2d``.
    """

    op_type = "LogSoftmax"
    flops_per_row = 1

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """``dx = dy - softmax(x) sum(dy)`` over each normalised row (softmax is ``exp(y)``)."""
        y, dy = outputs[0], grad_outputs[0]
        if dy is None or not wants(wanted, 0):
            return [None]
        axes = normalised_axes(y.shape, node.attrs)
        return [dy - np.exp(y) * np.sum(dy, axis=axes, keepdims=True)]
