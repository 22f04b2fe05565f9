"""Activations: values against ONNX Runtime, dtypes, shapes with a symbolic batch, traits and cost."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hetflow.errors import InvalidModelError
from hetflow.ops import registry
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(7)
ODD_SHAPE = (3, 5, 7)


def _data(shape: tuple[int, ...], dtype: type = np.float32, scale: float = 3.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [("Relu", {}), ("LeakyRelu", {}), ("LeakyRelu", {"alpha": 0.2}), ("Sigmoid", {}), ("Tanh", {})],
)
def test_unary_activations_match_onnxruntime(op_type, attrs):
    x = _data(ODD_SHAPE)
    assert_matches_onnxruntime(op_type, ["x"], {"x": x}, **attrs)


NUMPY_REFERENCES = {
    "Relu": lambda x: np.maximum(x, 0),
    "LeakyRelu": lambda x: np.where(x < 0, 0.01 * x, x),
    "Sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "Tanh": np.tanh,
}


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("op_type", sorted(NUMPY_REFERENCES))
def test_unary_activations_keep_other_float_dtypes(op_type, dtype):
    # NOTE: ONNX Runtime lacks several of these kernels for float64/float16, so numpy is the oracle.
    x = _data(ODD_SHAPE, dtype)
    y = run_hetflow(node_model(op_type, ["x"], {"x": x}), {"x": x})
    assert y.dtype == dtype and y.shape == x.shape
    expected = NUMPY_REFERENCES[op_type](x.astype(np.float64))
    tolerance = 2e-3 if dtype == np.float16 else 1e-12
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=tolerance, atol=tolerance)


def test_leaky_relu_default_alpha_is_001():
    x = np.array([-100.0, -1.0, 0.0, 2.0], np.float32)
    model = node_model("LeakyRelu", ["x"], {"x": x})
    np.testing.assert_allclose(run_hetflow(model, {"x": x}), [-1.0, -0.01, 0.0, 2.0], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_is_stable_for_large_magnitudes(dtype):
    x = np.array([-1e4, -1000.0, -80.0, -1.0, 0.0, 1.0, 80.0, 1000.0, 1e4], dtype)
    model = node_model("Sigmoid", ["x"], {"x": x})
    with warnings.catch_warnings(), np.errstate(over="raise", invalid="raise", divide="raise"):
        warnings.simplefilter("error")
        y = run_hetflow(model, {"x": x})
    assert y.dtype == dtype
    assert np.all(np.isfinite(y))
    reference = 1.0 / (1.0 + np.exp(-x.astype(np.float64).clip(-700, 700)))
    np.testing.assert_allclose(y.astype(np.float64), reference, rtol=1e-3, atol=1e-7)
    assert y[0] == 0.0 and y[-1] == 1.0 and y[4] == dtype(0.5)


def test_sigmoid_propagates_nan():
    x = np.array([np.nan, 1.0], np.float32)
    y = run_hetflow(node_model("Sigmoid", ["x"], {"x": x}), {"x": x})
    assert np.isnan(y[0]) and np.isclose(y[1], 1 / (1 + np.exp(-1)))


@pytest.mark.parametrize(
    ("x_shape", "slope_shape"),
    [((2, 3, 4, 5), (3, 1, 1)), ((2, 3, 4, 5), (5,)), ((2, 3, 4, 5), (1,)), ((7, 3), (7, 3)), ((3, 5), ())],
)
def test_prelu_broadcasts_slope_like_onnxruntime(x_shape, slope_shape):
    x = _data(x_shape)
    slope = RNG.uniform(0.05, 0.5, slope_shape).astype(np.float32)
    assert_matches_onnxruntime("PRelu", ["x", "slope"], {"x": x}, {"slope": slope})


def test_prelu_slope_as_graph_input():
    x, slope = _data((4, 6)), RNG.uniform(0, 1, (6,)).astype(np.float32)
    assert_matches_onnxruntime("PRelu", ["x", "slope"], {"x": x, "slope": slope})


def test_prelu_rejects_slope_that_does_not_broadcast_to_x():
    x = _data((2, 3, 4, 5))
    model = node_model("PRelu", ["x", "slope"], {"x": x}, {"slope": np.ones((4,), np.float32)})
    with pytest.raises(InvalidModelError, match="slope of shape \\[4\\] does not broadcast"):
        run_hetflow(model, {"x": x})


def test_prelu_rejects_slope_that_would_grow_x():
    x = _data((3, 5))
    model = node_model("PRelu", ["x", "slope"], {"x": x}, {"slope": np.ones((2, 3, 5), np.float32)})
    with pytest.raises(InvalidModelError, match="does not broadcast"):
        run_hetflow(model, {"x": x})


@pytest.mark.parametrize(
    ("inputs", "bounds"),
    [
        (["x", "lo", "hi"], {"lo": -1.5, "hi": 2.0}),
        (["x", "lo"], {"lo": 0.25}),
        (["x", "", "hi"], {"hi": 0.5}),
        (["x"], {}),
        (["x", "lo", "hi"], {"lo": 2.0, "hi": -1.0}),  # min > max: every element is max
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int8, np.int64])
def test_clip_matches_onnxruntime(inputs, bounds, dtype):
    # Integer data spans about +-40 and its bounds are the float bounds times 10.
    scale = 10 if np.dtype(dtype).kind == "i" else 1
    x = _data(ODD_SHAPE, np.float64, scale=4.0 * scale).astype(dtype)
    constants = {name: np.array(value * scale, dtype) for name, value in bounds.items()}
    assert_matches_onnxruntime("Clip", inputs, {"x": x}, constants, atol=0)


def test_clip_bounds_fed_at_run_time():
    x = _data(ODD_SHAPE)
    hi = np.array(1.0, np.float32)
    assert_matches_onnxruntime("Clip", ["x", "", "hi"], {"x": x, "hi": hi})


@pytest.mark.parametrize("attrs", [{"min": -0.5, "max": 0.5}, {"max": 0.5}, {"min": -0.5}, {}])
def test_clip_opset10_attributes_become_inputs(attrs):
    x = _data(ODD_SHAPE)
    assert_matches_onnxruntime("Clip", ["x"], {"x": x}, opset=10, **attrs)


def test_clip_opset10_keeps_float64_data_dtype():
    x = _data((4, 3), np.float64)
    y = run_hetflow(node_model("Clip", ["x"], {"x": x}, opset=10, max=0.5), {"x": x})
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, np.minimum(x, 0.5))


def test_clip_rejects_non_scalar_bounds():
    x = _data((4, 3))
    model = node_model("Clip", ["x", "lo"], {"x": x}, {"lo": np.zeros((3,), np.float32)})
    with pytest.raises(InvalidModelError, match="min must be a scalar"):
        run_hetflow(model, {"x": x})


@pytest.mark.parametrize("op_type", ["Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "PRelu"])
def test_activations_are_fusable_elementwise(op_type):
    traits = registry.get(op_type).traits
    assert {"fusable", "elementwise"} <= traits


@pytest.mark.parametrize(
    ("op_type", "extra"),
    [
        ("Relu", {}),
        ("LeakyRelu", {}),
        ("Sigmoid", {}),
        ("Tanh", {}),
        ("Clip", {"hi": np.array(6.0, np.float32)}),
        ("PRelu", {"slope": np.full((3, 1, 1), 0.1, np.float32)}),
    ],
)
def test_symbolic_batch_passes_through(op_type, extra):
    x = _data((2, 3, 4, 4))
    inputs = ["x", *extra] if op_type != "Clip" else ["x", "", "hi"]
    model = node_model(op_type, inputs, {"x": x}, extra, shapes={"x": ["N", 3, 4, 4]})
    assert inferred_shape(model) == ("N", 3, 4, 4)


@pytest.mark.parametrize(
    ("op_type", "per_element"), [("Relu", 1), ("LeakyRelu", 2), ("Sigmoid", 3), ("Tanh", 1)]
)
def test_unary_cost(op_type, per_element):
    cost = node_cost(op_type, [(2, 3, 5)])
    assert cost.flops == per_element * 30
    assert (cost.bytes_read, cost.bytes_written, cost.macs) == (120, 120, 0)


def test_clip_cost_counts_present_bounds_and_reads_them():
    one_bound = node_cost("Clip", [(4, 5), None, ()])
    both = node_cost("Clip", [(4, 5), (), ()])
    assert one_bound.flops == 20 and both.flops == 40
    assert both.bytes_read == 80 + 4 + 4 and both.bytes_written == 80


def test_prelu_cost_reads_the_slope():
    cost = node_cost("PRelu", [(2, 3, 4, 4), (3, 1, 1)])
    assert cost.flops == 2 * 96
    assert cost.bytes_read == 96 * 4 + 3 * 4 and cost.bytes_written == 96 * 4
