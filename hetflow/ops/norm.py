"""Normalisation: BatchNormalization (inference and training forms) and LRN."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape
from hetflow.ops.attrs import required
from hetflow.ops.base import Cost, OpDef, TensorInfo, nbytes, numel, present_outputs_bytes
from hetflow.ops.registry import register_op


@dataclass(frozen=True)
class LRNAttrs:
    """LRN's attributes (opset 13)."""

    alpha: float = 0.0001
    beta: float = 0.75
    bias: float = 1.0
    size: int = required()


def lrn_window(size: int) -> tuple[int, int]:
    """Channels before and after ``c`` in LRN's window: ``floor((size-1)/2)`` and ``ceil((size-1)/2)``."""
    return (size - 1) // 2, size // 2


@register_op
class LRN(OpDef):
    """Local response normalisation across channels (AlexNet).

    ``Y[n, c] = X[n, c] / (bias + alpha / size * sum(X[n, i] ** 2)) ** beta`` with ``i`` over
    ``c - floor((size-1)/2) .. c + ceil((size-1)/2)`` clipped to the channels. X is ``[N, C, ...]``.
    """

    op_type = "LRN"
    Attrs = LRNAttrs

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None
        if len(x.shape) < 2:
            raise ValueError(f"X must be [N, C, ...]; got {format_shape(x.shape)}")
        if node.attrs.size < 1:
            raise ValueError(f"size must be >= 1; got {node.attrs.size}")
        if x.dtype.kind != "f":
            raise ValueError(f"dtype {x.dtype} is not supported (float types only)")
        return [TensorInfo(x.shape, x.dtype)]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """Per element: a square, ``size`` window additions, scale-and-bias, a power and a division."""
        return Cost(
            flops=numel(inputs[0]) * (node.attrs.size + 4),
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
        )


@dataclass(frozen=True)
class BatchNormalizationAttrs:
    """BatchNormalization's attributes (opset 15), plus opset 7-8's ``spatial``.

    ``spatial=0`` (only expressible before opset 9) means scale, B, mean and var are ``[C, D1, ...]``:
    one set of statistics per element rather than per channel.
    """

    epsilon: float = 1e-5
    momentum: float = 0.9
    training_mode: int = 0
    spatial: int = 1


def batchnorm_param_shape(x_shape: Shape, spatial: int) -> Shape:
    """The shape scale, B, mean and var must have for input ``x_shape``."""
    return tuple(x_shape[1:2]) if spatial else tuple(x_shape[1:])


def batchnorm_reduce_axes(rank: int, spatial: int) -> tuple[int, ...]:
    """The axes training-mode statistics reduce over (every axis but the channel, or the batch only)."""
    return tuple(a for a in range(rank) if a != 1) if spatial else (0,)


def _same_dims(a: Sequence[Dim], b: Sequence[Dim]) -> bool:
    return len(a) == len(b) and all(
        not (isinstance(p, int) and isinstance(q, int)) or p == q for p, q in zip(a, b)
    )


@register_op
class BatchNormalization(OpDef):
    """``Y = (X - mean) / sqrt(var + epsilon) * scale + B`` per channel (per element with ``spatial=0``).

    Inference (``training_mode=0``): mean and var are the inputs; one output. Training
    (``training_mode=1``): mean and var are the batch's (population variance), and the optional outputs
    are ``running = input * momentum + batch * (1 - momentum)`` for mean and var, in their input's dtype.
    """

    op_type = "BatchNormalization"
    Attrs = BatchNormalizationAttrs
    num_inputs = (5, 5)
    num_outputs = (1, 3)

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        x = inputs[0]
        assert x is not None and all(i is not None for i in inputs)
        if len(x.shape) < 2:
            raise ValueError(f"X must be [N, C, ...]; got {format_shape(x.shape)}")
        if x.dtype.kind != "f":
            raise ValueError(f"dtype {x.dtype} is not supported (float types only)")
        expected = batchnorm_param_shape(x.shape, node.attrs.spatial)
        for name, info in zip(("scale", "B", "input_mean", "input_var"), inputs[1:]):
            assert info is not None
            if not _same_dims(info.shape, expected):
                raise ValueError(
                    f"{name} has shape {format_shape(info.shape)}; expected {format_shape(expected)}"
                )
        extra = [o for o in node.outputs[1:] if o]
        if extra and not node.attrs.training_mode:
            raise ValueError(f"outputs {extra} exist only with training_mode=1")
        mean, var = inputs[3], inputs[4]
        assert mean is not None and var is not None
        return [
            TensorInfo(x.shape, x.dtype),
            TensorInfo(mean.shape, mean.dtype),
            TensorInfo(var.shape, var.dtype),
        ]

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        """Inference: a multiply-add per element (scale and shift folded per channel); training adds the
        batch mean (1 per element) and variance (3 per element)."""
        per_element = 6 if node.attrs.training_mode else 2
        return Cost(
            flops=numel(inputs[0]) * per_element,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=present_outputs_bytes(node, outputs),
        )
