"""Activations: elementwise, and fusable into the producing Conv/Gemm epilogue.

Relu, LeakyRelu, PRelu, Sigmoid, Tanh and Clip. They share one base (``UnaryOp``): the output takes
the first input's shape and dtype, and the cost is a fixed number of operations per output element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import check_broadcasts_to, format_shape
from hetflow.ops.base import (
    Arrays,
    Cost,
    Grads,
    OpDef,
    TensorInfo,
    Wanted,
    nbytes,
    numel,
    reduce_to_shape,
    wants,
)
from hetflow.ops.registry import register_op


@dataclass(frozen=True)
class FusedActivation:
    """An activation applied in a producer's epilogue (set by ``passes.fuse_activation``).

    Attributes:
        op_type: ``"Relu"``, ``"LeakyRelu"``, ``"Clip"``, ``"Sigmoid"`` or ``"Tanh"``.
        alpha: LeakyRelu's slope, or Clip's lower bound.
        beta: Clip's upper bound.
    """

    op_type: str
    alpha: float = 0.0
    beta: float = 0.0


class UnaryOp(OpDef):
    """Family base: the output has the shape and dtype of the first input (``X``).

    Extra inputs (PRelu's slope, Clip's bounds) are parameters that must not change the output shape;
    subclasses check them in ``check_params``. ``flops_per_element`` is the arithmetic per output
    element (a transcendental function counts as one operation).
    """

    traits = frozenset({"elementwise"})
    flops_per_element: ClassVar[int] = 1

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        self.check_params(x, inputs[1:])
        return [TensorInfo(x.shape, x.dtype)]

    def check_params(self, x: TensorInfo, params: Sequence[TensorInfo | None]) -> None:
        """Raise ValueError when a parameter input does not fit ``x`` (default: no parameters)."""
        for param in params:
            if param is not None and param.dtype != x.dtype:
                raise ValueError(f"input dtypes differ: X is {x.dtype}, a parameter is {param.dtype}")

    def element_flops(self, node: Node, inputs: Sequence[TensorInfo | None]) -> int:
        """Operations per output element; ops whose count depends on the node override this."""
        return self.flops_per_element

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        return Cost(
            flops=self.element_flops(node, inputs) * sum(numel(o) for o in outputs),
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=sum(nbytes(o) for o in outputs),
        )


class Activation(UnaryOp):
    """An activation a producer's epilogue can apply (its parameter inputs travel with it).

    Subclasses with a backward rule implement ``input_grad``: dX from X, Y and dY (parameters, when the
    op has any, get their own rule by overriding ``backward``).
    """

    traits = frozenset({"elementwise", "fusable"})

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        # NOTE: X and the parameters; Sigmoid and Tanh read their output instead.
        return None, ()

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        raise NotImplementedError(f"{self.op_type} has no backward rule")

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        x, y, dy = inputs[0], outputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if dy is not None and wants(wanted, 0):
            grads[0] = self.input_grad(node, x, y, dy, inputs[1:]).astype(x.dtype, copy=False)
        return grads

    @property
    def has_backward(self) -> bool:
        return type(self).input_grad is not Activation.input_grad or super().has_backward


@register_op
class Relu(Activation):
    """``max(x, 0)``."""

    op_type = "Relu"

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        return dy * (x > 0)


@dataclass(frozen=True)
class LeakyReluAttrs:
    """LeakyRelu's attributes: ``alpha``, the slope of the negative part."""

    alpha: float = 0.01


@register_op
class LeakyRelu(Activation):
    """``x`` where ``x >= 0``, else ``alpha * x``.

    Attributes:
        alpha: the slope of the negative part (default 0.01).
    """

    op_type = "LeakyRelu"
    Attrs = LeakyReluAttrs
    flops_per_element = 2  # compare/select + multiply

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        return dy * np.where(x >= 0, 1.0, node.attrs.alpha).astype(dy.dtype)


@register_op
class PRelu(Activation):
    """``x`` where ``x >= 0``, else ``slope * x``; ``slope`` broadcasts unidirectionally to ``X``.

    Inputs:
        X: the data.
        slope: same dtype as ``X``, broadcastable to ``X``'s shape (typically ``[C, 1, 1]`` per channel),
            so an epilogue that fuses PRelu carries it as a parameter.
    """

    op_type = "PRelu"
    num_inputs = (2, 2)
    flops_per_element = 2

    def check_params(self, x: TensorInfo, params: Sequence[TensorInfo | None]) -> None:
        super().check_params(x, params)
        slope = params[0]
        assert slope is not None
        check_broadcasts_to(slope.shape, x.shape, "slope")

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0, 1)

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        x, slope = inputs[0], inputs[1]
        dy = grad_outputs[0]
        grads: Grads = [None, None]
        if dy is None:
            return grads
        negative = x < 0
        if wants(wanted, 0):
            grads[0] = np.where(negative, dy * slope, dy).astype(x.dtype, copy=False)
        if wants(wanted, 1):
            grads[1] = reduce_to_shape(np.where(negative, dy * x, 0), slope.shape).astype(slope.dtype)
        return grads


@register_op
class Sigmoid(Activation):
    """``1 / (1 + exp(-x))``, evaluated without overflow for large ``|x|``."""

    op_type = "Sigmoid"
    flops_per_element = 3  # exp, add, divide

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), (0,)

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        return dy * y * (1 - y)


@register_op
class Tanh(Activation):
    """Hyperbolic tangent."""

    op_type = "Tanh"

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (), (0,)

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        return dy * (1 - y * y)


@register_op
class Clip(Activation):
    """``min(max(x, min), max)``; either bound may be omitted. With ``min > max`` every element is ``max``.

    Inputs:
        input: the data (float or integer types).
        min: optional scalar of the data's dtype (opset < 11 attributes are moved here on import).
        max: optional scalar of the data's dtype.
    """

    op_type = "Clip"
    num_inputs = (1, 3)

    def check_params(self, x: TensorInfo, params: Sequence[TensorInfo | None]) -> None:
        for name, bound in zip(("min", "max"), params):
            if bound is None:
                continue
            if tuple(bound.shape) not in ((), (1,)):
                raise ValueError(f"{name} must be a scalar, got shape {format_shape(bound.shape)}")
            # NOTE: opset < 11 bounds are imported as float32 constants whatever the data's float type;
            # the kernel casts them, so only a float/integer mismatch is an error.
            if (bound.dtype.kind == "f") != (x.dtype.kind == "f"):
                raise ValueError(f"{name} has dtype {bound.dtype} but input has dtype {x.dtype}")

    def element_flops(self, node: Node, inputs: Sequence[TensorInfo | None]) -> int:
        return sum(1 for bound in inputs[1:] if bound is not None)

    def input_grad(
        self, node: Node, x: np.ndarray, y: np.ndarray, dy: np.ndarray, params: Arrays
    ) -> np.ndarray:
        # NOTE: the bounds are constants; the gradient passes where x lies inside them (inclusive, as in
        # PyTorch's clamp), and nowhere when min > max (every output is max).
        inside = np.ones(x.shape, dtype=bool)
        low = params[0] if len(params) > 0 else None
        high = params[1] if len(params) > 1 else None
        if low is not None:
            inside &= x >= np.asarray(low).reshape(())
        if high is not None:
            inside &= x <= np.asarray(high).reshape(())
        if low is not None and high is not None and np.asarray(low) > np.asarray(high):
            inside[...] = False
        return dy * inside

