"""Static shape and dtype inference over a whole graph, asking each op's definition."""

from __future__ import annotations

from collections.abc import Mapping

from hetflow.errors import InvalidModelError
from hetflow.graph import Graph, Value
from hetflow.graph.shapes import bind, format_shape
from hetflow.ops import registry
from hetflow.ops.base import TensorInfo


def infer_shapes(graph: Graph) -> Graph:
    """Fill ``graph.values`` with the shape and dtype of every node output (in place; returns graph).

    Raises:
        InvalidModelError: naming the node whose inputs do not fit its op.
    """
    for node in graph.nodes:
        opdef = registry.get(node.op_type, node.domain)
        inputs = [_info(graph, name) if name else None for name in node.inputs]
        consts = [graph.initializers.get(name) if name else None for name in node.inputs]
        try:
            outputs = opdef.infer(node, inputs, consts)
        except (ValueError, IndexError, TypeError) as error:
            described = ", ".join(
                format_shape(i.shape) if i is not None else "-" for i in inputs
            )
            raise InvalidModelError(
                f"node '{node.name}' ({node.op_type}) with input shapes ({described}): {error}"
            ) from error
        for name, info in zip(node.outputs, outputs):
            if name:
                graph.values[name] = Value(name, tuple(info.shape), info.dtype)
    return graph


def _info(graph: Graph, name: str) -> TensorInfo:
    value = graph.values.get(name)
    if value is None or value.shape is None:
        raise InvalidModelError(f"value '{name}' has no known shape (declare the graph input's shape)")
    return TensorInfo(value.shape, value.dtype)


def bind_batch(graph: Graph, bindings: Mapping[str, int]) -> Graph:
    """A copy of ``graph`` with symbolic dimensions replaced by integers and shapes re-inferred."""
    bound = graph.copy()
    for name in bound.inputs:
        value = bound.values[name]
        if value.shape is not None:
            bound.values[name] = Value(name, bind(value.shape, bindings), value.dtype)
    return infer_shapes(bound)
