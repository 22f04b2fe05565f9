"""Fold a channel shuffle into the depthwise Conv that reads it.

ShuffleNet mixes its channel groups with ``Reshape [N, G, C/G, H, W] -> Transpose (0, 2, 1, 3, 4) ->
Reshape [N, C, H, W]``: a copy of the whole tensor and two more steps, before a depthwise Conv that
reads each channel once anyway. That Conv can read X's channels in the shuffled order itself
(``ConvAttrs.shuffle_groups``): the three nodes go, and nothing is copied. A depthwise Conv's kernels
(hetflow's CPU device) support it; kernels that do not decline the node, so placement keeps it where
it can run.

The fold applies when each intermediate value has the next node as its only reader, the shapes say a
shuffle of X's channels (known ranks; N, H and W carried through; G * C/G = C), and the Conv is
depthwise (one group per input channel, no shuffle folded yet).
"""

from __future__ import annotations

from hetflow.graph import Graph, Node
from hetflow.ops.attrs import replace
from hetflow.passes.rewrite import Rewriter

#: The Transpose between the two Reshapes: swaps the group axis and the channel-in-group axis.
SHUFFLE_PERM = (0, 2, 1, 3, 4)


def fold_channel_shuffle(graph: Graph) -> Graph:
    """Fold every channel shuffle a depthwise Conv alone reads into that Conv (in place; returns graph)."""
    rewriter = Rewriter(graph)
    for node in list(graph.nodes):
        if node.op_type != "Conv" or node.attrs.shuffle_groups or not node.inputs:
            continue
        chain = _shuffle_chain(rewriter, node)
        if chain is None:
            continue
        first, transpose, last, groups = chain
        source = first.inputs[0]
        for step in (last, transpose, first):
            rewriter.remove(step)
            graph.values.pop(step.outputs[0], None)
        node.inputs[0] = source
        rewriter.readers.setdefault(source, []).append(node)
        node.attrs = replace(node.attrs, shuffle_groups=groups)
    return rewriter.finish()


def _shuffle_chain(rewriter: Rewriter, conv: Node) -> tuple[Node, Node, Node, int] | None:
    """(first Reshape, Transpose, last Reshape, groups) of the shuffle ``conv`` alone reads, or None."""
    values = rewriter.graph.values
    last = _sole_producer(rewriter, conv.inputs[0], conv, "Reshape")
    transpose = last and _sole_producer(rewriter, last.inputs[0], last, "Transpose")
    first = transpose and _sole_producer(rewriter, transpose.inputs[0], transpose, "Reshape")
    if first is None or transpose is None or last is None:
        return None
    if tuple(transpose.attrs.perm or ()) != SHUFFLE_PERM:
        return None
    shapes = [values[name].shape if name in values else None for name in
              (first.inputs[0], first.outputs[0], last.outputs[0], conv.inputs[1])]  # fmt: skip
    x, split, shuffled, weights = shapes
    if x is None or split is None or shuffled is None or weights is None:
        return None
    if len(x) != 4 or len(split) != 5 or tuple(shuffled) != tuple(x) or len(weights) != 4:
        return None
    channels, groups, per_group = x[1], split[1], split[2]
    if not all(isinstance(d, int) for d in (channels, groups, per_group)) or groups * per_group != channels:
        return None
    if (split[0], split[3], split[4]) != (x[0], x[2], x[3]):
        return None
    if conv.attrs.group != channels or weights[0] != channels or weights[1] != 1:
        return None
    return first, transpose, last, int(groups)


def _sole_producer(rewriter: Rewriter, name: str, reader: Node, op_type: str) -> Node | None:
    """The ``op_type`` node producing ``name``, when ``reader`` alone reads ``name``; else None."""
    producer = rewriter.producers.get(name)
    if producer is None or producer.op_type != op_type or not rewriter.only_reader_is(name, reader):
        return None
    return producer
