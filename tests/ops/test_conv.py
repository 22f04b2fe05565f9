"""Conv: ONNX Runtime parity on odd shapes (groups, depthwise, 1x1, strides, dilations, asymmetric pads,
1-D and 3-D), float64 against ONNX's reference, shape inference with a symbolic batch, cost numbers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from hetflow.errors import InvalidModelError
from hetflow.graph import Node
from hetflow.ops import GemmDims, registry
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import DEPTHWISE, IM2COL, POINTWISE, ConvAttrs, conv_algorithm, conv_window
from tests.helpers import run_onnxruntime
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(7)


def _data(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# (x shape, w shape, attributes): every case odd somewhere.
CASES = {
    "groups3_stride2_dilation_asym_pads": (
        (3, 6, 7, 9), (9, 2, 3, 3), dict(group=3, strides=[2, 2], dilations=[2, 1], pads=[1, 0, 2, 1])
    ),
    "plain_3x3_pad1_batch3": ((3, 5, 7, 9), (4, 5, 3, 3), dict(pads=[1, 1, 1, 1])),
    "dilation2_valid": ((2, 3, 9, 11), (5, 3, 3, 3), dict(auto_pad="VALID", dilations=[2, 2])),
    "same_upper_stride2": ((2, 3, 7, 9), (4, 3, 3, 2), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower_stride3": ((2, 3, 7, 9), (4, 3, 2, 4), dict(auto_pad="SAME_LOWER", strides=[3, 2])),
    "depthwise": ((3, 4, 7, 9), (4, 1, 3, 3), dict(group=4, pads=[1, 1, 1, 1])),
    "depthwise_multiplier2_stride2": (
        (2, 4, 7, 9), (8, 1, 3, 3), dict(group=4, strides=[2, 2], pads=[0, 1, 2, 1])
    ),
    "depthwise_dilated": ((2, 6, 9, 7), (6, 1, 3, 3), dict(group=6, dilations=[2, 3], pads=[2, 3, 2, 3])),
    "pointwise": ((3, 6, 7, 9), (5, 6, 1, 1), {}),
    "pointwise_grouped": ((2, 6, 7, 9), (4, 3, 1, 1), dict(group=2)),
    "pointwise_stride2": ((2, 6, 7, 9), (4, 6, 1, 1), dict(strides=[2, 2])),
    "kernel_shape_given": ((1, 3, 7, 9), (2, 3, 3, 3), dict(kernel_shape=[3, 3], pads=[0, 1, 0, 1])),
    "conv1d": ((3, 4, 11), (5, 4, 3), dict(strides=[2], pads=[1, 2])),
    "conv1d_grouped_dilated": ((2, 4, 13), (6, 2, 3), dict(group=2, dilations=[3])),
    "conv3d": ((2, 3, 5, 6, 7), (4, 3, 3, 2, 3), dict(auto_pad="SAME_UPPER", strides=[1, 2, 2])),
    "conv3d_depthwise": ((2, 3, 5, 6, 7), (3, 1, 3, 3, 3), dict(group=3, pads=[1, 0, 1, 1, 2, 1])),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_conv_matches_onnxruntime(case, bias):
    x_shape, w_shape, attrs = CASES[case]
    x, w = _data(*x_shape), _data(*w_shape)
    constants = {"w": w}
    inputs = ["x", "w"]
    if bias:
        constants["b"] = _data(w_shape[0])
        inputs.append("b")
    actual = assert_matches_onnxruntime("Conv", inputs, {"x": x}, constants, rtol=1e-4, atol=1e-4, **attrs)
    assert actual.flags.c_contiguous


@pytest.mark.parametrize("case", ["groups3_stride2_dilation_asym_pads", "depthwise", "pointwise", "conv3d"])
def test_conv_float64_stays_float64(case):
    # ONNX Runtime has no float64 Conv on CPU: ONNX's reference evaluator is the oracle here.
    x_shape, w_shape, attrs = CASES[case]
    x, w, b = _data(*x_shape, dtype=np.float64), _data(*w_shape, dtype=np.float64), _data(w_shape[0])
    model = node_model("Conv", ["x", "w", "b"], {"x": x}, {"w": w, "b": b.astype(np.float64)}, **attrs)
    actual = run_hetflow(model, {"x": x})
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert actual.dtype == np.float64
    np.testing.assert_allclose(actual, expected, rtol=1e-12, atol=1e-12)


def test_conv_same_with_dilation_matches_reference():
    # ONNX Runtime refuses SAME auto_pad with dilations; the reference pads for the dilated window.
    x, w = _data(2, 3, 7, 9), _data(4, 3, 3, 3)
    model = node_model("Conv", ["x", "w"], {"x": x}, {"w": w}, auto_pad="SAME_LOWER", dilations=[2, 2],
                       strides=[2, 3])
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(run_hetflow(model, {"x": x}), expected, rtol=1e-5, atol=1e-5)


def test_conv_float16_is_computed_in_float32():
    x, w = _data(1, 3, 6, 5).astype(np.float16), _data(4, 3, 3, 3).astype(np.float16)
    model = node_model("Conv", ["x", "w"], {"x": x}, {"w": w}, pads=[1, 1, 1, 1])
    actual = run_hetflow(model, {"x": x})
    wide = {"x": x.astype(np.float32)}
    (expected,) = run_onnxruntime(node_model("Conv", ["x", "w"], wide, {"w": w.astype(np.float32)},
                                             pads=[1, 1, 1, 1]), wide)
    assert actual.dtype == np.float16
    np.testing.assert_allclose(actual, expected.astype(np.float16), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"pads": [1, 1, 1, 1]}, ("N", 8, 7, 9)),
        ({"strides": [2, 2]}, ("N", 8, 3, 4)),
        ({"auto_pad": "SAME_UPPER", "strides": [2, 2]}, ("N", 8, 4, 5)),
        ({"dilations": [2, 2], "pads": [0, 1, 2, 3]}, ("N", 8, 5, 9)),
    ],
)
def test_conv_infers_shapes_with_symbolic_batch(attrs, expected):
    x, w = _data(2, 4, 7, 9), _data(8, 4, 3, 3)
    model = node_model("Conv", ["x", "w"], {"x": x}, {"w": w}, shapes={"x": ["N", 4, 7, 9]}, **attrs)
    assert inferred_shape(model) == expected
    # The bound shape runs.
    assert run_hetflow(model, {"x": x}).shape == (2, *expected[1:])


def test_conv_symbolic_spatial_dims_get_derived_names():
    x, w = _data(1, 4, 7, 9), _data(8, 4, 3, 3)
    same = node_model("Conv", ["x", "w"], {"x": x}, {"w": w}, shapes={"x": ["N", 4, "H", "W"]},
                      pads=[1, 1, 1, 1])
    assert inferred_shape(same) == ("N", 8, "H", "W")
    strided = node_model("Conv", ["x", "w"], {"x": x}, {"w": w}, shapes={"x": ["N", 4, "H", "W"]},
                         strides=[2, 2])
    assert inferred_shape(strided) == ("N", 8, "floor((H-3)/2)+1", "floor((W-3)/2)+1")


def test_alexnet_conv1_cost_matches_hand_count():
    # 227x227x3, 96 kernels 11x11 stride 4 -> 55x55 outputs: im2col GEMM [3025 x 363] x [363 x 96].
    cost = node_cost("Conv", [(1, 3, 227, 227), (96, 3, 11, 11), (96,)], strides=(4, 4))
    assert cost.gemm == GemmDims(n=96, m=3025, k=363, count=1)
    assert cost.macs == 96 * 3025 * 363
    assert cost.flops == 96 * 3025  # the bias
    assert cost.workspace_bytes == 363 * 3025 * 4
    assert cost.bytes_read == 4 * (3 * 227 * 227 + 96 * 3 * 11 * 11 + 96)
    assert cost.bytes_written == 4 * 96 * 55 * 55


def test_grouped_conv_cost_counts_groups_and_batch():
    # AlexNet conv2 (2 groups) on a batch of 3: 27x27x96 -> 256 kernels 5x5 pad 2.
    cost = node_cost("Conv", [(3, 96, 27, 27), (256, 48, 5, 5), None], group=2, pads=(2, 2, 2, 2))
    assert cost.gemm == GemmDims(n=128, m=729, k=48 * 25, count=6)
    assert cost.macs == 3 * 256 * 729 * 48 * 25
    assert cost.flops == 0
    assert cost.workspace_bytes == 3 * 96 * 25 * 729 * 4


def test_pointwise_and_depthwise_need_no_workspace():
    pointwise = node_cost("Conv", [(1, 256, 56, 56), (64, 256, 1, 1)])
    assert pointwise.gemm == GemmDims(n=64, m=3136, k=256, count=1)
    assert pointwise.workspace_bytes == 0
    depthwise = node_cost("Conv", [(2, 32, 112, 112), (32, 1, 3, 3)], group=32, pads=(1, 1, 1, 1),
                          dtype=np.float64)
    assert depthwise.gemm == GemmDims(n=1, m=112 * 112, k=9, count=64)
    assert depthwise.macs == 2 * 32 * 112 * 112 * 9
    assert depthwise.workspace_bytes == 0
    strided = node_cost("Conv", [(1, 256, 56, 56), (512, 256, 1, 1)], strides=(2, 2))
    assert strided.workspace_bytes == 256 * 28 * 28 * 4


def test_conv_cost_needs_a_bound_batch():
    x, w = TensorInfo(("N", 3, 9, 9), np.dtype(np.float32)), TensorInfo((4, 3, 3, 3), np.dtype(np.float32))
    opdef = registry.get("Conv")
    node = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs())
    outputs = opdef.infer(node, [x, w], [None, None])
    assert outputs[0].shape == ("N", 4, 7, 7)
    with pytest.raises(ValueError, match="bind the batch"):
        opdef.cost(node, [x, w], outputs)


def test_conv3d_cost():
    cost = node_cost("Conv", [(2, 3, 5, 6, 7), (4, 3, 3, 2, 3)], auto_pad="SAME_UPPER", strides=(1, 2, 2))
    positions = 5 * 3 * 4
    assert cost.gemm == GemmDims(n=4, m=positions, k=3 * 18, count=2)
    assert cost.macs == 2 * 4 * positions * 3 * 18


def test_algorithm_choice():
    plain, padded = ConvAttrs(), ConvAttrs(pads=(1, 1, 1, 1))
    assert conv_algorithm(conv_window(plain, (8, 4, 1, 1)), 4, 1) == POINTWISE
    assert conv_algorithm(conv_window(ConvAttrs(auto_pad="SAME_UPPER"), (8, 4, 1, 1)), 4, 1) == POINTWISE
    assert conv_algorithm(conv_window(padded, (8, 4, 1, 1)), 4, 1) == IM2COL
    assert conv_algorithm(conv_window(ConvAttrs(strides=(2, 2)), (8, 4, 1, 1)), 4, 1) == IM2COL
    assert conv_algorithm(conv_window(plain, (8, 1, 3, 3)), 8, 8) == DEPTHWISE
    assert conv_algorithm(conv_window(plain, (8, 1, 3, 3)), 1, 1) == IM2COL


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "attrs", "message"),
    [
        ((1, 4, 7, 7), (8, 3, 3, 3), {}, "channels"),
        ((1, 4, 7, 7), (7, 2, 3, 3), {"group": 2}, "divisible"),
        ((1, 4, 7, 7), (8, 4, 3, 3), {"kernel_shape": [2, 2]}, "kernel_shape"),
        ((1, 4, 7, 7), (8, 4, 3, 3), {"strides": [1]}, "strides"),
        ((1, 4, 7, 7), (8, 4, 3, 3), {"pads": [1, 1]}, "pads"),
        ((1, 4, 2, 2), (8, 4, 3, 3), {}, "larger than"),
        ((1, 4, 7, 7), (8, 4, 3, 3), {"auto_pad": "SAME"}, "auto_pad"),
        ((1, 4, 7, 7), (8, 4, 3), {}, "rank"),
    ],
)
def test_conv_rejects_bad_models(x_shape, w_shape, attrs, message):
    model = node_model("Conv", ["x", "w"], {"x": _data(*x_shape)}, {"w": _data(*w_shape)}, **attrs)
    with pytest.raises(InvalidModelError, match=message):
        inferred_shape(model)


def test_conv_rejects_bias_of_wrong_length():
    model = node_model("Conv", ["x", "w", "b"], {"x": _data(1, 4, 7, 7)}, {"w": _data(8, 4, 3, 3),
                       "b": _data(7)})
    with pytest.raises(InvalidModelError, match="B must be"):
        inferred_shape(model)
