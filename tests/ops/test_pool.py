"""Pooling: ONNX Runtime parity (odd sizes, strides, dilations, asymmetric pads, ceil_mode, both
count_include_pad forms, auto_pad, 1-D/2-D/3-D, MaxPool's Indices in both storage orders, integer
inputs), shape inference with a symbolic batch, cost numbers and attribute errors."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import hetflow
from hetflow.errors import InvalidModelError
from hetflow.graph import dtypes
from tests.helpers import make_model, run_onnxruntime
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(11)


def _data(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# (input shape, attributes) shared by MaxPool and AveragePool.
WINDOWS = {
    "3x3_s2_pad1_batch3": ((3, 2, 7, 9), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "2x3_asym_pads": ((2, 3, 7, 9), dict(kernel_shape=[2, 3], pads=[1, 0, 0, 2])),
    "ceil_3x3_s2": ((2, 3, 8, 9), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
    "ceil_pads_s3": ((1, 2, 7, 9), dict(kernel_shape=[3, 2], strides=[3, 2], pads=[1, 1, 1, 0], ceil_mode=1)),
    "ceil_last_window_on_pad": ((1, 3, 2, 2), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1],
                                                   ceil_mode=1)),
    "dilation2": ((2, 2, 9, 11), dict(kernel_shape=[3, 2], dilations=[2, 3], pads=[1, 1, 2, 1])),
    "dilation2_ceil": (
        (1, 2, 9, 10), dict(kernel_shape=[2, 2], dilations=[2, 2], strides=[2, 3], ceil_mode=1)
    ),
    "same_upper_s2": ((2, 3, 7, 9), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_UPPER")),
    "same_lower_s2": ((2, 3, 7, 9), dict(kernel_shape=[2, 3], strides=[2, 2], auto_pad="SAME_LOWER")),
    "valid_s2": ((2, 3, 7, 9), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID")),
    "pool1d": ((3, 2, 11), dict(kernel_shape=[3], strides=[2], pads=[1, 2])),
    "pool3d": ((2, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 1, 1, 0])),
}


@pytest.mark.parametrize("case", list(WINDOWS))
def test_max_pool_matches_onnxruntime(case):
    shape, attrs = WINDOWS[case]
    assert_matches_onnxruntime("MaxPool", ["x"], {"x": _data(*shape)}, rtol=0, atol=0, **attrs)


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("case", list(WINDOWS))
def test_average_pool_matches_onnxruntime(case, count_include_pad):
    shape, attrs = WINDOWS[case]
    assert_matches_onnxruntime(
        "AveragePool", ["x"], {"x": _data(*shape)}, count_include_pad=count_include_pad, rtol=1e-5,
        atol=1e-6, **attrs
    )


def _max_pool_with_indices(x: np.ndarray, **attrs: object) -> tuple[list[np.ndarray], list[np.ndarray]]:
    elem = dtypes.to_onnx(x.dtype)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    outputs = [("y", elem, None), ("i", TensorProto.INT64, None)]
    model = make_model([node], [("x", elem, list(x.shape))], outputs, opset=21)
    model.ir_version = 10
    return hetflow.InferenceSession(model).run(None, {"x": x}), run_onnxruntime(model, {"x": x})


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize(
    "case",
    ["3x3_s2_pad1_batch3", "2x3_asym_pads", "dilation2", "ceil_pads_s3", "pool3d", "pool1d", "same_lower_s2"],
)
def test_max_pool_indices_match_onnxruntime(case, storage_order):
    shape, attrs = WINDOWS[case]
    (y, indices), (expected_y, expected_indices) = _max_pool_with_indices(
        _data(*shape), storage_order=storage_order, **attrs
    )
    assert indices.dtype == np.int64
    np.testing.assert_array_equal(y, expected_y)
    np.testing.assert_array_equal(indices, expected_indices)


def test_max_pool_3d_column_major_indices():
    # Column-major within the spatial axes (ONNX's reference convention), channel planes row-major.
    x = _data(2, 3, 4, 5, 6)
    (y, indices), _ = _max_pool_with_indices(x, kernel_shape=[2, 2, 2], strides=[2, 2, 2], storage_order=1)
    n, c, h, w, d = np.unravel_index(np.arange(x.size), x.shape)
    column_major = ((n * 3 + c) * 120 + h + w * 4 + d * 20).reshape(x.shape)
    # Each index must point at the value it reports, read through the column-major numbering.
    lookup = np.empty(x.size, dtype=x.dtype)
    lookup[column_major.ravel()] = x.ravel()
    np.testing.assert_array_equal(lookup[indices], y)


def test_max_pool_ties_pick_the_first_tap():
    x = np.ones((1, 1, 4, 4), dtype=np.float32)
    (_, indices), (_, expected) = _max_pool_with_indices(x, kernel_shape=[2, 2], strides=[2, 2])
    np.testing.assert_array_equal(indices, expected)
    np.testing.assert_array_equal(indices.ravel(), [0, 2, 8, 10])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.float64])
def test_max_pool_keeps_dtype(dtype):
    x = (RNG.integers(0, 120, (2, 3, 7, 9)) - (0 if dtype == np.uint8 else 60)).astype(dtype)
    actual = assert_matches_onnxruntime("MaxPool", ["x"], {"x": x}, kernel_shape=[3, 3], strides=[2, 2],
                                        pads=[1, 1, 1, 1], rtol=0, atol=0)
    assert actual.dtype == dtype


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(3, 5, 11), (2, 3, 7, 9), (2, 3, 4, 5, 6)])
def test_global_pools_match_onnxruntime(op_type, shape):
    actual = assert_matches_onnxruntime(op_type, ["x"], {"x": _data(*shape)}, rtol=1e-6)
    assert actual.shape == shape[:2] + (1,) * (len(shape) - 2)


def test_global_average_pool_of_strided_and_empty_inputs():
    from hetflow.devices.cpu import CPUDevice
    from hetflow.graph import Node

    kernel = CPUDevice().kernels.kernels["GlobalAveragePool"][0]
    node = Node("GlobalAveragePool", "gap", ["x"], ["y"], None)
    x = _data(2, 40, 9, 7).transpose(0, 1, 3, 2)  # planes not contiguous
    (y,) = kernel.fn(node, [x])
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    (empty,) = kernel.fn(node, [np.zeros((0, 4, 3, 3), np.float32)])
    assert empty.shape == (0, 4, 1, 1)


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [
        ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)),
        ("AveragePool", dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 1, 1, 0])),
        ("GlobalAveragePool", {}),
        ("GlobalMaxPool", {}),
    ],
)
def test_float64_pools_match_reference(op_type, attrs):
    # ONNX Runtime has no float64 AveragePool / global pools on CPU: ONNX's reference is the oracle.
    x = _data(2, 3, 7, 9, dtype=np.float64)
    model = node_model(op_type, ["x"], {"x": x}, **attrs)
    actual = run_hetflow(model, {"x": x})
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    assert actual.dtype == np.float64
    np.testing.assert_allclose(actual, expected, rtol=1e-12)


@pytest.mark.parametrize(
    ("op_type", "attrs", "expected"),
    [
        ("MaxPool", dict(kernel_shape=[3, 3], strides=[2, 2]), ("N", 3, 3, 4)),
        ("MaxPool", dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), ("N", 3, 4, 5)),
        ("AveragePool", dict(kernel_shape=[2, 2], auto_pad="SAME_UPPER", strides=[2, 2]), ("N", 3, 4, 5)),
        ("AveragePool", dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), ("N", 3, 7, 9)),
        ("GlobalAveragePool", {}, ("N", 3, 1, 1)),
        ("GlobalMaxPool", {}, ("N", 3, 1, 1)),
    ],
)
def test_pool_infers_shapes_with_symbolic_batch(op_type, attrs, expected):
    x = _data(2, 3, 7, 9)
    model = node_model(op_type, ["x"], {"x": x}, shapes={"x": ["N", 3, 7, 9]}, **attrs)
    assert inferred_shape(model) == expected


def test_pool_costs():
    # AlexNet pool1: 55x55x96 -> 27x27, 3x3 windows.
    max_pool = node_cost("MaxPool", [(1, 96, 55, 55)], kernel_shape=(3, 3), strides=(2, 2))
    assert max_pool.flops == 96 * 27 * 27 * 9
    assert max_pool.bytes_read == 96 * 55 * 55 * 4
    assert max_pool.bytes_written == 96 * 27 * 27 * 4
    assert max_pool.macs == 0 and max_pool.gemm is None
    average = node_cost("AveragePool", [(2, 8, 7, 7, 7)], kernel_shape=(2, 2, 2), dtype=np.float64)
    assert average.flops == 2 * 8 * 6 * 6 * 6 * 8
    assert average.bytes_written == 2 * 8 * 216 * 8
    global_average = node_cost("GlobalAveragePool", [(2, 2048, 7, 7)])
    assert global_average.flops == 2 * 2048 * 49
    assert global_average.bytes_written == 2 * 2048 * 4


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        (dict(kernel_shape=[3]), "spatial axes"),
        (dict(kernel_shape=[3, 3], strides=[1, 1, 1]), "strides"),
        (dict(kernel_shape=[3, 3], pads=[1, 1]), "pads"),
        (dict(kernel_shape=[3, 30]), "larger than"),
        (dict(kernel_shape=[3, 3], auto_pad="FULL"), "auto_pad"),
        (dict(kernel_shape=[3, 3], storage_order=2), "storage_order"),
        ({}, "kernel_shape"),
    ],
)
def test_max_pool_rejects_bad_attributes(attrs, message):
    model = node_model("MaxPool", ["x"], {"x": _data(1, 2, 7, 9)}, **attrs)
    with pytest.raises(InvalidModelError, match=message):
        inferred_shape(model)
