"""split_conv_groups: a Conv of a few groups becomes Split -> one Conv per group -> Concat, each part a
one-group Conv the CPU's Winograd and direct kernels take, computing what the unoptimised graph and ONNX
Runtime compute; anything else stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

import hetflow
from hetflow.ops.conv import IM2COL
from hetflow.passes.manager import CPU_ONLY_PASSES, optimize
from hetflow.passes.split_conv_groups import MAX_GROUPS, split_conv_groups
from tests.helpers import run_onnxruntime
from tests.passes.graphs import FLOAT, check_pass, feeds_for, model, node, op_types, weights

X = [("x", FLOAT, ["N", 12, 9, 11])]
Y = [("y", FLOAT, None)]


def grouped_model(group: int = 2, kernel: int = 3, bias: bool = True, channels: int = 12, relu: bool = False,
                  weight_input: bool = False, strides: tuple[int, int] = (1, 1), kernels: int = 8):  # noqa: ANN201
    """x [N, channels, 9, 11] -> Conv(group, kernel x kernel, ``kernels`` kernels) (-> Relu) -> y."""
    inits = {"B": weights(kernels)} if bias else {}
    if not weight_input:
        inits["W"] = weights(kernels, channels // group, kernel, kernel)
    inputs = ["x", "W", "B"] if bias else ["x", "W"]
    conv_out = "c" if relu else "y"
    nodes = [node("Conv", inputs, [conv_out], group=group, pads=[kernel // 2] * 4, strides=list(strides))]
    if relu:
        nodes.append(node("Relu", ["c"], ["y"]))
    graph_inputs = [("x", FLOAT, ["N", channels, 9, 11])]
    if weight_input:
        graph_inputs.append(("W", FLOAT, [kernels, channels // group, kernel, kernel]))
    return model(nodes, graph_inputs, Y, inits)


@pytest.mark.parametrize(("group", "kernel", "bias", "strides", "channels"),
                         [(2, 3, True, (1, 1), 12), (4, 5, False, (1, 1), 12), (2, 3, True, (2, 2), 8)])  # fmt: skip
def test_a_grouped_conv_splits_into_one_conv_per_group(
    group: int, kernel: int, bias: bool, strides: tuple[int, int], channels: int
) -> None:
    graph = check_pass(grouped_model(group, kernel, bias, channels=channels, strides=strides), split_conv_groups)
    assert op_types(graph) == ["Split", *["Conv"] * group, "Concat"]
    split, *convs, concat = graph.nodes
    assert split.inputs == ["x"] and split.attrs.axis == 1 and concat.attrs.axis == 1
    assert concat.outputs == ["y"] and concat.inputs == [c.outputs[0] for c in convs]
    for index, conv in enumerate(convs):
        assert conv.attrs.group == 1 and conv.inputs[0] == split.outputs[index]
        assert graph.initializers[conv.inputs[1]].shape == (8 // group, channels // group, kernel, kernel)
        assert len(conv.inputs) == (3 if bias else 2)
    assert not {"W", "B"} & set(graph.initializers)  # the grouped weights are gone


def test_each_part_keeps_the_fused_activation() -> None:
    proto = grouped_model(relu=True)
    graph = optimize(hetflow.load_model(proto))
    assert op_types(graph) == ["Split", "Conv", "Conv", "Concat"]
    assert all(conv.attrs.fused is not None and conv.attrs.fused.op_type == "Relu" for conv in graph.nodes[1:3])
    session = hetflow.InferenceSession(proto)
    for batch in (1, 3):
        feeds = feeds_for(proto, batch)
        np.testing.assert_allclose(session.run(None, feeds)[0], run_onnxruntime(proto, feeds)[0], rtol=1e-4, atol=1e-4)
    assert all(step.kernel.algorithm != IM2COL for step in session.plan_for({"N": 3}).steps if step.node.op_type == "Conv")


@pytest.mark.parametrize(
    "proto",
    [grouped_model(group=1), grouped_model(group=12, kernels=12), grouped_model(kernel=1),
     grouped_model(group=6, kernels=12),
     grouped_model(weight_input=True), grouped_model(strides=(2, 2))],
    ids=["one-group", "depthwise", "pointwise", "too-many-groups", "weights-fed", "parts-on-im2col-too"],
)
def test_anything_else_stays(proto) -> None:  # noqa: ANN001
    assert MAX_GROUPS < 6
    graph = check_pass(proto, split_conv_groups)
    assert op_types(graph) == ["Conv"]


def test_only_a_cpu_session_splits() -> None:
    graph = hetflow.load_model(grouped_model())
    assert split_conv_groups in CPU_ONLY_PASSES
    assert op_types(optimize(graph, cpu_only=False)) == ["Conv"]
