"""Softmax and LogSoftmax: ONNX Runtime parity (new and old opsets), stability, shapes and cost."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hetflow.errors import InvalidModelError
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(11)
OPS = ["Softmax", "LogSoftmax"]


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("axis", [None, -1, 0, 1, 2, -3])
def test_matches_onnxruntime_on_every_axis(op_type, axis):
    x = RNG.standard_normal((3, 5, 7)).astype(np.float32) * 4
    attrs = {} if axis is None else {"axis": axis}
    assert_matches_onnxruntime(op_type, ["x"], {"x": x}, **attrs)


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("axis", [None, 0, 1, 2, 3, -1])
def test_opset11_flattens_to_2d_at_axis(op_type, axis):
    # Before opset 13 the input is a [prod(shape[:axis]), prod(shape[axis:])] matrix; the default axis is 1.
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3
    attrs = {} if axis is None else {"axis": axis}
    y = assert_matches_onnxruntime(op_type, ["x"], {"x": x}, opset=11, **attrs)
    if op_type == "Softmax":
        start = 1 if axis is None else axis % 4
        sums = y.reshape(int(np.prod(x.shape[:start])), -1).sum(axis=1)
        np.testing.assert_allclose(sums, 1.0, rtol=1e-5)


def test_opset11_axis1_differs_from_opset13_axis1():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    old = run_hetflow(node_model("Softmax", ["x"], {"x": x}, opset=11, axis=1), {"x": x})
    new = run_hetflow(node_model("Softmax", ["x"], {"x": x}, opset=13, axis=1), {"x": x})
    np.testing.assert_allclose(old.sum(axis=(1, 2, 3)), 1.0, rtol=1e-5)
    np.testing.assert_allclose(new.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("op_type", OPS)
def test_large_inputs_stay_finite_without_warnings(op_type):
    x = np.array([[1000.0, 1001.0, 1002.0], [-1e4, 0.0, 1e4]], np.float32)
    model = node_model(op_type, ["x"], {"x": x})
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        y = run_hetflow(model, {"x": x})
    shifted = x - x.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = log_softmax if op_type == "LogSoftmax" else np.exp(log_softmax)
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-30)


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_keeps_dtype(op_type, dtype):
    x = RNG.standard_normal((4, 9)).astype(dtype)
    y = run_hetflow(node_model(op_type, ["x"], {"x": x}), {"x": x})
    assert y.dtype == dtype
    x64 = x.astype(np.float64)
    log_softmax = x64 - x64.max(1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(1, keepdims=True))
    expected = log_softmax if op_type == "LogSoftmax" else np.exp(log_softmax)
    tolerance = 3e-3 if dtype == np.float16 else 1e-12
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("op_type", OPS)
@pytest.mark.parametrize("opset", [11, 13])
def test_symbolic_batch_passes_through(op_type, opset):
    x = RNG.standard_normal((2, 10)).astype(np.float32)
    model = node_model(op_type, ["x"], {"x": x}, shapes={"x": ["N", 10]}, opset=opset)
    assert inferred_shape(model) == ("N", 10)


@pytest.mark.parametrize("op_type", OPS)
def test_axis_out_of_range_is_rejected(op_type):
    x = RNG.standard_normal((2, 10)).astype(np.float32)
    with pytest.raises(InvalidModelError, match="axis 2 is out of range for rank 2"):
        run_hetflow(node_model(op_type, ["x"], {"x": x}, axis=2), {"x": x})


def test_cost_counts_five_operations_per_element_and_logsoftmax_one_log_per_row():
    softmax = node_cost("Softmax", [(4, 10)])
    log_softmax = node_cost("LogSoftmax", [(4, 10)])
    assert softmax.flops == 5 * 40
    assert log_softmax.flops == 5 * 40 + 4
    assert (softmax.bytes_read, softmax.bytes_written, softmax.macs) == (160, 160, 0)


def test_cost_rows_follow_coerce_2d():
    # Opset-11 form on [2, 3, 4, 5] at axis 1: 2 rows of 60; the opset-13 form: 2*4*5 rows of 3.
    old = node_cost("LogSoftmax", [(2, 3, 4, 5)], axis=1, coerce_2d=1)
    new = node_cost("LogSoftmax", [(2, 3, 4, 5)], axis=1)
    assert old.flops == 5 * 120 + 2
    assert new.flops == 5 * 120 + 40
