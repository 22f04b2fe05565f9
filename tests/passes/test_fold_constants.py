"""fold_constants: constant subgraphs become initializers; shape subgraphs over a symbolic batch fold into
Reshape's 0 / -1 spelling, or stay (and run) where something else needs the symbolic value."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetflow
from hetflow.frontends.onnx_import import import_onnx
from hetflow.graph import Graph
from hetflow.passes import fold_constants, infer_shapes
from hetflow.passes.fold_constants import Symbol
from tests.helpers import make_model, run_onnxruntime

RNG = np.random.default_rng(3)
FLOAT = TensorProto.FLOAT


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs) -> onnx.NodeProto:
    return helper.make_node(op_type, list(inputs), list(outputs), name=f"{op_type}_{outputs[0]}", **attrs)


def model(nodes, inputs, outputs, initializers=None) -> onnx.ModelProto:
    proto = make_model(nodes, inputs, outputs, initializers, opset=17)
    proto.ir_version = helper.find_min_ir_version_for(list(proto.opset_import))
    return proto


def folded(proto: onnx.ModelProto) -> Graph:
    return hetflow.load_model(proto)


def assert_runs_like_onnxruntime(proto: onnx.ModelProto, batches: Sequence[int], tail: Sequence[int]) -> None:
    session = hetflow.InferenceSession(proto)
    for batch in batches:
        feeds = {"x": RNG.standard_normal((batch, *tail)).astype(np.float32)}
        actual = session.run(None, feeds)
        expected = run_onnxruntime(proto, feeds)
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and a.shape == e.shape
            np.testing.assert_allclose(a, e, rtol=1e-6)


def flatten_chain(extra_outputs: Sequence[str] = ()) -> onnx.ModelProto:
    """x [N,3,8,8] -> Shape -> Gather(0) -> Unsqueeze -> Concat([., -1]) -> Reshape: PyTorch's flatten."""
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["batch"], axis=0),
        node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ]
    outputs = [("y", FLOAT, None)] + [(name, TensorProto.INT64, None) for name in extra_outputs]
    inits = {
        "zero": np.array(0, np.int64),
        "axes0": np.array([0], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    return model(nodes, [("x", FLOAT, ["N", 3, 8, 8])], outputs, inits)


def test_symbolic_flatten_chain_folds_to_reshape_with_zero_and_minus_one():
    graph = folded(flatten_chain())
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    target = graph.initializers[graph.nodes[0].inputs[1]]
    assert target.dtype == np.int64 and target.tolist() == [0, -1]
    assert graph.values["y"].shape == ("N", 192)
    assert_runs_like_onnxruntime(flatten_chain(), [1, 5], (3, 8, 8))


def test_reshape_to_minus_one_and_a_symbol_in_the_middle():
    # target = [-1] + shape[1:2] + [64]: the batch is inferred by -1, the channels copied from the shape.
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Slice", ["shape", "one", "two"], ["channels"]),
        node("Concat", ["minus1", "channels", "sixty_four"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "minus1": np.array([-1], np.int64),
        "sixty_four": np.array([64], np.int64),
    }
    proto = model(nodes, [("x", FLOAT, ["N", 3, 8, 8])], [("y", FLOAT, None)], inits)
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    assert graph.initializers[graph.nodes[0].inputs[1]].tolist() == [-1, 3, 64]
    assert graph.values["y"].shape == ("N", 3, 64)
    assert_runs_like_onnxruntime(proto, [1, 4], (3, 8, 8))


def test_constant_and_constant_of_shape_subgraph_folds_to_an_initializer():
    shape = helper.make_node(
        "Constant", [], ["shape"], value=numpy_helper.from_array(np.array([2, 3], np.int64))
    )
    nodes = [
        shape,
        node(
            "ConstantOfShape", ["shape"], ["fill"], value=numpy_helper.from_array(np.array([1.5], np.float32))
        ),
        node("Identity", ["fill"], ["fill2"]),
        node("Add", ["x", "fill2"], ["y"]),
    ]
    proto = model(nodes, [("x", FLOAT, ["N", 2, 3])], [("y", FLOAT, None)])
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Add"]
    constant = graph.initializers[graph.nodes[0].inputs[1]]
    assert constant.dtype == np.float32 and constant.shape == (2, 3) and (constant == 1.5).all()
    assert_runs_like_onnxruntime(proto, [1, 3], (2, 3))


def test_cast_of_a_static_shape_folds():
    nodes = [
        node("Shape", ["x"], ["shape"], start=1),
        node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        node("Identity", ["shape_f"], ["y"]),
    ]
    proto = model(nodes, [("x", FLOAT, ["N", 3, 5])], [("y", FLOAT, None)])
    graph = folded(proto)
    assert graph.nodes == [] and graph.initializers["y"].tolist() == [3.0, 5.0]
    assert graph.initializers["y"].dtype == np.float32
    assert_runs_like_onnxruntime(proto, [2], (3, 5))


def test_cast_of_a_symbolic_shape_to_an_integer_type_still_folds_into_reshape():
    nodes = [
        node("Shape", ["x"], ["shape"], end=1),
        node("Cast", ["shape"], ["shape32"], to=TensorProto.INT32),
        node("Cast", ["shape32"], ["shape64"], to=TensorProto.INT64),
        node("Concat", ["shape64", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ]
    proto = model(
        nodes, [("x", FLOAT, ["N", 3, 5])], [("y", FLOAT, None)], {"minus1": np.array([-1], np.int64)}
    )
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    assert graph.values["y"].shape == ("N", 15)
    assert_runs_like_onnxruntime(proto, [1, 6], (3, 5))


def test_symbolic_shape_needed_elsewhere_keeps_its_chain():
    # The same target feeds Reshape (bound to [0, -1]) and a graph output (needs the real batch).
    proto = flatten_chain(extra_outputs=["target"])
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Shape", "Gather", "Unsqueeze", "Concat", "Reshape"]
    reshape = graph.nodes[-1]
    assert graph.initializers[reshape.inputs[1]].tolist() == [0, -1]
    assert_runs_like_onnxruntime(proto, [1, 2, 5], (3, 8, 8))


def test_symbolic_shape_consumed_by_constant_of_shape_and_cast_runs_at_every_batch():
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "first"], ["batch"], axis=0),
        node(
            "ConstantOfShape", ["batch"], ["ones"], value=numpy_helper.from_array(np.array([2.0], np.float32))
        ),
        node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        node("Mul", ["ones", "batch_f"], ["y"]),
    ]
    proto = model(nodes, [("x", FLOAT, ["N", 4])], [("y", FLOAT, None)], {"first": np.array([0], np.int64)})
    graph = folded(proto)
    assert "Shape" in [n.op_type for n in graph.nodes] and "ConstantOfShape" in [
        n.op_type for n in graph.nodes
    ]
    assert_runs_like_onnxruntime(proto, [1, 3, 7], (4,))


def test_static_gather_out_of_a_symbolic_shape_becomes_an_int64_constant():
    # shape[1] * shape[2] is known although shape[0] is the batch.
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "one"], ["c"], axis=0),
        node("Gather", ["shape", "two"], ["h"], axis=0),
        node("Mul", ["c", "h"], ["ch"]),
        node("Concat", ["minus1", "ch"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = {
        "one": np.array([1], np.int64),
        "two": np.array([2], np.int64),
        "minus1": np.array([-1], np.int64),
    }
    proto = model(nodes, [("x", FLOAT, ["N", 3, 4])], [("y", FLOAT, None)], inits)
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    target = graph.initializers[graph.nodes[0].inputs[1]]
    assert target.dtype == np.int64 and target.tolist() == [-1, 12]
    assert_runs_like_onnxruntime(proto, [2, 3], (3, 4))


def test_string_constants_are_not_mistaken_for_symbols():
    words = helper.make_node(
        "Constant", [], ["words"], value=numpy_helper.from_array(np.array(["N", "b"], dtype=object))
    )
    nodes = [words, node("Identity", ["words"], ["w"]), node("Concat", ["w", "x"], ["y"], axis=0)]
    proto = model(nodes, [("x", TensorProto.STRING, [2])], [("y", TensorProto.STRING, None)])
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Concat"]
    assert graph.initializers["w"].tolist() == ["N", "b"]
    (y,) = hetflow.InferenceSession(proto).run(None, {"x": np.array(["c", "d"], dtype=object)})
    assert y.tolist() == ["N", "b", "c", "d"]


def test_shape_folds_to_symbols_and_dropout_is_never_folded():
    proto = model(
        [node("Shape", ["x"], ["shape"]), node("Dropout", ["c"], ["d"]), node("Add", ["x", "d"], ["y"])],
        [("x", FLOAT, ["N", 3])],
        [("y", FLOAT, None), ("shape", TensorProto.INT64, None)],
        {"c": np.ones(3, np.float32)},
    )
    graph = infer_shapes(import_onnx(proto))
    graph = fold_constants(graph)
    assert [n.op_type for n in graph.nodes] == ["Shape", "Dropout", "Add"]
    session = hetflow.InferenceSession(proto)
    y, shape = session.run(None, {"x": np.zeros((4, 3), np.float32)})
    assert shape.tolist() == [4, 3] and (y == 1).all()


@pytest.mark.parametrize("allowzero", [0, 1])
def test_symbol_at_another_axis_uses_minus_one_or_stays(allowzero):
    # target [3*8*8, N]: the batch moves to the last axis; only -1 can spell it.
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Gather", ["shape", "zero"], ["batch"], axis=0),
        node("Concat", ["numel", "batch"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["y"], allowzero=allowzero),
    ]
    inits = {"zero": np.array([0], np.int64), "numel": np.array([192], np.int64)}
    proto = model(nodes, [("x", FLOAT, ["N", 3, 8, 8])], [("y", FLOAT, None)], inits)
    graph = folded(proto)
    assert [n.op_type for n in graph.nodes] == ["Reshape"]
    assert graph.initializers[graph.nodes[0].inputs[1]].tolist() == [192, -1]
    assert graph.values["y"].shape == (192, "N")
    assert_runs_like_onnxruntime(proto, [1, 2], (3, 8, 8))


def test_symbol_class_is_a_string():
    assert Symbol("N") == "N" and isinstance(Symbol("N"), str)
