"""ONNX's own node test cases (built in memory from the installed onnx package) through hetflow.

Every case whose nodes all use ops hetflow defines is run; the expected outputs are the ones the onnx
package computes with its reference implementation. Cases that cannot pass for a documented reason
are listed in ``EXCLUDED`` with that reason.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from hetflow import backend
from hetflow.ops import registry

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from onnx.backend.test.case.node import collect_testcases

    _ALL_CASES = collect_testcases(None)

#: case name -> why hetflow does not run it.
EXCLUDED: dict[str, str] = {}


def _uses_only_supported_ops(case) -> bool:
    return all(
        node.op_type == "Constant" or registry.lookup(node.op_type, node.domain) is not None
        for node in case.model.graph.node
    )


def _uses_only_tensors(case) -> bool:
    """hetflow's IR holds tensors only; cases about sequence or optional types test those types."""
    graph = case.model.graph
    return all(v.type.WhichOneof("value") == "tensor_type" for v in [*graph.input, *graph.output])


SUPPORTED_CASES = sorted(
    (c for c in _ALL_CASES if _uses_only_supported_ops(c) and _uses_only_tensors(c)), key=lambda c: c.name
)
NON_TENSOR_CASES = sorted(
    c.name for c in _ALL_CASES if _uses_only_supported_ops(c) and not _uses_only_tensors(c)
)


def _as_array(value) -> np.ndarray:
    # Cases about types numpy lacks (float8, int4 ...) carry TensorProtos instead of arrays.
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def _assert_matches(expected: np.ndarray, actual: np.ndarray, rtol: float, atol: float) -> None:
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if expected.dtype.kind in "OSU":
        assert actual.tolist() == expected.tolist()
        return
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("case", SUPPORTED_CASES, ids=[c.name for c in SUPPORTED_CASES])
def test_node_case(case) -> None:
    if case.name in EXCLUDED:
        pytest.skip(EXCLUDED[case.name])
    rep = backend.prepare(case.model)
    for inputs, expected_outputs in case.data_sets:
        outputs = rep.run([_as_array(x) for x in inputs])
        assert len(outputs) == len(expected_outputs)
        for expected, actual in zip(expected_outputs, outputs):
            _assert_matches(_as_array(expected), np.asarray(actual), case.rtol, case.atol)


def test_only_sequence_and_optional_cases_are_left_out() -> None:
    assert all("sequence" in name or "_opt" in name for name in NON_TENSOR_CASES), NON_TENSOR_CASES


def test_every_op_is_covered_by_the_suite() -> None:
    covered = {n.op_type for c in SUPPORTED_CASES for n in c.model.graph.node}
    uncovered = sorted(set(registry.registered_ops()) - covered)
    assert not uncovered, f"ops with no ONNX node test case run: {uncovered}"
