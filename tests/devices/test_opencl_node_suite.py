"""ONNX's own node test cases through the OpenCL device: every case whose ops all have an OpenCL
kernel runs with ``device="opencl:0"`` and must match the onnx package's reference outputs. Nodes a
kernel's ``supports`` turns down (integer Add, 3-D pools, training-mode BatchNormalization ...) run on
the CPU fallback; most cases run on the OpenCL device alone, which one test counts."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import hetflow

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from onnx.backend.test.case.node import collect_testcases

    _ALL_CASES = collect_testcases(None)


def _opencl_ops() -> set[str]:
    from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

    if OpenCLDevice.is_available() is not None:
        return set()
    return set(get_opencl_device(0).kernels.op_types())


OPS = _opencl_ops()


def _selected(case) -> bool:
    graph = case.model.graph
    types = {node.op_type for node in graph.node}
    tensors = all(v.type.WhichOneof("value") == "tensor_type" for v in [*graph.input, *graph.output])
    return tensors and bool(types & OPS) and types <= OPS | {"Constant"}


CASES = sorted((c for c in _ALL_CASES if _selected(c)), key=lambda c: c.name)


def _as_array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case_on_opencl(opencl, case) -> None:
    session = hetflow.InferenceSession(case.model, device="opencl:0")
    for inputs, expected_outputs in case.data_sets:
        feeds = {arg.name: _as_array(x) for arg, x in zip(session.get_inputs(), inputs)}
        outputs = session.run(None, feeds)
        assert len(outputs) == len(expected_outputs)
        for expected, actual in zip(expected_outputs, outputs):
            expected = _as_array(expected)
            assert actual.shape == expected.shape and actual.dtype == expected.dtype
            # float32 kernels against a float64-computed reference: at least 1e-4 relative.
            rtol, atol = max(case.rtol, 1e-4), max(case.atol, 1e-5)
            np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def test_most_cases_run_on_opencl_alone(opencl) -> None:
    alone = [c.name for c in CASES if set(hetflow.InferenceSession(c.model, device="opencl:0").placement().values())
             == {"opencl:0"}]  # fmt: skip
    assert len(alone) >= 150, f"only {len(alone)} of {len(CASES)} node cases ran on opencl:0 alone"
