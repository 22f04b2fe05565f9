"""Normalisation: BatchNormalization (inference and training forms) and LRN."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape
from hetflow.ops.activation import FusedActivation
from hetflow.ops.attrs import required
from hetflow.ops.base import (
    Arrays,
    Cost,
    Grads,
    OpDef,
    TensorInfo,
    Wanted,
    nbytes,
    numel,
    present_outputs_bytes,
    wants,
)
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


def channel_window_sum(values: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """``out[:, c] = sum(values[:, c + lo : c + hi + 1])`` along axis 1, the window clipped to the channels
    (one cumulative sum, whatever the window's size)."""
    channels = values.shape[1]
    zero = np.zeros((values.shape[0], 1, *values.shape[2:]), values.dtype)
    totals = np.concatenate([zero, np.cumsum(values, axis=1)], axis=1)
    index = np.arange(channels)
    upper = np.clip(index + hi + 1, 0, channels)
    lower = np.clip(index + lo, 0, channels)
    return totals[:, upper] - totals[:, lower]


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

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (0,), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """With ``d = bias + alpha/size * S`` (S the window's sum of squares) and ``y = x d^-beta``:
        ``dx_j = dy_j d_j^-beta - 2 beta alpha/size x_j sum_c dy_c x_c d_c^(-beta-1)`` over the channels
        c whose window holds j (the window mirrored)."""
        x, dy = inputs[0], grad_outputs[0]
        assert x is not None
        if dy is None or not wants(wanted, 0):
            return [None]
        attrs = node.attrs
        before, after = lrn_window(attrs.size)
        coefficient = attrs.alpha / attrs.size
        denominator = attrs.bias + coefficient * channel_window_sum(x * x, -before, after)
        scale = denominator ** -attrs.beta
        spread = channel_window_sum(dy * x * scale / denominator, -after, before)
        dx = dy * scale - 2 * attrs.beta * coefficient * x * spread
        return [dx.astype(x.dtype, copy=False)]


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
    #: hetflow-internal, not an ONNX attribute: the activation fused into the output (inference form).
    fused: FusedActivation | None = None


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

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        # NOTE: mean and var are statistics (running averages in training), never learned.
        return (0, 1, 2)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return None, ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dX, dscale and dB. Training mode differentiates through the batch statistics:
        ``dx = (dxhat - mean(dxhat) - xhat mean(dxhat xhat)) / sqrt(var + eps)`` with ``dxhat = dy scale``;
        inference mode treats mean and var as constants. The running-statistics outputs carry no gradient.
        """
        x, scale, bias, mean, var = inputs
        dy = grad_outputs[0]
        assert x is not None and scale is not None and bias is not None
        assert mean is not None and var is not None
        grads: Grads = [None] * 5
        if dy is None:
            return grads
        attrs = node.attrs
        if attrs.fused is not None:
            raise ValueError(f"BatchNormalization '{node.name}' has a fused activation; train the unoptimised graph")
        axes = batchnorm_reduce_axes(x.ndim, attrs.spatial)
        shape = (1, *scale.shape) + (1,) * (x.ndim - 1 - scale.ndim)
        if attrs.training_mode:
            mean = x.mean(axis=axes)
            var = x.var(axis=axes)
        inv_std = 1.0 / np.sqrt(var.reshape(shape) + attrs.epsilon)
        xhat = (x - mean.reshape(shape)) * inv_std
        if wants(wanted, 1):
            grads[1] = (dy * xhat).sum(axis=axes).reshape(scale.shape).astype(scale.dtype, copy=False)
        if wants(wanted, 2):
            grads[2] = dy.sum(axis=axes).reshape(bias.shape).astype(bias.dtype, copy=False)
        if wants(wanted, 0):
            dxhat = dy * scale.reshape(shape)
            if attrs.training_mode:
                dxhat = (
                    dxhat
                    - dxhat.mean(axis=axes, keepdims=True)
                    - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)
                )
            grads[0] = (dxhat * inv_std).astype(x.dtype, copy=False)
        return grads
