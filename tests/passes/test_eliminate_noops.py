"""eliminate_noops: Identity and inference-time Dropout go; output names, Dropout masks and training-mode
Dropouts keep their meaning."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import hetflow
from hetflow.frontends.onnx_import import import_onnx
from hetflow.passes import infer_shapes
from hetflow.passes.eliminate_noops import eliminate_noops
from tests.passes.graphs import FLOAT, check_pass, model, node, op_types

X = [("x", FLOAT, ["N", 3, 5])]


def test_identity_between_two_nodes_is_removed():
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["i"]), node("Sigmoid", ["i"], ["y"])]
    graph = check_pass(model(nodes, X, [("y", FLOAT, None)]), eliminate_noops)
    assert op_types(graph) == ["Relu", "Sigmoid"]
    assert graph.nodes[1].inputs == ["r"] and "i" not in graph.values


def test_identity_writing_a_graph_output_renames_the_producer_output():
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"]), node("Tanh", ["r"], ["z"])]
    proto = model(nodes, X, [("y", FLOAT, None), ("z", FLOAT, None)])
    graph = check_pass(proto, eliminate_noops)
    assert op_types(graph) == ["Relu", "Tanh"]
    assert graph.nodes[0].outputs == ["y"] and graph.nodes[1].inputs == ["y"]
    assert "r" not in graph.values and graph.values["y"].shape == ("N", 3, 5)


def test_chained_identities_to_an_output_all_go():
    nodes = [
        node("Relu", ["x"], ["r"]),
        node("Identity", ["r"], ["i1"]),
        node("Identity", ["i1"], ["y"]),
    ]
    graph = check_pass(model(nodes, X, [("y", FLOAT, None)]), eliminate_noops)
    assert op_types(graph) == ["Relu"] and graph.nodes[0].outputs == ["y"]


def test_identity_of_a_graph_input_to_a_graph_output_stays():
    nodes = [node("Identity", ["x"], ["y"])]
    graph = check_pass(model(nodes, X, [("y", FLOAT, None)]), eliminate_noops)
    assert op_types(graph) == ["Identity"]


def test_identity_between_two_graph_outputs_stays():
    nodes = [node("Relu", ["x"], ["r"]), node("Identity", ["r"], ["y"])]
    proto = model(nodes, X, [("r", FLOAT, None), ("y", FLOAT, None)])
    graph = check_pass(proto, eliminate_noops)
    assert op_types(graph) == ["Relu", "Identity"]


def test_identity_of_a_constant_to_a_graph_output_stays():
    # Built without constant folding, which would otherwise turn the Identity into an initializer.
    proto = model(
        [node("Identity", ["c"], ["y"]), node("Relu", ["x"], ["z"])],
        X,
        [("y", FLOAT, None), ("z", FLOAT, None)],
        {"c": np.arange(4, dtype=np.float32)},
    )
    graph = eliminate_noops(infer_shapes(import_onnx(proto)))
    graph.validate()
    assert op_types(graph) == ["Identity", "Relu"]
    assert graph.initializers["c"].tolist() == [0, 1, 2, 3]


def test_inference_dropout_is_removed_at_every_opset_form():
    ratio = {"ratio": np.array(0.3, np.float32)}
    for nodes, inits, opset in (
        ([node("Dropout", ["x"], ["d"])], {}, 17),
        ([node("Dropout", ["x", "ratio"], ["d"])], ratio, 17),
        ([node("Dropout", ["x", "ratio", "mode"], ["d"])], {**ratio, "mode": np.array(False)}, 17),
        ([node("Dropout", ["x"], ["d"], ratio=0.3)], {}, 10),
    ):
        proto = model([*nodes, node("Relu", ["d"], ["y"])], X, [("y", FLOAT, None)], inits, opset=opset)
        graph = check_pass(proto, eliminate_noops)
        assert op_types(graph) == ["Relu"] and graph.nodes[0].inputs == ["x"]
        assert not graph.initializers, "the ratio and mode constants are unused afterwards"


def test_training_mode_dropout_stays():
    proto = model(
        [node("Dropout", ["x", "ratio", "mode"], ["y"], seed=3)],
        X,
        [("y", FLOAT, None)],
        {"ratio": np.array(0.5, np.float32), "mode": np.array(True)},
    )
    graph = eliminate_noops(hetflow.load_model(proto).copy())
    assert op_types(graph) == ["Dropout"]


def test_dropout_whose_mode_is_a_feed_stays():
    proto = model(
        [node("Dropout", ["x", "", "mode"], ["y"])],
        [*X, ("mode", TensorProto.BOOL, [])],
        [("y", FLOAT, None)],
    )
    graph = eliminate_noops(hetflow.load_model(proto).copy())
    assert op_types(graph) == ["Dropout"]


def test_read_mask_of_static_shape_becomes_an_all_true_constant():
    nodes = [
        node("Dropout", ["x"], ["d", "mask"]),
        node("Cast", ["mask"], ["maskf"], to=FLOAT),
        node("Mul", ["d", "maskf"], ["y"]),
    ]
    proto = model(nodes, [("x", FLOAT, [2, 3, 5])], [("y", FLOAT, None)])
    graph = eliminate_noops(hetflow.load_model(proto).copy())
    graph.validate()
    assert op_types(graph) == ["Cast", "Mul"]
    mask = graph.initializers["mask"]
    assert mask.dtype == np.bool_ and mask.shape == (2, 3, 5) and mask.all()
    check_pass(proto, eliminate_noops, batches=(2,))


def test_read_mask_of_symbolic_shape_keeps_the_dropout():
    nodes = [
        node("Dropout", ["x"], ["d", "mask"]),
        node("Cast", ["mask"], ["maskf"], to=FLOAT),
        node("Mul", ["d", "maskf"], ["y"]),
    ]
    graph = check_pass(model(nodes, X, [("y", FLOAT, None)]), eliminate_noops)
    assert op_types(graph) == ["Dropout", "Cast", "Mul"]


def test_mask_that_is_a_graph_output_keeps_the_dropout():
    nodes = [node("Relu", ["x"], ["r"]), node("Dropout", ["r"], ["y", "mask"])]
    proto = model(nodes, [("x", FLOAT, [2, 3])], [("y", FLOAT, None), ("mask", TensorProto.BOOL, None)])
    graph = check_pass(proto, eliminate_noops, batches=(2,))
    assert op_types(graph) == ["Relu", "Dropout"]


def test_unread_mask_goes_with_its_dropout_and_the_output_name_stays():
    nodes = [node("Relu", ["x"], ["r"]), node("Dropout", ["r"], ["y", "mask"])]
    graph = check_pass(model(nodes, X, [("y", FLOAT, None)]), eliminate_noops)
    assert op_types(graph) == ["Relu"] and graph.nodes[0].outputs == ["y"]
    assert "mask" not in graph.values


def test_session_optimises_a_copy_and_keeps_output_names():
    nodes = [node("Relu", ["x"], ["r"]), node("Dropout", ["r"], ["d"]), node("Identity", ["d"], ["y"])]
    proto = model(nodes, X, [("y", FLOAT, None)])
    session = hetflow.InferenceSession(proto)
    assert op_types(session.graph) == ["Relu"]
    assert op_types(session.source_graph) == ["Relu", "Dropout", "Identity"]
    assert [o.name for o in session.get_outputs()] == ["y"]
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
