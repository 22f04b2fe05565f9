"""fuse_residual: a residual Add/Sum folds into the Conv producing one of its inputs (the Conv adds the
shortcut in its epilogue, ``ConvAttrs.residual``), computing what the unoptimised graph and ONNX Runtime
compute; every CPU Conv algorithm adds it; anything else stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

import hetflow
from hetflow.devices.cpu import CPUDevice
from hetflow.frontends.onnx_export import export_model
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import (
    DEPTHWISE,
    DIRECT_FMA,
    IM2COL,
    POINTWISE,
    WINOGRAD_F23,
    WINOGRAD_F43,
    Conv,
    ConvAttrs,
)
from hetflow.passes.fuse_activation import fuse_activation
from hetflow.passes.fuse_residual import fuse_residual
from hetflow.passes.manager import optimize
from tests.kernels.test_conv_algorithms import _direct_conv
from tests.passes.graphs import FLOAT, check_pass, model, node, op_types, weights

X = [("x", FLOAT, ["N", 6, 8, 7])]
Y = [("y", FLOAT, None)]


def residual_block(op_type="Add", bias=True, activation=True, shortcut_shape=None, conv_relu=False,
                   extra_reader=False):  # fmt: skip
    """y = [Relu](Conv(x) + shortcut); the shortcut is x itself, or a constant of ``shortcut_shape``."""
    inits = {"W": weights(6, 6, 3, 3)}
    conv_inputs = ["x", "W"]
    if bias:
        inits["B"] = weights(6)
        conv_inputs.append("B")
    nodes = [node("Conv", conv_inputs, ["c0"], pads=[1, 1, 1, 1])]
    source = "c0"
    if conv_relu:
        nodes.append(node("Relu", ["c0"], ["c"]))
        source = "c"
    shortcut = "x"
    if shortcut_shape is not None:
        inits["s"] = weights(*shortcut_shape)
        shortcut = "s"
    nodes.append(node(op_type, [source, shortcut], ["t" if activation else "y"]))
    if activation:
        nodes.append(node("Relu", ["t"], ["y"]))
    outputs = [*Y, ("c0", FLOAT, None)] if extra_reader else Y
    return model(nodes, X, outputs, inits)


def both_passes(graph):
    return fuse_residual(fuse_activation(graph))


@pytest.mark.parametrize("op_type", ["Add", "Sum"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("activation", [True, False])
def test_the_residual_folds_into_the_conv(op_type, bias, activation):
    graph = check_pass(residual_block(op_type, bias, activation), both_passes)
    assert op_types(graph) == ["Conv"]
    conv = graph.nodes[0]
    assert conv.attrs.residual and conv.inputs[3] == "x" and conv.outputs == ["y"]
    assert conv.inputs[2] == ("B" if bias else "")
    assert conv.attrs.fused == (FusedActivation("Relu") if activation else None)


def test_of_two_convs_the_later_folds_and_runs_after_the_other():
    inits = {"Wa": weights(6, 6, 3, 3), "Wb": weights(6, 6, 1, 1)}
    nodes = [
        node("Conv", ["x", "Wa"], ["a"], pads=[1, 1, 1, 1]),
        node("Conv", ["x", "Wb"], ["b"]),
        node("Add", ["a", "b"], ["y"]),
    ]
    graph = check_pass(model(nodes, X, Y, inits), fuse_residual)
    assert op_types(graph) == ["Conv", "Conv"]
    first, second = graph.nodes
    assert first.outputs == ["a"] and second.attrs.residual and second.inputs[3] == "a"


@pytest.mark.parametrize(
    "proto",
    [residual_block(shortcut_shape=(1, 6, 1, 1)), residual_block(conv_relu=True), residual_block(extra_reader=True)],
    ids=["broadcast", "conv-has-an-activation", "conv-output-read-elsewhere"],
)
def test_anything_else_stays(proto):
    graph = check_pass(proto, both_passes)
    assert "Add" in op_types(graph)
    assert not any(n.op_type == "Conv" and n.attrs.residual for n in graph.nodes)


KERNELS = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}


@pytest.mark.parametrize(
    ("algorithm", "w_shape", "attrs", "dtype"),
    [
        (POINTWISE, (8, 6, 1, 1), ConvAttrs(), np.float32),
        (IM2COL, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32),
        (IM2COL, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float64),
        (IM2COL, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float16),
        (WINOGRAD_F23, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32),
        (WINOGRAD_F43, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32),
        (DIRECT_FMA, (8, 6, 3, 3), ConvAttrs(pads=(1, 1, 1, 1)), np.float32),
        (DEPTHWISE, (6, 1, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=6), np.float32),
    ],
    ids=["pointwise", "im2col", "im2col-float64", "im2col-float16", "f23", "f43", "direct", "depthwise"],
)
@pytest.mark.parametrize("fused", [None, FusedActivation("Relu"), FusedActivation("Clip", 0.0, 0.5)],
                         ids=["none", "relu", "clip"])  # fmt: skip
def test_every_cpu_algorithm_adds_the_residual_before_the_activation(algorithm, w_shape, attrs, dtype, fused):
    x = np.asarray(weights(2, 6, 8, 7), dtype)
    w, b = np.asarray(weights(*w_shape), dtype), np.asarray(weights(w_shape[0]), dtype)
    plain = _direct_conv(x, w, b, attrs)
    r = np.asarray(weights(*plain.shape), dtype)
    node_attrs = ConvAttrs(**{**attrs.__dict__, "fused": fused, "residual": True})
    conv = Node("Conv", "conv", ["x", "w", "b", "r"], ["y"], node_attrs)
    infos = [TensorInfo(a.shape, a.dtype) for a in (x, w, b, r)]
    kernel = KERNELS[algorithm]
    assert kernel.reason_unsupported(conv, infos) is None
    # The memory plan stores Y over R where the tile GEMM adds it (pointwise); not where the products are
    # computed apart (below: correct all the same).
    if algorithm != IM2COL:
        assert tuple(kernel.inplace_inputs(conv, infos)) == ((3,) if algorithm == POINTWISE else ())
    expected = plain + r.astype(np.float64)
    if fused is not None:
        expected = np.clip(expected, fused.alpha, fused.beta) if fused.op_type == "Clip" else np.maximum(expected, 0)
    tolerance = 2e-2 if dtype == np.float16 else 1e-4
    (got,) = kernel.fn(conv, [x, w, b, r])
    assert got.dtype == dtype
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance)
    # Stored over the residual itself (the memory plan's in-place Conv), unbound and bound.
    workspace = np.empty(kernel.workspace(conv, infos) if kernel.workspace else 0, np.uint8)
    for call in (lambda out: kernel.fn(conv, [x, w, b, out[0]], out, workspace),
                 lambda out: kernel.bind(conv, infos, out, workspace)([x, w, b, out[0]])):  # fmt: skip
        over = r.copy()
        (got,) = call([over])
        assert np.shares_memory(got, over)
        np.testing.assert_allclose(over, expected, rtol=tolerance, atol=tolerance)


def test_a_session_on_another_device_keeps_its_adds_and_shuffles():
    """Other devices' Conv kernels add no residual: a graph that may run there is not folded."""
    graph = hetflow.InferenceSession(residual_block(), optimize=False).graph
    assert op_types(optimize(graph)) == ["Conv"]
    assert op_types(optimize(graph, cpu_only=False)) == ["Conv", "Add"]
    pinned = hetflow.InferenceSession(residual_block(), placement={"Conv_c0": "cpu"})
    assert op_types(pinned.graph) == ["Conv"]


def test_export_refuses_and_training_declines_a_folded_residual():
    graph = optimize(hetflow.InferenceSession(residual_block(activation=False), optimize=False).graph)
    with pytest.raises(hetflow.errors.InvalidModelError, match="residual"):
        export_model(graph)
    conv = graph.nodes[0]
    x, w, b = weights(1, 6, 8, 7), weights(6, 6, 3, 3), weights(6)
    with pytest.raises(ValueError, match="train the unoptimised graph"):
        Conv().backward(conv, [x, w, b, x], [x], [np.ones_like(x)])


def test_a_fourth_conv_input_needs_the_residual_attribute():
    infos = [TensorInfo((1, 6, 8, 7), np.dtype(np.float32)), TensorInfo((6, 6, 3, 3), np.dtype(np.float32)),
             None, TensorInfo((1, 6, 8, 7), np.dtype(np.float32))]  # fmt: skip
    stray = Node("Conv", "conv", ["x", "w", "", "r"], ["y"], ConvAttrs(pads=(1, 1, 1, 1)))
    with pytest.raises(ValueError, match="fourth input"):
        Conv().infer(stray, infos, [None] * 4)
    folded = Node("Conv", "conv", ["x", "w", "", "r"], ["y"], ConvAttrs(pads=(1, 1, 1, 1), residual=True))
    assert Conv().infer(folded, infos, [None] * 4)[0].shape == (1, 6, 8, 7)
