"""fold_batchnorm: inference BatchNormalization and per-channel Mul/Add fold into the producing Conv, Gemm
or BatchNormalization; anything with another reader, or without a foldable producer, stays."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest

import hetflow
from hetflow.passes.fold_batchnorm import fold_batchnorm
from tests.passes.graphs import (
    FLOAT,
    batchnorm,
    batchnorm_params,
    check_pass,
    model,
    node,
    op_types,
    weights,
)

X = [("x", FLOAT, ["N", 3, 9, 7])]
Y = [("y", FLOAT, None)]


def conv_bn_model(bias: bool, epsilon: float, group: int = 1, channels: int = 5) -> tuple:
    inputs = ["x", "W", "b"] if bias else ["x", "W"]
    inits = {"W": weights(channels, 3 // group, 3, 3), **batchnorm_params("bn", channels)}
    if bias:
        inits["b"] = weights(channels)
    nodes = [
        node("Conv", inputs, ["c"], pads=[1, 0, 1, 2], strides=[2, 1], group=group),
        batchnorm("c", "y", "bn", epsilon=epsilon),
    ]
    return model(nodes, X, Y, inits), inits


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("epsilon", [1e-5, 0.25])
def test_batchnorm_folds_into_conv(bias: bool, epsilon: float):
    proto, inits = conv_bn_model(bias, epsilon)
    graph = check_pass(proto, fold_batchnorm)
    assert op_types(graph) == ["Conv"]
    conv = graph.nodes[0]
    assert conv.outputs == ["y"] and len(conv.inputs) == 3, "a bias is created when absent"
    assert "c" not in graph.values and not any(name.startswith("bn_") for name in graph.initializers)
    factor = inits["bn_scale"] / np.sqrt(inits["bn_var"].astype(np.float64) + np.float32(epsilon))
    np.testing.assert_allclose(graph.initializers[conv.inputs[1]], inits["W"] * factor[:, None, None, None],
                               rtol=1e-6)


def test_batchnorm_folds_into_a_depthwise_conv():
    proto, _ = conv_bn_model(bias=True, epsilon=1e-3, group=3, channels=3)
    assert op_types(check_pass(proto, fold_batchnorm)) == ["Conv"]


def test_batchnorm_folds_into_a_1d_conv():
    nodes = [node("Conv", ["x", "W"], ["c"], pads=[1, 1]), batchnorm("c", "y", "bn")]
    inits = {"W": weights(7, 3, 3), **batchnorm_params("bn", 7)}
    proto = model(nodes, [("x", FLOAT, ["N", 3, 11])], Y, inits)
    assert op_types(check_pass(proto, fold_batchnorm)) == ["Conv"]


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), ()])
def test_batchnorm_folds_into_gemm(trans_b: int, c_shape: tuple | None):
    b = weights(5, 6) if trans_b else weights(6, 5)
    inits = {"B": b, **batchnorm_params("bn", 5)}
    inputs = ["a", "B"]
    if c_shape is not None:
        inits["C"] = weights(*c_shape)
        inputs.append("C")
    nodes = [
        node("Gemm", inputs, ["g"], transB=trans_b, alpha=0.5, beta=1.5),
        batchnorm("g", "y", "bn", epsilon=1e-3),
    ]
    proto = model(nodes, [("a", FLOAT, ["N", 6])], Y, inits)
    graph = check_pass(proto, fold_batchnorm, batches=(1, 4))
    assert op_types(graph) == ["Gemm"]
    gemm = graph.nodes[0]
    assert gemm.outputs == ["y"] and gemm.attrs.beta == 1.0 and gemm.attrs.alpha == 0.5
    assert gemm.attrs.transB == trans_b


def test_conv_with_two_readers_is_not_folded():
    proto, inits = conv_bn_model(bias=True, epsilon=1e-5)
    nodes = [
        node("Conv", ["x", "W", "b"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
        batchnorm("c", "y", "bn"),
        node("Relu", ["c"], ["z"]),
    ]
    proto = model(nodes, X, [*Y, ("z", FLOAT, None)], inits)
    graph = check_pass(proto, fold_batchnorm)
    assert op_types(graph) == ["Conv", "BatchNormalization", "Relu"]


def test_conv_whose_output_is_also_a_graph_output_is_not_folded():
    _, inits = conv_bn_model(bias=False, epsilon=1e-5)
    nodes = [node("Conv", ["x", "W"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]), batchnorm("c", "y", "bn")]
    graph = check_pass(model(nodes, X, [("c", FLOAT, None), *Y], inits), fold_batchnorm)
    assert op_types(graph) == ["Conv", "BatchNormalization"]


def test_batchnorm_without_a_foldable_producer_stays():
    nodes = [
        batchnorm("x", "b1", "bn1", epsilon=1e-3),
        node("MaxPool", ["b1"], ["p"], kernel_shape=[2, 2]),
        batchnorm("p", "y", "bn2"),
    ]
    inits = {**batchnorm_params("bn1", 3), **batchnorm_params("bn2", 3)}
    graph = check_pass(model(nodes, X, Y, inits), fold_batchnorm)
    assert op_types(graph) == ["BatchNormalization", "MaxPool", "BatchNormalization"]


def test_training_mode_batchnorm_is_not_folded():
    _, inits = conv_bn_model(bias=True, epsilon=1e-5)
    nodes = [
        node("Conv", ["x", "W", "b"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
        batchnorm("c", "y", "bn", training_mode=1),
    ]
    graph = fold_batchnorm(hetflow.load_model(model(nodes, X, Y, inits)).copy())
    assert op_types(graph) == ["Conv", "BatchNormalization"]


def scale_shift_nodes(source: str, channels: int) -> tuple[list, dict[str, np.ndarray]]:
    """Per-channel Mul then Add, with the constants in Unsqueeze'd ``[C, 1, 1]`` form (Caffe2 exports)."""
    nodes = [node("Mul", [source, "s"], ["m"]), node("Add", ["m", "t"], ["y"])]
    return nodes, {"s": weights(channels, 1, 1), "t": weights(channels, 1, 1)}


def test_batchnorm_then_scale_and_shift_fold_into_conv():
    _, inits = conv_bn_model(bias=False, epsilon=1e-5)
    tail, constants = scale_shift_nodes("b", 5)
    nodes = [
        node("Conv", ["x", "W"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
        batchnorm("c", "b", "bn"),
        *tail,
    ]
    graph = check_pass(model(nodes, X, Y, {**inits, **constants}), fold_batchnorm)
    assert op_types(graph) == ["Conv"] and graph.nodes[0].outputs == ["y"]


def test_scale_and_shift_after_an_unfoldable_batchnorm_fold_into_it():
    # DenseNet-121's pre-activation blocks: BatchNormalization of a Concat, then Mul and Add.
    tail, constants = scale_shift_nodes("b", 6)
    nodes = [node("Concat", ["x", "x"], ["cat"], axis=1), batchnorm("cat", "b", "bn"), *tail]
    graph = check_pass(model(nodes, X, Y, {**batchnorm_params("bn", 6), **constants}), fold_batchnorm)
    assert op_types(graph) == ["Concat", "BatchNormalization"]
    assert graph.nodes[1].outputs == ["y"]


@pytest.mark.parametrize("op_type", ["Mul", "Add", "Sub", "Div"])
@pytest.mark.parametrize("shape", [(5, 1, 1), (1, 5, 1, 1), (1,), ()])
def test_per_channel_arithmetic_folds_into_conv(op_type: str, shape: tuple):
    constant = weights(*shape) + np.float32(3.0)  # away from 0 for Div
    nodes = [
        node("Conv", ["x", "W"], ["c"], pads=[1, 0, 1, 2], strides=[2, 1]),
        node(op_type, ["c", "k"], ["y"]),
    ]
    proto = model(nodes, X, Y, {"W": weights(5, 3, 3, 3), "k": constant})
    graph = check_pass(proto, fold_batchnorm)
    assert op_types(graph) == ["Conv"]
    has_bias = len(graph.nodes[0].inputs) > 2 and graph.nodes[0].inputs[2]
    assert bool(has_bias) == (op_type in ("Add", "Sub")), "a pure scale needs no bias"


def test_constant_first_operand_of_a_commutative_op_folds():
    nodes = [
        node("Conv", ["x", "W", "b"], ["c"]),
        node("Mul", ["k", "c"], ["m"]),
        node("Add", ["t", "m"], ["y"]),
    ]
    inits = {"W": weights(5, 3, 1, 1), "b": weights(5), "k": weights(5, 1, 1), "t": weights(1, 5, 1, 1)}
    assert op_types(check_pass(model(nodes, X, Y, inits), fold_batchnorm)) == ["Conv"]


@pytest.mark.parametrize("shape", [(1, 1, 9, 7), (7,), (1, 1, 5, 1, 1)])
def test_constant_varying_along_other_axes_is_not_folded(shape: tuple):
    nodes = [node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]), node("Mul", ["c", "k"], ["y"])]
    proto = model(nodes, X, Y, {"W": weights(5, 3, 3, 3), "k": weights(*shape)})
    graph = check_pass(proto, fold_batchnorm)
    assert op_types(graph) == ["Conv", "Mul"]


def test_subtracting_the_feature_map_from_a_constant_is_not_folded():
    nodes = [node("Conv", ["x", "W"], ["c"]), node("Sub", ["k", "c"], ["y"])]
    proto = model(nodes, X, Y, {"W": weights(5, 3, 1, 1), "k": weights(5, 1, 1)})
    assert op_types(check_pass(proto, fold_batchnorm)) == ["Conv", "Sub"]


def test_shared_weights_are_copied_not_overwritten():
    # Two Convs read one weight tensor; each folds its own BatchNormalization into its own copy.
    nodes = [
        node("Conv", ["x", "W"], ["c1"]),
        batchnorm("c1", "y1", "bn1"),
        node("Conv", ["x", "W"], ["c2"]),
        batchnorm("c2", "y2", "bn2"),
    ]
    inits = {"W": weights(5, 3, 1, 1), **batchnorm_params("bn1", 5), **batchnorm_params("bn2", 5)}
    proto = model(nodes, X, [("y1", FLOAT, None), ("y2", FLOAT, None)], inits)
    graph = check_pass(proto, fold_batchnorm)
    assert op_types(graph) == ["Conv", "Conv"]
    assert graph.nodes[0].inputs[1] != graph.nodes[1].inputs[1]


def test_session_folds_and_keeps_the_loaded_graph():
    proto, _ = conv_bn_model(bias=True, epsilon=1e-5)
    session = hetflow.InferenceSession(proto)
    assert op_types(session.graph) == ["Conv"]
    assert op_types(session.source_graph) == ["Conv", "BatchNormalization"]
    assert [o.name for o in session.get_outputs()] == ["y"]


def test_session_from_a_file_holds_only_the_folded_weights(tmp_path):
    # A session made from a file keeps the folded weights, not the loaded ones beside them, and reads the
    # file again when the loaded graph is asked for.
    proto, _ = conv_bn_model(bias=False, epsilon=1e-5, channels=8192)
    path = tmp_path / "conv_bn.onnx"
    onnx.save(proto, path)
    raw_bytes = 8192 * 3 * 3 * 3 * 4
    tracemalloc.start()
    try:
        session = hetflow.InferenceSession(path)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raw_bytes <= held < 1.5 * raw_bytes
    assert op_types(session.source_graph) == ["Conv", "BatchNormalization"]
    np.testing.assert_array_equal(session.source_graph.initializers["W"], onnx.numpy_helper.to_array(proto.graph.initializer[0]))
