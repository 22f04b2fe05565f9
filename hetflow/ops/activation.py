"""Activations: elementwise, and fusable into the producing Conv/Gemm epilogue."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.graph import Node
from hetflow.ops.base import OpDef, TensorInfo
from hetflow.ops.registry import register_op


class UnaryOp(OpDef):
    """Family base: one input, one output of the same shape and dtype."""

    traits = frozenset({"elementwise"})

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        return [TensorInfo(x.shape, x.dtype)]


class Activation(UnaryOp):
    traits = frozenset({"elementwise", "fusable"})


@register_op
class Relu(Activation):
    """``max(x, 0)``."""

    op_type = "Relu"
