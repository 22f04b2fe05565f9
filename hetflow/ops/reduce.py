"""Reductions over a set of axes given as an optional input (the opset-18 form): ReduceMean."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from hetflow.graph import Node
from hetflow.graph.shapes import Dim, Shape, format_shape, normalize_axis
from hetflow.ops.base import Arrays, Cost, Grads, OpDef, TensorInfo, Wanted, nbytes, numel, wants
from hetflow.ops.registry import register_op


@dataclass(frozen=True)
class ReduceAttrs:
    """Attributes shared by the opset-18 reductions.

    Attributes:
        keepdims: keep each reduced axis as a dimension of size 1 (default 1).
        noop_with_empty_axes: with no (or empty) ``axes``, return the input unchanged instead of
            reducing over every axis (default 0).
    """

    keepdims: int = 1
    noop_with_empty_axes: int = 0


def resolve_axes(rank: int, axes: np.ndarray | None, noop_with_empty_axes: int) -> tuple[int, ...] | None:
    """The sorted axes to reduce, or None when the reduction is the identity.

    Args:
        rank: the data's rank.
        axes: the ``axes`` input (1-D int64) or None when omitted.
        noop_with_empty_axes: the attribute of that name.

    Raises:
        ValueError: an axis is out of range or repeated.
    """
    if axes is None or axes.size == 0:
        return None if noop_with_empty_axes else tuple(range(rank))
    if axes.dtype.kind not in "iu" or axes.ndim > 1:
        raise ValueError(f"axes must be a 1-D int64 tensor, got {axes.dtype} of shape {list(axes.shape)}")
    resolved = sorted(normalize_axis(int(a), rank) for a in axes.reshape(-1))
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"axes {axes.tolist()} repeat an axis")
    return tuple(resolved)


def reduced_shape(shape: Shape, axes: tuple[int, ...] | None, keepdims: int) -> Shape:
    """The output shape of reducing ``shape`` over ``axes`` (None: identity)."""
    if axes is None:
        return tuple(shape)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


class ReduceOp(OpDef):
    """Family base: data plus an optional ``axes`` input; output of the data's dtype.

    When ``axes`` is computed at run time the output's rank is still known (``keepdims``, or a static
    length of ``axes``); its dimensions then become fresh symbols named after the output.
    """

    Attrs = ReduceAttrs
    num_inputs = (1, 2)
    #: operations per input element (accumulate) and per output element (e.g. the mean's divide).
    flops_per_input: ClassVar[int] = 1
    flops_per_output: ClassVar[int] = 0

    def infer(
        self,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        consts: Sequence[np.ndarray | None],
    ) -> list[TensorInfo]:
        data = inputs[0]
        assert data is not None
        axes_info = inputs[1] if len(inputs) > 1 else None
        axes_value = consts[1] if len(consts) > 1 else None
        if axes_info is None or axes_value is not None:
            axes = resolve_axes(len(data.shape), axes_value, node.attrs.noop_with_empty_axes)
            return [TensorInfo(reduced_shape(data.shape, axes, node.attrs.keepdims), data.dtype)]
        return [TensorInfo(self._runtime_axes_shape(node, data.shape, axes_info), data.dtype)]

    def _runtime_axes_shape(self, node: Node, shape: Shape, axes: TensorInfo) -> Shape:
        if axes.dtype != np.int64 or len(axes.shape) != 1:
            raise ValueError(f"axes must be a 1-D int64 tensor, got {axes.dtype} {format_shape(axes.shape)}")
        length = axes.shape[0]
        if length == 0:
            resolved = resolve_axes(len(shape), None, node.attrs.noop_with_empty_axes)
            return reduced_shape(shape, resolved, node.attrs.keepdims)
        if node.attrs.keepdims:
            rank: Dim = len(shape)
        elif isinstance(length, int):
            rank = len(shape) - length
        else:
            raise ValueError(
                f"{self.op_type} with keepdims=0 needs constant axes or axes of static length"
            )
        if rank < 0:
            raise ValueError(f"axes has {length} entries but the data has rank {len(shape)}")
        # NOTE: which dimensions survive is only known at run time.
        return tuple(f"{node.outputs[0]}_dim{i}" for i in range(rank))

    def cost(
        self, node: Node, inputs: Sequence[TensorInfo | None], outputs: Sequence[TensorInfo]
    ) -> Cost:
        axes = inputs[1] if len(inputs) > 1 else None
        no_axes = axes is None or 0 in axes.shape
        flops = 0
        if not (no_axes and node.attrs.noop_with_empty_axes):
            flops = self.flops_per_input * numel(inputs[0]) + self.flops_per_output * numel(outputs[0])
        return Cost(
            flops=flops,
            bytes_read=sum(nbytes(i) for i in inputs),
            bytes_written=sum(nbytes(o) for o in outputs),
        )


@register_op
class ReduceMean(ReduceOp):
    """Mean over ``axes`` (every axis when omitted, unless ``noop_with_empty_axes``).

    Inputs:
        data: float or integer tensor. Integer means truncate toward zero, as ONNX (and ONNX
            Runtime's integer division) define them.
        axes: optional 1-D int64 tensor; negative values count from the end.

    Attributes:
        keepdims: keep reduced axes as size-1 dimensions (default 1).
        noop_with_empty_axes: empty ``axes`` means identity rather than "all axes" (default 0).
    """

    op_type = "ReduceMean"
    flops_per_output = 1

    def differentiable_inputs(self, node: Node) -> tuple[int, ...]:
        return (0,)

    def backward_reads(self, node: Node) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
        return (1,), ()

    def backward(
        self, node: Node, inputs: Arrays, outputs: Arrays, grad_outputs: Arrays, wanted: Wanted = None
    ) -> Grads:
        """dY spread evenly over the elements each mean averaged (reduced axes restored first)."""
        data, dy = inputs[0], grad_outputs[0]
        grads: Grads = [None] * len(inputs)
        if data is None or dy is None or not wants(wanted, 0) or data.dtype.kind != "f":
            return grads
        given = inputs[1] if len(inputs) > 1 else None
        given_axes = None if given is None else np.asarray(given)
        axes = resolve_axes(data.ndim, given_axes, node.attrs.noop_with_empty_axes)
        if axes is None:
            grads[0] = dy
            return grads
        count = int(np.prod([data.shape[a] for a in axes], dtype=np.int64))
        kept = dy.reshape(reduced_shape(data.shape, axes, keepdims=1))
        grads[0] = np.broadcast_to(kept / count, data.shape).astype(data.dtype)
        return grads
