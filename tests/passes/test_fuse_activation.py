"""fuse_activation: Relu, LeakyRelu, Clip, Sigmoid and Tanh fuse into the producing Conv, Gemm or inference
BatchNormalization when they are its only reader; everything else stays as it was."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import hetflow
from hetflow.devices.cpu.kernels.gemm import gemm as gemm_kernel
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.gemm import GemmAttrs
from hetflow.passes.fuse_activation import fuse_activation
from tests.passes.graphs import FLOAT, batchnorm, batchnorm_params, check_pass, model, node, op_types, weights

X = [("x", FLOAT, ["N", 3, 8, 7])]
Y = [("y", FLOAT, None)]

#: (op_type, extra inputs, initializers, attributes, the FusedActivation expected)
ACTIVATIONS = [
    ("Relu", [], {}, {}, FusedActivation("Relu")),
    ("LeakyRelu", [], {}, {"alpha": 0.2}, FusedActivation("LeakyRelu", alpha=pytest.approx(0.2))),
    ("Sigmoid", [], {}, {}, FusedActivation("Sigmoid")),
    ("Tanh", [], {}, {}, FusedActivation("Tanh")),
    (
        "Clip", ["lo", "hi"], {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}, {},
        FusedActivation("Clip", 0.0, 6.0),
    ),
    ("Clip", ["lo"], {"lo": np.array(-0.5, np.float32)}, {}, FusedActivation("Clip", -0.5, np.inf)),
    ("Clip", ["", "hi"], {"hi": np.array(0.25, np.float32)}, {}, FusedActivation("Clip", -np.inf, 0.25)),
]
IDS = ["relu", "leaky", "sigmoid", "tanh", "relu6", "clip-min", "clip-max"]


def activation(spec: tuple, source: str, output: str):
    op_type, extra, _, attrs, _ = spec
    return node(op_type, [source, *extra], [output], **attrs)


@pytest.mark.parametrize("spec", ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("bias", [True, False])
def test_activation_fuses_into_conv(spec: tuple, bias: bool):
    inits = {"W": weights(5, 3, 3, 3), **spec[2]}
    inputs = ["x", "W"]
    if bias:
        inits["b"] = weights(5)
        inputs.append("b")
    nodes = [node("Conv", inputs, ["c"], pads=[1, 1, 0, 1], strides=[1, 2]), activation(spec, "c", "y")]
    graph = check_pass(model(nodes, X, Y, inits), fuse_activation)
    assert op_types(graph) == ["Conv"]
    conv = graph.nodes[0]
    assert conv.attrs.fused == spec[4] and conv.outputs == ["y"] and "c" not in graph.values
    assert not set(spec[2]) & set(graph.initializers), "the Clip bounds are no longer needed"


@pytest.mark.parametrize("spec", ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("trans_b", [0, 1])
def test_activation_fuses_into_gemm(spec: tuple, trans_b: int):
    b = weights(7, 6) if trans_b else weights(6, 7)
    nodes = [node("Gemm", ["a", "B", "C"], ["g"], transB=trans_b, alpha=1.5), activation(spec, "g", "y")]
    proto = model(nodes, [("a", FLOAT, ["N", 6])], Y, {"B": b, "C": weights(7), **spec[2]})
    graph = check_pass(proto, fuse_activation, batches=(1, 5))
    assert op_types(graph) == ["Gemm"] and graph.nodes[0].attrs.fused == spec[4]


@pytest.mark.parametrize("spec", ACTIVATIONS, ids=IDS)
def test_activation_fuses_into_a_batchnorm_no_conv_precedes(spec: tuple):
    # DenseNet's pre-activation blocks: BatchNormalization -> Relu -> Conv, nothing to fold the BN into.
    nodes = [batchnorm("x", "b", "bn"), activation(spec, "b", "y")]
    graph = check_pass(model(nodes, X, Y, {**batchnorm_params("bn", 3), **spec[2]}), fuse_activation)
    assert op_types(graph) == ["BatchNormalization"] and graph.nodes[0].attrs.fused == spec[4]


@pytest.mark.parametrize("spec", ACTIVATIONS, ids=IDS)
@pytest.mark.parametrize("op_type", ["Add", "Sum"])
def test_activation_fuses_into_the_residual_add(spec: tuple, op_type: str):
    # ResNet's block end: Relu(Add(branch, shortcut)).
    inits = {"W": weights(3, 3, 1, 1), **spec[2]}
    nodes = [node("Conv", ["x", "W"], ["c"]), node(op_type, ["c", "x"], ["s"]), activation(spec, "s", "y")]
    graph = check_pass(model(nodes, X, Y, inits), fuse_activation)
    assert op_types(graph) == ["Conv", op_type] and graph.nodes[1].attrs.fused == spec[4]


def test_training_mode_batchnorm_is_not_a_fusing_producer():
    nodes = [batchnorm("x", "b", "bn", training_mode=1), node("Relu", ["b"], ["y"])]
    graph = fuse_activation(hetflow.load_model(model(nodes, X, Y, batchnorm_params("bn", 3))))
    assert op_types(graph) == ["BatchNormalization", "Relu"] and graph.nodes[0].attrs.fused is None


def test_producer_with_two_readers_is_not_fused():
    nodes = [node("Conv", ["x", "W"], ["c"]), node("Relu", ["c"], ["y"]), node("Sigmoid", ["c"], ["z"])]
    proto = model(nodes, X, [*Y, ("z", FLOAT, None)], {"W": weights(5, 3, 1, 1)})
    graph = check_pass(proto, fuse_activation)
    assert op_types(graph) == ["Conv", "Relu", "Sigmoid"] and graph.nodes[0].attrs.fused is None


def test_producer_output_that_is_a_graph_output_is_not_fused():
    nodes = [node("Conv", ["x", "W"], ["c"]), node("Relu", ["c"], ["y"])]
    proto = model(nodes, X, [("c", FLOAT, None), *Y], {"W": weights(5, 3, 1, 1)})
    assert op_types(check_pass(proto, fuse_activation)) == ["Conv", "Relu"]


def test_second_activation_is_not_fused_into_an_already_fused_producer():
    nodes = [node("Conv", ["x", "W"], ["c"]), node("Relu", ["c"], ["r"]), node("Sigmoid", ["r"], ["y"])]
    graph = check_pass(model(nodes, X, Y, {"W": weights(5, 3, 1, 1)}), fuse_activation)
    assert op_types(graph) == ["Conv", "Sigmoid"]
    assert graph.nodes[0].attrs.fused == FusedActivation("Relu") and graph.nodes[0].outputs == ["r"]


def test_prelu_and_non_constant_clip_bounds_are_not_fused():
    nodes = [
        node("Conv", ["x", "W"], ["c1"]),
        node("PRelu", ["c1", "slope"], ["y"]),
        node("Conv", ["x", "W"], ["c2"]),
        node("Clip", ["c2", "lo"], ["z"]),
    ]
    proto = model(
        nodes,
        [*X, ("lo", FLOAT, [])],
        [*Y, ("z", FLOAT, None)],
        {"W": weights(5, 3, 1, 1), "slope": weights(5, 1, 1)},
    )
    graph = check_pass(proto, fuse_activation)
    assert op_types(graph) == ["Conv", "PRelu", "Conv", "Clip"]


def test_activation_after_another_op_is_not_fused():
    nodes = [node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]), node("Relu", ["p"], ["y"])]
    assert op_types(check_pass(model(nodes, X, Y), fuse_activation)) == ["MaxPool", "Relu"]


#: Activations that commute with a maximum (indices into ACTIVATIONS) and those that do not.
COMMUTING = [0, 1, 4, 5, 6]
NOT_COMMUTING = [2, 3]
POOL = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 1]}


@pytest.mark.parametrize("index", COMMUTING, ids=[IDS[i] for i in COMMUTING])
def test_activation_after_max_pool_moves_into_the_conv_before_it(index: int):
    spec = ACTIVATIONS[index]
    nodes = [node("Conv", ["x", "W", "b"], ["c"], pads=[1, 1, 1, 1]), node("MaxPool", ["c"], ["p"], **POOL),
             activation(spec, "p", "y")]  # fmt: skip
    graph = check_pass(model(nodes, X, Y, {"W": weights(5, 3, 3, 3), "b": weights(5), **spec[2]}), fuse_activation)
    assert op_types(graph) == ["Conv", "MaxPool"]
    conv, pool = graph.nodes
    assert conv.attrs.fused == spec[4] and conv.outputs == ["c"] and pool.inputs == ["c"] and pool.outputs == ["y"]
    assert "p" not in graph.values


@pytest.mark.parametrize("index", NOT_COMMUTING, ids=[IDS[i] for i in NOT_COMMUTING])
def test_activation_that_need_not_commute_with_max_stays_after_the_pool(index: int):
    nodes = [node("Conv", ["x", "W"], ["c"]), node("MaxPool", ["c"], ["p"], **POOL),
             activation(ACTIVATIONS[index], "p", "y")]  # fmt: skip
    graph = check_pass(model(nodes, X, Y, {"W": weights(5, 3, 3, 3)}), fuse_activation)
    assert op_types(graph) == ["Conv", "MaxPool", ACTIVATIONS[index][0]] and graph.nodes[0].attrs.fused is None


def test_leaky_relu_with_a_negative_slope_stays_after_the_pool():
    nodes = [node("Conv", ["x", "W"], ["c"]), node("MaxPool", ["c"], ["p"], **POOL),
             node("LeakyRelu", ["p"], ["y"], alpha=-0.5)]  # fmt: skip
    graph = check_pass(model(nodes, X, Y, {"W": weights(5, 3, 3, 3)}), fuse_activation)
    assert op_types(graph) == ["Conv", "MaxPool", "LeakyRelu"]


def test_activation_stays_after_an_average_pool_or_a_max_pool_with_indices():
    nodes = [
        node("Conv", ["x", "W"], ["c1"]),
        node("AveragePool", ["c1"], ["p1"], kernel_shape=[2, 2]),
        node("Relu", ["p1"], ["y"]),
        node("Conv", ["x", "W"], ["c2"]),
        node("MaxPool", ["c2"], ["p2", "i2"], kernel_shape=[2, 2]),
        node("Relu", ["p2"], ["z"]),
    ]
    outputs = [*Y, ("z", FLOAT, None), ("i2", onnx.TensorProto.INT64, None)]
    graph = check_pass(model(nodes, X, outputs, {"W": weights(5, 3, 1, 1)}), fuse_activation)
    assert op_types(graph) == ["Conv", "AveragePool", "Relu", "Conv", "MaxPool", "Relu"]


@pytest.mark.parametrize("shared", ["conv output", "pool output"])
def test_activation_stays_after_the_pool_when_another_node_reads_either_value(shared: str):
    read = "c" if shared == "conv output" else "p"
    nodes = [node("Conv", ["x", "W"], ["c"]), node("MaxPool", ["c"], ["p"], **POOL), node("Relu", ["p"], ["y"]),
             node("Sigmoid", [read], ["z"])]  # fmt: skip
    graph = check_pass(model(nodes, X, [*Y, ("z", FLOAT, None)], {"W": weights(5, 3, 3, 3)}), fuse_activation)
    assert op_types(graph) == ["Conv", "MaxPool", "Relu", "Sigmoid"] and graph.nodes[0].attrs.fused is None


def test_matmul_is_not_a_fusing_producer():
    nodes = [node("MatMul", ["a", "B"], ["m"]), node("Relu", ["m"], ["y"])]
    proto = model(nodes, [("a", FLOAT, ["N", 4])], Y, {"B": weights(4, 3)})
    assert op_types(check_pass(proto, fuse_activation)) == ["MatMul", "Relu"]


def test_session_folds_then_fuses_conv_batchnorm_relu6():
    nodes = [
        node("Conv", ["x", "W"], ["c"], group=3),
        batchnorm("c", "b", "bn"),
        node("Clip", ["b", "lo", "hi"], ["y"]),
    ]
    inits = {
        "W": weights(6, 1, 3, 3),
        **batchnorm_params("bn", 6),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    proto = model(nodes, X, Y, inits)
    session = hetflow.InferenceSession(proto)
    assert op_types(session.graph) == ["Conv"]
    assert session.graph.nodes[0].attrs.fused == FusedActivation("Clip", 0.0, 6.0)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 7)).astype(np.float32)
    expected = hetflow.InferenceSession(proto, optimize=False).run(None, {"x": x})[0]
    actual = session.run(None, {"x": x})[0]
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def test_gemm_kernel_applies_the_fused_activation_after_c():
    a = np.random.default_rng(2).standard_normal((3, 4)).astype(np.float32)
    b = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
    c = np.linspace(-2, 2, 5, dtype=np.float32)
    attrs = GemmAttrs(alpha=2.0, beta=0.5, fused=FusedActivation("Clip", -0.5, 1.0))
    (y,) = gemm_kernel(Node("Gemm", "g", ["a", "b", "c"], ["y"], attrs), [a, b, c])
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, np.clip(2 * a @ b + 0.5 * c, -0.5, 1.0), rtol=1e-6)


def test_fused_gemm_attrs_do_not_leak_into_onnx_attributes():
    # ``fused`` is hetflow-internal: a Gemm imported from ONNX starts without one.
    gemm = helper.make_node("Gemm", ["a", "B"], ["y"])
    proto = model([gemm], [("a", FLOAT, ["N", 4])], Y, {"B": weights(4, 3)})
    assert hetflow.load_model(proto).nodes[0].attrs.fused is None
