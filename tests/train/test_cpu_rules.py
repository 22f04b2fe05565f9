"""The CPU's training rules (``hetflow.devices.cpu.training``): registered for the tape, the same
gradients as the ops' numpy rules, and the numpy rules where their compiled loops do not apply."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.registry import get_device
from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import ConvAttrs
from hetflow.ops.gemm import GemmAttrs
from hetflow.ops.pool import MaxPoolAttrs
from hetflow.train.device import training_kernels

RNG = np.random.default_rng(8)


def _rule(node: Node, infos=None):
    kernel = training_kernels(get_device("cpu")).backward.lookup(node, infos)
    assert kernel is not None, f"no CPU training rule for {node.op_type}"
    return kernel.fn


@pytest.mark.parametrize("op_type", ["Conv", "MaxPool", "Relu"])
def test_cpu_registers_training_rules(op_type):
    attrs = {"Conv": {}, "MaxPool": {"kernel_shape": (2, 2)}, "Relu": {}}[op_type]
    inputs = ["x", "w"] if op_type == "Conv" else ["x"]
    node = Node(op_type, "n", inputs, ["y"], registry.get(op_type).Attrs(**attrs))
    _rule(node, [TensorInfo(("N", 3, 8, 8), np.dtype(np.float32))])


def _assert_matches_the_numpy_rule(node: Node, inputs: list, dy: np.ndarray, wanted, tolerance: float) -> None:
    """The CPU rule's gradients equal the op's numpy rule's, the same ones present."""
    got = _rule(node)(node, inputs, [None], [dy], wanted)
    reference = registry.get(node.op_type).backward(node, inputs, [None], [dy], wanted)
    for ours, theirs in zip(got, reference):
        assert (ours is None) == (theirs is None)
        if theirs is not None:
            np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("wanted", [None, [False, True, True], [True, False, False]])
def test_conv_rule_matches_the_numpy_rule(wanted):
    attrs = ConvAttrs(group=2, pads=(1, 0, 2, 1), strides=(2, 1), dilations=(1, 2))
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    x, w, b = RNG.standard_normal((3, 4, 9, 8)), RNG.standard_normal((6, 2, 3, 2)), RNG.standard_normal(6)
    dy = RNG.standard_normal((3, 6, 5, 7))
    _assert_matches_the_numpy_rule(node, [x, w, b], dy, wanted, 1e-12)


def test_max_pool_rule_matches_the_numpy_rule():
    node = Node(
        "MaxPool", "pool", ["x"], ["y"], MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    )
    x, dy = RNG.standard_normal((2, 3, 7, 8)), RNG.standard_normal((2, 3, 4, 4))
    got = _rule(node)(node, [x], [None], [dy], [True])
    reference = registry.get("MaxPool").backward(node, [x], [None], [dy], [True])
    np.testing.assert_allclose(got[0], reference[0], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_rules_hand_other_dtypes_to_the_numpy_rules(dtype):
    """The compiled loops run float32 and float64 only; other dtypes get exactly the numpy rules' result."""
    relu = Node("Relu", "relu", ["x"], ["y"])
    pool = Node("MaxPool", "pool", ["x"], ["y"], MaxPoolAttrs(kernel_shape=(2, 2), strides=(2, 2)))
    for node, shape in ((relu, (4, 5)), (pool, (1, 2, 4, 4))):
        x = (RNG.standard_normal(shape) * 4).astype(dtype)
        dy = (RNG.standard_normal((1, 2, 2, 2) if node is pool else shape) * 4).astype(dtype)
        got = _rule(node)(node, [x], [None], [dy], [True])[0]
        expected = registry.get(node.op_type).backward(node, [x], [None], [dy], [True])[0]
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_conv_rule_refuses_fused_activations_other_than_relu():
    node = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs(fused=FusedActivation("Sigmoid")))
    kernels = training_kernels(get_device("cpu")).backward
    assert kernels.lookup(node) is None
    assert "fused Sigmoid" in kernels.reason_unsupported(node)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv_rule_with_a_fused_relu_matches_the_numpy_rule(dtype):
    attrs = ConvAttrs(pads=(1, 0, 2, 1), strides=(2, 1), fused=FusedActivation("Relu"))
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    x, w, b = (RNG.standard_normal(s).astype(dtype) for s in ((3, 4, 9, 8), (6, 4, 3, 2), (6,)))
    y = np.maximum(RNG.standard_normal((3, 6, 5, 8)), 0).astype(dtype)
    dy = RNG.standard_normal(y.shape).astype(dtype)
    got = _rule(node)(node, [x, w, b], [y], [dy], None)
    reference = registry.get("Conv").backward(node, [x, w, b], [y], [dy], None)
    tolerance = 1e-4 if dtype == np.float32 else 1e-12
    for ours, theirs in zip(got, reference):
        assert ours.dtype == dtype
        np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("wanted", [None, [True, False, True], [False, True, False]])
def test_gemm_rule_matches_the_numpy_rule(wanted):
    node = Node("Gemm", "fc", ["a", "b", "c"], ["y"], GemmAttrs(transB=1, alpha=0.5, beta=1.5))
    a, b, c, dy = (RNG.standard_normal(s) for s in ((6, 5), (4, 5), (4,), (6, 4)))
    _assert_matches_the_numpy_rule(node, [a, b, c], dy, wanted, 1e-13)


def test_gemm_rule_hands_integers_and_mixed_dtypes_to_the_numpy_rule():
    node = Node("Gemm", "fc", ["a", "b"], ["y"], GemmAttrs())
    for a, b in (
        (np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(12, dtype=np.int32).reshape(3, 4)),
        (RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((3, 4))),
    ):
        dy = np.ones((2, 4), np.result_type(a, b))
        got = _rule(node)(node, [a, b], [None], [dy], None)
        expected = registry.get("Gemm").backward(node, [a, b], [None], [dy], None)
        for ours, theirs in zip(got, expected):
            assert ours.dtype == theirs.dtype
            np.testing.assert_array_equal(ours, theirs)


def test_gemm_rule_refuses_fused_activations():
    node = Node("Gemm", "fc", ["a", "b"], ["y"], GemmAttrs(fused=FusedActivation("Relu")))
    kernels = training_kernels(get_device("cpu")).backward
    assert kernels.lookup(node) is None
    assert "fused Relu" in kernels.reason_unsupported(node)
