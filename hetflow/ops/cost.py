"""Whole-graph cost: each node's ``OpDef.cost`` for concrete shapes."""

from __future__ import annotations

from hetflow.graph import Graph, Node
from hetflow.graph.shapes import is_static
from hetflow.ops import registry
from hetflow.ops.base import Cost, TensorInfo


def node_costs(graph: Graph) -> list[tuple[Node, Cost]]:
    """The cost of every node; the graph's shapes must be static (see ``passes.bind_batch``).

    Raises:
        ValueError: when a shape is still symbolic.
    """
    rows = []
    for node in graph.nodes:
        inputs = [_info(graph, name) if name else None for name in node.inputs]
        outputs = [_info(graph, name) for name in node.present_outputs()]
        rows.append((node, registry.get(node.op_type, node.domain).cost(node, inputs, outputs)))
    return rows


def total_macs(graph: Graph) -> int:
    """Multiply-accumulates of one run of a graph with static shapes."""
    return sum(cost.macs for _, cost in node_costs(graph))


def _info(graph: Graph, name: str) -> TensorInfo:
    value = graph.values[name]
    if value.shape is None or not is_static(value.shape):
        raise ValueError(f"value '{name}' has symbolic shape {value.shape}; bind the batch first")
    return TensorInfo(value.shape, value.dtype)
