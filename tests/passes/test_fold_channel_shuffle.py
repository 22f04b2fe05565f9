"""fold_channel_shuffle: ShuffleNet's Reshape -> Transpose -> Reshape folds into the depthwise Conv that
alone reads it (the Conv reads X's channels shuffled, ``ConvAttrs.shuffle_groups``), computing what the
unoptimised graph and ONNX Runtime compute; anything else stays as it was."""

from __future__ import annotations

import numpy as np
import pytest

import hetflow
from hetflow.devices.cpu import CPUDevice
from hetflow.frontends.onnx_export import export_model
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import DEPTHWISE, IM2COL, ConvAttrs
from hetflow.passes.fold_channel_shuffle import fold_channel_shuffle
from hetflow.passes.manager import optimize
from tests.helpers import run_onnxruntime
from tests.passes.graphs import FLOAT, check_pass, feeds_for, model, node, op_types, weights

GROUPS, CHANNELS = 4, 12
X = [("x", FLOAT, ["N", CHANNELS, 9, 11])]
Y = [("y", FLOAT, None)]
SHAPES = {"split": np.array([0, GROUPS, CHANNELS // GROUPS, 9, 11], np.int64),
          "merged": np.array([0, CHANNELS, 9, 11], np.int64)}  # fmt: skip


def shuffle_model(perm=(0, 2, 1, 3, 4), group=CHANNELS, extra_reader=False, strides=(1, 1), kernel=3):
    """x -> Reshape -> Transpose(perm) -> Reshape -> Conv(group) -> y (and the Transpose's output as a
    second output when ``extra_reader``)."""
    inits = {**SHAPES, "W": weights(CHANNELS, CHANNELS // group, kernel, kernel), "B": weights(CHANNELS)}
    nodes = [
        node("Reshape", ["x", "split"], ["s"]),
        node("Transpose", ["s"], ["t"], perm=list(perm)),
        node("Reshape", ["t", "merged"], ["u"]),
        node("Conv", ["u", "W", "B"], ["y"], group=group, pads=[kernel // 2] * 4, strides=list(strides)),
    ]
    outputs = [*Y, ("t", FLOAT, None)] if extra_reader else Y
    return model(nodes, X, outputs, inits)


@pytest.mark.parametrize(("strides", "kernel"), [((1, 1), 3), ((2, 2), 3), ((1, 2), 5)])
def test_the_shuffle_folds_into_a_depthwise_conv(strides, kernel):
    graph = check_pass(shuffle_model(strides=strides, kernel=kernel), fold_channel_shuffle)
    assert op_types(graph) == ["Conv"]
    conv = graph.nodes[0]
    assert conv.inputs[0] == "x" and conv.attrs.shuffle_groups == GROUPS
    assert not {"s", "t", "u", "split", "merged"} & (set(graph.values) | set(graph.initializers))


@pytest.mark.parametrize(
    "proto",
    [shuffle_model(perm=(0, 1, 2, 4, 3)), shuffle_model(group=1), shuffle_model(extra_reader=True)],
    ids=["another-transpose", "not-depthwise", "shuffle-read-elsewhere"],
)
def test_anything_else_stays(proto):
    graph = check_pass(proto, fold_channel_shuffle)
    assert op_types(graph) == ["Reshape", "Transpose", "Reshape", "Conv"]
    assert graph.nodes[-1].attrs.shuffle_groups == 0


def test_a_session_runs_the_folded_conv_as_onnx_runtime_does():
    proto = shuffle_model()
    session = hetflow.InferenceSession(proto)
    assert [n.op_type for n in session.graph.nodes] == ["Conv"]
    feeds = feeds_for(proto, 3)
    [expected] = run_onnxruntime(proto, feeds)
    [got] = session.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("dtype", "multiplier", "x_shape"),
    [(np.float32, 1, (2, 12, 9, 11)), (np.float64, 1, (2, 12, 9, 11)), (np.float32, 2, (2, 12, 9, 11)),
     (np.float32, 1, (2, 12, 7))],
    ids=["float32-vectors", "float64-phases", "multiplier-phases", "1-d"],
)  # fmt: skip
def test_the_depthwise_kernel_reads_x_shuffled(dtype, multiplier, x_shape):
    """Every path of the CPU depthwise kernel: the vector kernel reads X in place, the others a shuffled
    copy; all equal the direct sum over the shuffled X."""
    from hetflow.devices.cpu.kernels.jit_depthwise import shuffled_channels
    from tests.kernels.test_conv_algorithms import _direct_conv

    rank = len(x_shape) - 2
    x = np.asarray(weights(*x_shape), dtype)
    w = np.asarray(weights(CHANNELS * multiplier, 1, *(3,) * rank), dtype)
    b = np.asarray(weights(CHANNELS * multiplier), dtype)
    attrs = ConvAttrs(pads=(1,) * 2 * rank, group=CHANNELS, shuffle_groups=GROUPS)
    conv = Node("Conv", "dw", ["x", "w", "b"], ["y"], attrs)
    kernel = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}[DEPTHWISE]
    assert kernel.reason_unsupported(conv, [TensorInfo(a.shape, a.dtype) for a in (x, w, b)]) is None
    (got,) = kernel.fn(conv, [x, w, b])
    plain = ConvAttrs(pads=attrs.pads, group=CHANNELS)
    expected = _direct_conv(shuffled_channels(x, GROUPS), w, b, plain)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_only_the_depthwise_kernel_runs_a_shuffled_conv_and_export_refuses_it():
    graph = optimize(hetflow.InferenceSession(shuffle_model(), optimize=False).graph)
    conv = graph.nodes[0]
    infos = [TensorInfo((1, CHANNELS, 9, 11), np.dtype(np.float32)), TensorInfo((CHANNELS, 1, 3, 3), np.dtype(np.float32))]
    kernels = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}
    assert kernels[DEPTHWISE].reason_unsupported(conv, infos) is None
    assert "channel-shuffled" in kernels[IM2COL].reason_unsupported(conv, infos)
    with pytest.raises(hetflow.errors.InvalidModelError, match="shuffle_groups"):
        export_model(graph)


def test_the_shufflenet_zoo_model_has_every_shuffle_folded():
    graph = hetflow.InferenceSession("zoo:shufflenet").graph
    assert "Transpose" not in op_types(graph)
    assert sum(1 for n in graph.nodes if n.op_type == "Conv" and n.attrs.shuffle_groups) == 16


def test_the_attribute_defaults_to_x_as_it_lies():
    assert ConvAttrs().shuffle_groups == 0
    assert Node("Conv", "c", ["x", "w"], ["y"], ConvAttrs()).attrs.shuffle_groups == 0


def test_the_opencl_device_declines_a_shuffled_conv():
    """Its kernels read X as it lies: placement keeps the folded Conv on the CPU."""
    from hetflow.devices.opencl.kernels.conv import _supports_any

    infos = [TensorInfo((1, CHANNELS, 9, 11), np.dtype(np.float32)), TensorInfo((CHANNELS, 1, 3, 3), np.dtype(np.float32))]
    shuffled = Node("Conv", "dw", ["x", "w"], ["y"], ConvAttrs(group=CHANNELS, shuffle_groups=GROUPS))
    plain = Node("Conv", "dw", ["x", "w"], ["y"], ConvAttrs(group=CHANNELS))
    assert "channel-shuffled" in (_supports_any(shuffled, infos) or "")
    assert _supports_any(plain, infos) is None
