"""Fuse an activation into the epilogue of the node that produces its input.

An activation is fusable when its op has the ``"fusable"`` trait and its parameters fit a
``FusedActivation`` (``_PARAMETERS`` below says how; PRelu's slope tensor does not, and a Clip bound
that is not a constant cannot). A producer can take it when its attrs have a ``fused`` field (Conv,
Gemm, inference BatchNormalization) that is still empty, its output is float, and the activation is its
only reader. The producer then writes the activation's output name and the activation node goes.

An activation that commutes with a maximum reaches through a MaxPool to the node before it: for a
non-decreasing f, f(max(window)) = max(f(window)) bit for bit, so ``Conv -> MaxPool -> Relu`` (Caffe's
cifar10-quick) becomes ``Conv+Relu -> MaxPool``, the Relu applied free in the Conv's epilogue instead
of as a step of its own (~6 us of cifar10-quick's ~190 at batch 1). Relu, Clip and LeakyRelu with a
slope >= 0 commute (piecewise linear, so non-decreasing in floating point too); Sigmoid and Tanh are
left where they are (their rounding need not be monotone, and on the larger input they cost more).
A MaxPool with an Indices output keeps its activation: ties after a Relu would change the indices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, is_dataclass

import numpy as np

from hetflow.graph import Graph, Node
from hetflow.ops import registry
from hetflow.ops.activation import FusedActivation
from hetflow.ops.attrs import replace
from hetflow.ops.pool import has_indices
from hetflow.passes.rewrite import Rewriter


def fuse_activation(graph: Graph) -> Graph:
    """Fold fusable activations into their producers' ``fused`` attribute (in place; returns graph)."""
    rewriter = Rewriter(graph)
    for node in list(graph.nodes):
        fused = fused_activation(rewriter, node)
        if fused is None or not node.inputs:
            continue
        source = node.inputs[0]
        if not rewriter.only_reader_is(source, node):
            continue
        producer = rewriter.producers.get(source)
        if producer is not None and _accepts_activation(rewriter, producer, source):
            producer.attrs = replace(producer.attrs, fused=fused)
            rewriter.take_over_output(producer, source, node)
            continue
        before_pool = _before_max_pool(rewriter, producer, fused)
        if before_pool is not None:
            before_pool.attrs = replace(before_pool.attrs, fused=fused)
            rewriter.take_over_output(producer, source, node)  # the MaxPool now writes the activation's output
    return rewriter.finish()


def _before_max_pool(rewriter: Rewriter, pool: Node | None, fused: FusedActivation) -> Node | None:
    """The node that can take ``fused`` in ``pool``'s place, when ``pool`` is a MaxPool (no Indices) that
    alone reads its input, and ``fused`` commutes with a maximum; else None."""
    if pool is None or pool.op_type != "MaxPool" or has_indices(pool) or not _commutes_with_max(fused):
        return None
    source = pool.inputs[0]
    producer = rewriter.producers.get(source)
    if producer is None or not rewriter.only_reader_is(source, pool):
        return None
    return producer if _accepts_activation(rewriter, producer, source) else None


def _commutes_with_max(fused: FusedActivation) -> bool:
    """Whether the activation is non-decreasing in floating point (so it may move before a MaxPool)."""
    if fused.op_type == "LeakyRelu":
        return fused.alpha >= 0
    return fused.op_type in ("Relu", "Clip")


def fused_activation(rewriter: Rewriter, node: Node) -> FusedActivation | None:
    """``node`` as a FusedActivation, or None when it is not a fusable activation."""
    opdef = registry.lookup(node.op_type, node.domain)
    parameters = _PARAMETERS.get(node.op_type)
    if opdef is None or "fusable" not in opdef.traits or parameters is None:
        return None
    return parameters(rewriter, node)


def _accepts_activation(rewriter: Rewriter, producer: Node, output: str) -> bool:
    attrs = producer.attrs
    if not is_dataclass(attrs) or "fused" not in {f.name for f in fields(attrs)}:
        return False
    if attrs.fused is not None or producer.outputs[:1] != [output]:
        return False
    if getattr(attrs, "training_mode", 0):  # a training-form BatchNormalization's Y feeds its backward
        return False
    value = rewriter.graph.values.get(output)
    return value is not None and value.dtype.kind == "f"


# -- the parameters of each activation -------------------------------------------------------------
def _plain(rewriter: Rewriter, node: Node) -> FusedActivation:
    return FusedActivation(node.op_type)


def _leaky_relu(rewriter: Rewriter, node: Node) -> FusedActivation:
    return FusedActivation("LeakyRelu", alpha=float(node.attrs.alpha))


def _clip(rewriter: Rewriter, node: Node) -> FusedActivation | None:
    bounds: list[float] = []
    for index, default in ((1, -math.inf), (2, math.inf)):
        name = node.inputs[index] if len(node.inputs) > index else ""
        if not name:
            bounds.append(default)
            continue
        constant = rewriter.constant(name)
        if constant is None or constant.size != 1:
            return None
        bounds.append(float(np.asarray(constant).reshape(-1)[0]))
    return FusedActivation("Clip", alpha=bounds[0], beta=bounds[1])


#: How each fusable activation's parameters become a FusedActivation (None: it cannot be fused).
_PARAMETERS: dict[str, Callable[[Rewriter, Node], FusedActivation | None]] = {
    "Relu": _plain,
    "Sigmoid": _plain,
    "Tanh": _plain,
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
}
