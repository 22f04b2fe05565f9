"""One-node models run through hetflow and ONNX Runtime side by side (shared by the op tests)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

import hetflow
from hetflow.graph import Graph, Node, dtypes
from hetflow.ops import registry
from hetflow.ops.attrs import parse_attrs
from hetflow.ops.base import Cost, TensorInfo
from tests.helpers import make_model, run_onnxruntime


def node_model(
    op_type: str,
    inputs: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    initializers: Mapping[str, np.ndarray] | None = None,
    shapes: Mapping[str, Sequence[int | str]] | None = None,
    opset: int = 21,
    **attrs: Any,
) -> onnx.ModelProto:
    """A model with one ``op_type`` node reading ``inputs`` ("" = omitted) and writing ``y``.

    Graph inputs are the ``feeds`` (their shapes, unless ``shapes`` names symbolic ones);
    ``initializers`` become constant inputs.
    """
    shapes = shapes or {}
    node = helper.make_node(op_type, list(inputs), ["y"], name=op_type.lower(), **attrs)
    graph_inputs = [
        (name, dtypes.to_onnx(array.dtype), list(shapes.get(name, array.shape)))
        for name, array in feeds.items()
    ]
    first = next(iter(feeds.values()))
    model = make_model(
        [node], graph_inputs, [("y", dtypes.to_onnx(first.dtype), None)], dict(initializers or {}), opset
    )
    # NOTE: ONNX Runtime rejects IR versions newer than it knows; the opset's own minimum always works.
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    return model


def run_hetflow(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    """The single output of ``model`` computed by hetflow."""
    (result,) = hetflow.InferenceSession(model).run(None, dict(feeds))
    return result


def assert_matches_onnxruntime(
    op_type: str,
    inputs: Sequence[str],
    feeds: Mapping[str, np.ndarray],
    initializers: Mapping[str, np.ndarray] | None = None,
    opset: int = 21,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    **attrs: Any,
) -> np.ndarray:
    """Run a one-node model in hetflow and ONNX Runtime and assert equal dtype, shape and values."""
    model = node_model(op_type, inputs, feeds, initializers, opset=opset, **attrs)
    actual = run_hetflow(model, feeds)
    (expected,) = run_onnxruntime(model, dict(feeds))
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != onnxruntime's {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != onnxruntime's {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    return actual


def inferred_shape(model: onnx.ModelProto, name: str = "y") -> tuple:
    """The shape hetflow infers for value ``name`` (symbols kept)."""
    graph: Graph = hetflow.load_model(model)
    return tuple(graph.values[name].shape)


def node_cost(
    op_type: str,
    shapes: Sequence[Sequence[int] | None],
    dtype: type = np.float32,
    consts: Sequence[np.ndarray | None] | None = None,
    **attrs: Any,
) -> Cost:
    """``OpDef.cost`` of one node whose inputs have ``shapes`` (None = omitted) and ``dtype``.

    Constant inputs in ``consts`` (e.g. ReduceMean's axes) take their own shape and dtype.
    """
    opdef = registry.get(op_type)
    consts = list(consts) if consts is not None else [None] * len(shapes)
    node = Node(
        op_type, "node", [f"in{i}" if s is not None else "" for i, s in enumerate(shapes)], ["y"],
        parse_attrs(opdef.Attrs, attrs, op_type=op_type, node_name="node"),
    )
    infos = [
        None if s is None
        else TensorInfo(c.shape, c.dtype) if c is not None
        else TensorInfo(tuple(s), np.dtype(dtype))
        for s, c in zip(shapes, consts)
    ]
    outputs = opdef.infer(node, infos, consts)
    return opdef.cost(node, infos, outputs)
