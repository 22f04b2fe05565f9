"""ONNX's own node test cases (built in memory from the installed onnx package) through hetflow.

Every case whose nodes all use ops hetflow defines is run; the expected outputs are the ones the onnx
package computes with its reference implementation. Cases that cannot pass for a documented reason
are listed in ``EXCLUDED`` with that reason.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

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


SUPPORTED_CASES = sorted(
    (c for c in _ALL_CASES if _uses_only_supported_ops(c)), key=lambda c: c.name
)


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
        outputs = rep.run(inputs)
        assert len(outputs) == len(expected_outputs)
        for expected, actual in zip(expected_outputs, outputs):
            _assert_matches(np.asarray(expected), np.asarray(actual), case.rtol, case.atol)


def test_every_op_is_covered_by_the_suite() -> None:
    covered = {n.op_type for c in SUPPORTED_CASES for n in c.model.graph.node}
    uncovered = sorted(set(registry.registered_ops()) - covered)
    assert not uncovered, f"ops with no ONNX node test case run: {uncovered}"
