"""Fold a residual Add (or two-input Sum) into the Conv that produces one of its inputs.

ResNet's and ShuffleNet's blocks end in ``Relu(Add(Conv(...), shortcut))``: the Conv's epilogue passes
over its output once (bias), and the Add again (read both, write one). Folded, the Conv takes the
shortcut as a fourth input (``ConvAttrs.residual``) and adds it in the same pass as its bias, with the
Add's fused activation after it. Kernels that cannot add a residual decline the node (OpenCL's), so
placement keeps it on the CPU.

The fold applies when the Add's two inputs and its output have one shape and dtype (no broadcasting),
one input is produced by a Conv that the Add alone reads and that has no fused activation or residual
yet. The Conv moves to the Add's place in the node order, where the shortcut has been computed.
"""

from __future__ import annotations

from hetflow.graph import Graph, Node
from hetflow.ops.attrs import replace
from hetflow.passes.rewrite import Rewriter

#: The ops folded: each with exactly two inputs.
RESIDUAL_OPS = ("Add", "Sum")


def fuse_residual(graph: Graph) -> Graph:
    """Fold every residual Add/Sum that qualifies into its Conv (in place; returns graph)."""
    rewriter = Rewriter(graph)
    order = list(graph.nodes)
    moved: dict[int, Node] = {}  # id of a removed Add -> the Conv that takes its place
    for node in order:
        conv = _folding_conv(rewriter, node)
        if conv is None:
            continue
        output = conv.outputs[0]
        shortcut = node.inputs[1] if node.inputs[0] == output else node.inputs[0]
        while len(conv.inputs) < 3:
            conv.inputs.append("")
        conv.inputs.append(shortcut)
        rewriter.readers.setdefault(shortcut, []).append(conv)
        conv.attrs = replace(conv.attrs, fused=node.attrs.fused, residual=True)
        rewriter.take_over_output(conv, output, node)
        moved[id(node)] = conv
    if moved:
        convs = {id(conv) for conv in moved.values()}
        graph.nodes = [moved.get(id(n), n) for n in order if id(n) not in convs]
    return rewriter.finish()


def _folding_conv(rewriter: Rewriter, node: Node) -> Node | None:
    """The Conv ``node`` (a residual Add/Sum) folds into, or None. Of two candidates, the later one (the
    other input is then already computed where the Conv ran)."""
    if node.op_type not in RESIDUAL_OPS or len(node.inputs) != 2 or node.inputs[0] == node.inputs[1]:
        return None
    values = rewriter.graph.values
    infos = [values.get(name) for name in (*node.inputs, node.outputs[0])]
    if any(info is None for info in infos):
        return None
    if len({(tuple(info.shape), info.dtype) for info in infos}) != 1:  # type: ignore[union-attr]
        return None
    candidates = [
        producer for name in node.inputs
        if (producer := rewriter.producers.get(name)) is not None and _takes_residual(rewriter, producer, name, node)
    ]  # fmt: skip
    if not candidates:
        return None
    position = {id(n): index for index, n in enumerate(rewriter.graph.nodes)}
    return max(candidates, key=lambda conv: position.get(id(conv), -1))


def _takes_residual(rewriter: Rewriter, producer: Node, output: str, reader: Node) -> bool:
    """Whether ``producer`` is a Conv writing ``output`` for ``reader`` alone, with its epilogue free."""
    if producer.op_type != "Conv" or producer.outputs[:1] != [output]:
        return False
    attrs = producer.attrs
    return attrs.fused is None and not attrs.residual and rewriter.only_reader_is(output, reader)
