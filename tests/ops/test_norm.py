"""BatchNormalization and LRN: ONNX Runtime parity, the training form and old-opset forms against numpy,
shape inference with a symbolic batch, cost numbers and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.errors import InvalidModelError
from tests.helpers import make_model, run_onnxruntime
from tests.ops.node_oracle import (
    assert_matches_onnxruntime,
    inferred_shape,
    node_cost,
    node_model,
    run_hetflow,
)

RNG = np.random.default_rng(5)


def _data(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _lrn_reference(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    # ONNX's definition, one channel at a time.
    square_sum = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - math.floor((size - 1) / 2)), min(x.shape[1], c + math.ceil((size - 1) / 2) + 1)
        square_sum[:, c] = np.sum(x[:, lo:hi] ** 2, axis=1)
    return x / (bias + alpha / size * square_sum) ** beta


@pytest.mark.parametrize("size", [1, 3, 5, 9])
@pytest.mark.parametrize("shape", [(3, 7, 5, 9), (2, 3, 4, 5)])
def test_lrn_matches_onnxruntime(shape, size):
    x = _data(*shape) * 3
    assert_matches_onnxruntime("LRN", ["x"], {"x": x}, size=size, alpha=0.02, beta=0.75, bias=1.5, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("size", [2, 4, 5])
def test_lrn_matches_definition_for_even_sizes(size):
    # ONNX Runtime only accepts odd sizes; an even window reaches one channel further up than down.
    x = _data(3, 7, 5, 9) * 3
    model = node_model("LRN", ["x"], {"x": x}, size=size, alpha=0.02, beta=0.5, bias=2.0)
    expected = _lrn_reference(x, size, 0.02, 0.5, 2.0)
    np.testing.assert_allclose(run_hetflow(model, {"x": x}), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 6, 11), (2, 5, 3, 4, 5)])
def test_lrn_other_ranks_match_definition(shape):
    x = _data(*shape, dtype=np.float64)
    model = node_model("LRN", ["x"], {"x": x}, size=3)
    actual = run_hetflow(model, {"x": x})
    assert actual.dtype == np.float64
    np.testing.assert_allclose(actual, _lrn_reference(x, 3, 1e-4, 0.75, 1.0), rtol=1e-12)


def _bn_params(channels: int, dtype: type = np.float32) -> dict[str, np.ndarray]:
    return {
        "scale": _data(channels, dtype=dtype),
        "b": _data(channels, dtype=dtype),
        "mean": _data(channels, dtype=dtype),
        "var": RNG.uniform(0.5, 2.0, channels).astype(dtype),
    }


BN_INPUTS = ["x", "scale", "b", "mean", "var"]


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 7), (3, 5, 7, 9), (2, 3, 4, 5, 6)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_inference_matches_onnxruntime(shape, dtype):
    actual = assert_matches_onnxruntime(
        "BatchNormalization", BN_INPUTS, {"x": _data(*shape, dtype=dtype)}, _bn_params(shape[1], dtype),
        epsilon=1e-3, rtol=1e-5, atol=1e-5,
    )
    assert actual.dtype == dtype


def _bn_training_reference(x, scale, b, mean, var, momentum, epsilon, axes):
    batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
    shape = [1] * x.ndim
    shape[1] = -1
    if len(axes) == 1:
        shape = [1, *x.shape[1:]]
    y = (x - batch_mean.reshape(shape)) / np.sqrt(batch_var.reshape(shape) + epsilon)
    y = y * scale.reshape(shape) + b.reshape(shape)
    return y, mean * momentum + batch_mean * (1 - momentum), var * momentum + batch_var * (1 - momentum)


def _bn_model(outputs: list[str], opset: int, params: dict[str, np.ndarray], x: np.ndarray, **attrs):
    node = helper.make_node("BatchNormalization", BN_INPUTS, outputs, **attrs)
    model = make_model(
        [node], [("x", TensorProto.FLOAT, list(x.shape))],
        [(name, TensorProto.FLOAT, None) for name in outputs if name], params, opset=opset,
    )
    model.ir_version = 7
    return model


def test_batchnorm_training_mode_updates_running_statistics():
    x, params = _data(3, 4, 5, 6), _bn_params(4)
    model = _bn_model(["y", "running_mean", "running_var"], 15, params, x, training_mode=1, momentum=0.7,
                      epsilon=1e-2)
    y, running_mean, running_var = hetflow.InferenceSession(model).run(None, {"x": x})
    expected = _bn_training_reference(x, *params.values(), 0.7, 1e-2, (0, 2, 3))
    for actual, wanted in zip((y, running_mean, running_var), expected):
        assert actual.dtype == np.float32
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-5)


def test_batchnorm_training_mode_with_y_only():
    x, params = _data(2, 3, 5), _bn_params(3)
    (y,) = hetflow.InferenceSession(_bn_model(["y"], 15, params, x, training_mode=1)).run(None, {"x": x})
    expected = _bn_training_reference(x, *params.values(), 0.9, 1e-5, (0, 2))[0]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_batchnorm_opset9_extra_outputs_mean_training():
    # Before opset 14 the outputs chose the mode: Y, mean, var means training.
    x, params = _data(3, 4, 5, 6), _bn_params(4)
    model = _bn_model(["y", "mean_out", "var_out"], 9, params, x, momentum=0.8)
    y, running_mean, running_var = hetflow.InferenceSession(model).run(None, {"x": x})
    expected = _bn_training_reference(x, *params.values(), 0.8, 1e-5, (0, 2, 3))
    for actual, wanted in zip((y, running_mean, running_var), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-5)


def test_batchnorm_opset9_saved_statistics_are_rejected():
    x, params = _data(3, 4, 5), _bn_params(4)
    model = _bn_model(["y", "m", "v", "saved_mean", "saved_var"], 9, params, x)
    with pytest.raises(InvalidModelError, match="saved_mean"):
        hetflow.InferenceSession(model)


def test_batchnorm_opset7_inference_matches_onnxruntime():
    x, params = _data(2, 3, 5, 4), _bn_params(3)
    model = _bn_model(["y"], 7, params, x, spatial=1, epsilon=1e-3)
    np.testing.assert_allclose(
        hetflow.InferenceSession(model).run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0],
        rtol=1e-5, atol=1e-5,
    )


def test_batchnorm_opset7_non_spatial_uses_per_element_statistics():
    x = _data(2, 3, 4, 5)
    params = {name: _data(3, 4, 5) for name in ("scale", "b", "mean")}
    params["var"] = RNG.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32)
    model = _bn_model(["y"], 7, params, x, spatial=0)
    (y,) = hetflow.InferenceSession(model).run(None, {"x": x})
    p = params
    np.testing.assert_allclose(y, (x - p["mean"]) / np.sqrt(p["var"] + 1e-5) * p["scale"] + p["b"], rtol=1e-5,
                               atol=1e-5)
    # Training with spatial=0 reduces over the batch only.
    model = _bn_model(["y", "m", "v"], 7, params, x, spatial=0, momentum=0.5)
    y, running_mean, running_var = hetflow.InferenceSession(model).run(None, {"x": x})
    expected = _bn_training_reference(x, *params.values(), 0.5, 1e-5, (0,))
    for actual, wanted in zip((y, running_mean, running_var), expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("op_type", "inputs", "constants", "attrs"),
    [
        ("LRN", ["x"], {}, {"size": 5}),
        ("BatchNormalization", BN_INPUTS, _bn_params(3), {}),
    ],
)
def test_norm_infers_shapes_with_symbolic_batch(op_type, inputs, constants, attrs):
    x = _data(2, 3, 7, 9)
    model = node_model(op_type, inputs, {"x": x}, constants, shapes={"x": ["N", 3, 7, 9]}, **attrs)
    assert inferred_shape(model) == ("N", 3, 7, 9)
    assert run_hetflow(model, {"x": x}).shape == x.shape


def test_norm_costs():
    elements = 2 * 96 * 55 * 55
    lrn = node_cost("LRN", [(2, 96, 55, 55)], size=5)
    assert lrn.flops == elements * 9
    assert lrn.bytes_read == lrn.bytes_written == elements * 4
    bn = node_cost("BatchNormalization", [(2, 96, 55, 55), (96,), (96,), (96,), (96,)])
    assert bn.flops == elements * 2
    assert bn.bytes_read == (elements + 4 * 96) * 4
    assert bn.bytes_written == elements * 4  # the node has Y only
    training = node_cost("BatchNormalization", [(2, 96, 55, 55), (96,), (96,), (96,), (96,)], training_mode=1)
    assert training.flops == elements * 6


@pytest.mark.parametrize(
    ("constants", "attrs", "message"),
    [
        ({**_bn_params(3), "mean": _data(4)}, {}, "input_mean"),
        (_bn_params(3), {"spatial": 0}, "expected"),
    ],
)
def test_batchnorm_rejects_bad_parameters(constants, attrs, message):
    model = node_model("BatchNormalization", BN_INPUTS, {"x": _data(2, 3, 4)}, constants, **attrs)
    with pytest.raises(InvalidModelError, match=message):
        inferred_shape(model)


def test_batchnorm_extra_outputs_need_training_mode():
    x, params = _data(3, 4, 5), _bn_params(4)
    with pytest.raises(InvalidModelError, match="training_mode"):
        hetflow.InferenceSession(_bn_model(["y", "m", "v"], 15, params, x))


def test_lrn_requires_size():
    model = node_model("LRN", ["x"], {"x": _data(1, 3, 4, 4)})
    with pytest.raises(InvalidModelError, match="size"):
        inferred_shape(model)
