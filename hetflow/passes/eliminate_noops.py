"""Remove nodes that are the identity at inference: Identity, and Dropout outside training mode.

Candidates are the ops with the ``"noop"`` trait. A removed node's readers read its input instead.
When its output is a graph output, the producer of its input writes that name instead, so the
session's output names never change; the node stays where that is impossible (its input is a graph
input, a constant or another graph output). A Dropout whose ``mask`` is read keeps its meaning: the
mask becomes an all-True constant when its shape is static, else the node stays.
"""

from __future__ import annotations

import numpy as np

from hetflow.graph import Graph, Node
from hetflow.graph.shapes import is_static
from hetflow.ops import registry
from hetflow.passes.rewrite import Rewriter


def eliminate_noops(graph: Graph) -> Graph:
    """Drop inference-time identity nodes (in place; returns graph)."""
    rewriter = Rewriter(graph)
    for node in list(graph.nodes):
        if _is_inference_noop(rewriter, node):
            _eliminate(rewriter, node)
    return rewriter.finish()


def _is_inference_noop(rewriter: Rewriter, node: Node) -> bool:
    opdef = registry.lookup(node.op_type, node.domain)
    if opdef is None or "noop" not in opdef.traits:
        return False
    if node.op_type == "Dropout":
        # NOTE: Dropout's third input switches training mode on; only a constant false is a no-op.
        mode = node.inputs[2] if len(node.inputs) > 2 else ""
        if mode:
            flag = rewriter.constant(mode)
            return flag is not None and not bool(np.asarray(flag).reshape(-1)[0])
    return True


def _eliminate(rewriter: Rewriter, node: Node) -> None:
    graph = rewriter.graph
    source, target = node.inputs[0], node.outputs[0]
    extra = [name for name in node.outputs[1:] if name]
    if not all(_can_drop_mask(rewriter, name) for name in extra):
        return
    if target in graph.outputs:
        producer = rewriter.producers.get(source)
        if producer is None or source in graph.outputs:
            return  # a graph input, a constant or another output: the copy must stay
        rewriter.remove(node)
        rewriter.rename_output(producer, source, target)
    else:
        rewriter.remove(node)
        rewriter.redirect_readers(target, source)
        graph.values.pop(target, None)
    for name in extra:
        _replace_mask(rewriter, name)


def _can_drop_mask(rewriter: Rewriter, name: str) -> bool:
    """A Dropout mask can go when nothing reads it, or when it can become a constant."""
    if name in rewriter.graph.outputs:
        # NOTE: a constant graph output would hand every caller the same mutable array.
        return False
    if not rewriter.readers.get(name):
        return True
    value = rewriter.graph.values.get(name)
    return value is not None and value.shape is not None and is_static(value.shape)


def _replace_mask(rewriter: Rewriter, name: str) -> None:
    if rewriter.readers.get(name):
        shape = rewriter.graph.values[name].shape
        assert shape is not None
        # Inference-mode Dropout keeps every element.
        rewriter.add_constant(name, np.ones(tuple(int(d) for d in shape), dtype=bool))
    else:
        rewriter.graph.values.pop(name, None)
