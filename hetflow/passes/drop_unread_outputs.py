"""Omit the optional outputs nothing reads, so that kernels skip computing them.

A classifier on an LSTM usually reads only Y_h, the last hidden state, yet the LSTM still wrote Y, every
step's hidden state (13 MiB for lstm-gesture at batch 64, and a transposing copy to make it), and the
memory plan held it. ONNX omits an optional output with an empty name, and hetflow's kernels test for
that (LSTM/GRU/RNN's Y, Y_h and Y_c, MaxPool's Indices, Dropout's mask). Only outputs the op's ONNX
schema marks optional are omitted; graph outputs and outputs something reads stay.
"""

from __future__ import annotations

import functools

import onnx.defs

from hetflow.graph import Graph, Node


def drop_unread_outputs(graph: Graph) -> Graph:
    """Blank every optional node output that no node reads and the graph does not output (in place)."""
    readers = graph.consumers()
    for node in graph.nodes:
        for index, name in enumerate(node.outputs):
            if name and name not in graph.outputs and not readers.get(name) and _optional(node, index):
                node.outputs[index] = ""
                graph.values.pop(name, None)
    return graph


def _optional(node: Node, index: int) -> bool:
    return index in _optional_outputs(node.op_type, node.domain)


@functools.cache
def _optional_outputs(op_type: str, domain: str) -> frozenset[int]:
    """Indices of the outputs ONNX's newest schema of the op marks optional (none for unknown ops)."""
    try:
        schema = onnx.defs.get_schema(op_type, domain=domain or "")
    except onnx.defs.SchemaError:
        return frozenset()
    optional = onnx.defs.OpSchema.FormalParameterOption.Optional
    return frozenset(i for i, output in enumerate(schema.outputs) if output.option == optional)
