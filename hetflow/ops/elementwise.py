"""Elementwise arithmetic with numpy (multidirectional) broadcasting: Add, Sub, Mul, Div, Sum, Max, Min."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import broadcast
from hetflow.ops.base import OpDef, TensorInfo
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


class BinaryOp(BroadcastOp):
    num_inputs = (2, 2)


@register_op
class Add(BinaryOp):
    """``A + B`` with broadcasting."""

    op_type = "Add"


@register_op
class Sub(BinaryOp):
    """``A - B`` with broadcasting."""

    op_type = "Sub"


@register_op
class Mul(BinaryOp):
    """``A * B`` with broadcasting."""

    op_type = "Mul"


@register_op
class Div(BinaryOp):
    """``A / B`` with broadcasting; integer division truncates toward zero as in ONNX."""

    op_type = "Div"


class VariadicOp(BroadcastOp):
    num_inputs = (1, -1)


@register_op
class Sum(VariadicOp):
    """Sum of any number of inputs, with broadcasting."""

    op_type = "Sum"


@register_op
class Max(VariadicOp):
    """Elementwise maximum of any number of inputs (NaN propagates)."""

    op_type = "Max"


@register_op
class Min(VariadicOp):
    """Elementwise minimum of any number of inputs (NaN propagates)."""

    op_type = "Min"
