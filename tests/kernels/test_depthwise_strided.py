"""Strided depthwise Conv (the phase-plane method) against ONNX Runtime: strides per axis, dilations,
asymmetric pads, channel multipliers, batch > 1, odd sizes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from tests.helpers import make_model, run_onnxruntime

CASES = [
    # x shape, multiplier, strides, dilations, pads, kernel
    ((2, 6, 13, 11), 2, (2, 2), (1, 1), (1, 0, 2, 1), 3),
    ((1, 4, 9, 10), 1, (2, 1), (2, 1), (1, 1, 1, 1), 3),
    ((1, 3, 12, 12), 1, (3, 3), (1, 1), (0, 0, 0, 0), 5),
    ((2, 5, 7, 9), 1, (1, 2), (1, 1), (2, 2, 0, 1), 3),
    ((1, 8, 4, 4), 1, (2, 2), (1, 1), (1, 1, 1, 1), 3),
]


@pytest.mark.parametrize(("x_shape", "multiplier", "strides", "dilations", "pads", "kernel"), CASES)
def test_strided_depthwise_matches_onnxruntime(x_shape, multiplier, strides, dilations, pads, kernel):
    rng = np.random.default_rng(sum(x_shape))
    channels = x_shape[1]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((channels * multiplier, 1, kernel, kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=channels, strides=list(strides),
                            dilations=list(dilations), pads=list(pads), kernel_shape=[kernel, kernel])
    model = make_model([node], [("x", TensorProto.FLOAT, list(x_shape))], [("y", TensorProto.FLOAT, None)],
                       {"w": w})
    session = hetflow.InferenceSession(model)
    assert [step.kernel.algorithm for step in session.plan.steps] == ["depthwise"]
    [expected] = run_onnxruntime(model, {"x": x})
    [got] = session.run(None, {"x": x})
    assert got.shape == expected.shape
    assert float(np.abs(got - expected).max()) <= 1e-5 * float(np.abs(expected).max())
