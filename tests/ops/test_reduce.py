"""ReduceMean: ONNX Runtime parity (constant and run-time axes, old opsets), integers, shapes, cost."""

from __future__ import annotations

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

RNG = np.random.default_rng(5)
SHAPE = (3, 5, 7)


def _data(shape: tuple[int, ...] = SHAPE, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def _axes(*axes: int) -> np.ndarray:
    return np.array(axes, np.int64)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [None, (), (0,), (1,), (2,), (-1,), (0, 2), (2, 0), (-3, -2, -1)])
def test_constant_axes_match_onnxruntime(axes, keepdims):
    x = _data()
    inputs = ["x"] if axes is None else ["x", "axes"]
    constants = {} if axes is None else {"axes": _axes(*axes)}
    assert_matches_onnxruntime("ReduceMean", inputs, {"x": x}, constants, keepdims=keepdims)


@pytest.mark.parametrize("axes", [None, ()])
def test_noop_with_empty_axes_is_identity(axes):
    x = _data()
    inputs = ["x"] if axes is None else ["x", "axes"]
    constants = {} if axes is None else {"axes": _axes(*axes)}
    y = assert_matches_onnxruntime(
        "ReduceMean", inputs, {"x": x}, constants, noop_with_empty_axes=1, keepdims=0
    )
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [(1,), (0, 2), ()])
def test_axes_fed_at_run_time(axes, keepdims):
    x, axes_value = _data(), _axes(*axes)
    feeds = {"x": x, "axes": axes_value}
    assert_matches_onnxruntime("ReduceMean", ["x", "axes"], feeds, keepdims=keepdims)


def test_run_time_axes_give_symbolic_dims_of_the_right_rank():
    feeds = {"x": _data(), "axes": _axes(1)}
    kept = inferred_shape(node_model("ReduceMean", ["x", "axes"], feeds))
    dropped = inferred_shape(node_model("ReduceMean", ["x", "axes"], feeds, keepdims=0))
    assert len(kept) == 3 and all(isinstance(d, str) for d in kept)
    assert len(dropped) == 2 and all(isinstance(d, str) for d in dropped)


def test_run_time_axes_of_unknown_length_without_keepdims_is_rejected():
    feeds = {"x": _data(), "axes": _axes(1)}
    model = node_model("ReduceMean", ["x", "axes"], feeds, shapes={"axes": ["A"]}, keepdims=0)
    with pytest.raises(InvalidModelError, match="constant axes or axes of static length"):
        run_hetflow(model, feeds)


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("axes", [None, (1,), (0, -1)])
def test_opset13_axes_attribute(axes, keepdims):
    x = _data()
    attrs = {"keepdims": keepdims} if axes is None else {"keepdims": keepdims, "axes": list(axes)}
    assert_matches_onnxruntime("ReduceMean", ["x"], {"x": x}, opset=13, **attrs)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("axes", [(1,), (0, 2), None])
def test_integer_means_truncate_toward_zero(dtype, axes):
    x = RNG.integers(-50, 50, SHAPE).astype(dtype)
    inputs = ["x"] if axes is None else ["x", "axes"]
    constants = {} if axes is None else {"axes": _axes(*axes)}
    y = run_hetflow(node_model("ReduceMean", inputs, {"x": x}, constants, keepdims=0), {"x": x})
    assert y.dtype == dtype
    exact = x.astype(np.float64).mean(axis=axes)
    np.testing.assert_array_equal(y, np.trunc(exact).astype(dtype))


def test_int32_matches_onnxruntime():
    x = RNG.integers(-1000, 1000, SHAPE).astype(np.int32)
    assert_matches_onnxruntime("ReduceMean", ["x", "axes"], {"x": x}, {"axes": _axes(1)}, atol=0)


def test_integer_sum_does_not_wrap_in_the_data_type():
    x = np.full((4, 3), 2**30, np.int32)
    y = run_hetflow(node_model("ReduceMean", ["x", "axes"], {"x": x}, {"axes": _axes(0)}), {"x": x})
    np.testing.assert_array_equal(y, [[2**30] * 3])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float_dtypes_are_kept(dtype):
    x = _data((4, 300), dtype)
    y = run_hetflow(node_model("ReduceMean", ["x", "axes"], {"x": x}, {"axes": _axes(1)}), {"x": x})
    assert y.dtype == dtype and y.shape == (4, 1)
    tolerance = 1e-3 if dtype == np.float16 else 1e-12
    expected = x.astype(np.float64).mean(1, keepdims=True)
    np.testing.assert_allclose(y.astype(np.float64), expected, atol=tolerance)


@pytest.mark.parametrize(
    ("axes", "keepdims", "expected"),
    [((1,), 0, ("N", 5)), ((0,), 1, (1, 4, 5)), ((-1,), 1, ("N", 4, 1)), ((), 0, ())],
)
def test_symbolic_batch(axes, keepdims, expected):
    x = _data((2, 4, 5))
    model = node_model(
        "ReduceMean", ["x", "axes"], {"x": x}, {"axes": _axes(*axes)}, shapes={"x": ["N", 4, 5]},
        keepdims=keepdims,
    )
    assert inferred_shape(model) == expected


@pytest.mark.parametrize(
    ("axes", "message"), [((1, 1), "repeat an axis"), ((3,), "axis 3 is out of range for rank 3")]
)
def test_bad_axes_are_rejected(axes, message):
    x = _data()
    model = node_model("ReduceMean", ["x", "axes"], {"x": x}, {"axes": _axes(*axes)})
    with pytest.raises(InvalidModelError, match=message):
        run_hetflow(model, {"x": x})


def test_cost_counts_one_add_per_input_and_one_divide_per_output():
    cost = node_cost("ReduceMean", [SHAPE, (1,)], consts=[None, _axes(1)], keepdims=0)
    assert cost.flops == 105 + 21
    assert cost.bytes_read == 105 * 4 + 8 and cost.bytes_written == 21 * 4
    everything = node_cost("ReduceMean", [SHAPE])
    assert everything.flops == 105 + 1 and everything.bytes_written == 4
    identity = node_cost("ReduceMean", [SHAPE], noop_with_empty_axes=1)
    assert identity.flops == 0 and identity.bytes_written == 105 * 4
