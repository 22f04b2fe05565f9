"""Graph -> ONNX ModelProto: how the trainer hands its result to the rest of the world.

The Graph holds every node in its canonical (newest-opset) form, so the model is written at one opset
(``EXPORT_OPSET``, or the graph's own when newer) where those forms are valid: inputs that older opsets
took as attributes stay inputs. Attributes are written from each node's typed attrs object, leaving out
the ones equal to the schema's default (so attributes newer than the export opset, which always have
defaults, never appear); hetflow-internal fields (fused activations, the pre-13 Softmax flattening)
cannot be expressed and are refused.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hetflow.errors import InvalidModelError
from hetflow.graph import Graph, Node, Value, dtypes

#: The opset exported models declare (ReduceMean's ``axes`` input and Split's ``num_outputs`` need 18).
EXPORT_OPSET = 18
#: ONNX IR version of exported models (what ONNX Runtime 1.16+ reads).
EXPORT_IR_VERSION = 8
#: Attrs fields hetflow adds to nodes that ONNX has no attribute for: (field, value that is expressible).
_INTERNAL_FIELDS = {"fused": None, "coerce_2d": 0, "shuffle_groups": 0, "residual": False}
#: Attrs fields that only steer how hetflow computes a node (not what): left out whatever their value.
_RUNTIME_FIELDS = {"packed_weights"}


def export_model(graph: Graph, *, producer: str = "hetflow", doc: str = "") -> onnx.ModelProto:
    """The ONNX model of ``graph``: its nodes, initializers, inputs and outputs (symbolic dims kept).

    Raises:
        InvalidModelError: a node carries something ONNX cannot express (a fused activation: export the
            unoptimised graph; an old-opset Softmax flattening).
    """
    nodes = [_node_proto(node) for node in graph.nodes]
    initializers = [
        numpy_helper.from_array(np.asarray(array), name) for name, array in graph.initializers.items()
    ]
    inputs = [_value_info(graph.values[name]) for name in graph.inputs if name not in graph.initializers]
    outputs = [_value_info(graph.values[name]) for name in graph.outputs]
    proto = helper.make_graph(nodes, graph.name or "graph", inputs, outputs, initializers, doc_string=doc)
    opset = max(EXPORT_OPSET, graph.opset)
    model = helper.make_model(
        proto,
        producer_name=producer,
        opset_imports=[helper.make_opsetid("", opset)],
        ir_version=EXPORT_IR_VERSION,
    )
    if graph.metadata:
        helper.set_model_props(model, dict(graph.metadata))
    return model


def save_model(graph: Graph, path: str | os.PathLike, **options: Any) -> None:
    """Write ``export_model(graph)`` to ``path`` after ONNX's checker has accepted it."""
    model = export_model(graph, **options)
    onnx.checker.check_model(model)
    onnx.save(model, os.fspath(path))


def _value_info(value: Value) -> onnx.ValueInfoProto:
    shape = None if value.shape is None else list(value.shape)
    return helper.make_tensor_value_info(value.name, dtypes.to_onnx(value.dtype), shape)


def _node_proto(node: Node) -> onnx.NodeProto:
    inputs = list(node.inputs)
    while inputs and not inputs[-1]:
        inputs.pop()
    outputs = list(node.outputs)
    while outputs and not outputs[-1]:
        outputs.pop()
    attributes = _attributes(node)
    return helper.make_node(node.op_type, inputs, outputs, name=node.name, domain=node.domain, **attributes)


def _attributes(node: Node) -> dict[str, Any]:
    attrs = node.attrs
    if attrs is None or not dataclasses.is_dataclass(attrs):
        return {}
    written: dict[str, Any] = {}
    for spec in dataclasses.fields(attrs):
        value = getattr(attrs, spec.name)
        if spec.name in _RUNTIME_FIELDS:
            continue
        if spec.name in _INTERNAL_FIELDS:
            if value != _INTERNAL_FIELDS[spec.name]:
                raise InvalidModelError(
                    f"node '{node.name}' ({node.op_type}) has {spec.name}={value!r}, which ONNX cannot "
                    "express; export the graph before optimisation passes"
                )
            continue
        required = spec.metadata.get("hetflow_required", False)
        if value is None or (not required and _equal(value, _default(spec))):
            continue
        written[spec.name] = _onnx_value(value, str(spec.type))
    return written


def _default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def _equal(value: Any, default: Any) -> bool:
    if isinstance(value, np.ndarray) or isinstance(default, np.ndarray):
        return False
    return bool(value == default)


def _onnx_value(value: Any, annotation: str) -> Any:
    """A Python value in the form ``helper.make_attribute`` types correctly (floats stay floats)."""
    if isinstance(value, np.ndarray):
        return numpy_helper.from_array(value)
    if isinstance(value, tuple):
        return [_onnx_value(v, annotation) for v in value]
    if isinstance(value, bool):
        return int(value)
    if "float" in annotation and isinstance(value, (int, float)):
        return float(value)
    return value
