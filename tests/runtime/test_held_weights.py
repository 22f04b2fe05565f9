"""Large fully connected weights held once, as the dense kernel's panels (``runtime.held_weights``)."""

from __future__ import annotations

import os
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hetflow.devices.cpu.kernels import dense
from hetflow.frontends import onnx_lean
from hetflow.frontends.onnx_import import import_onnx
from hetflow.frontends.onnx_lean import file_origin
from hetflow.runtime.session import InferenceSession
from tests.helpers import run_onnxruntime

RNG = np.random.default_rng(5)
#: Past this (a test's limit) 800 -> 500 weights (1.6 MB) are large; 500 -> 10 ones stay small.
LIMIT = 1 << 20


@pytest.fixture(autouse=True)
def _small_limit(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dense, "HELD_PACKED_BYTES", LIMIT)


def _fc_model(trans_b: bool) -> onnx.ModelProto:
    """x [N, 800] -> Gemm 800 -> 500 + bias -> Relu -> Gemm 500 -> 10."""
    w1 = RNG.standard_normal((500, 800)).astype(np.float32) / 28
    initializers = [
        numpy_helper.from_array(w1 if trans_b else np.ascontiguousarray(w1.T), "w1"),
        numpy_helper.from_array(RNG.standard_normal(500).astype(np.float32), "b1"),
        numpy_helper.from_array(RNG.standard_normal((10, 500)).astype(np.float32) / 22, "w2"),
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=int(trans_b)),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1),
    ]
    graph = helper.make_graph(nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 800])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _saved(model: onnx.ModelProto, folder: Path) -> Path:
    path = folder / "fc.onnx"
    onnx.save(model, path)
    return path


def _read_arrays(monkeypatch) -> dict[tuple[int, ...], weakref.ref]:  # noqa: ANN001
    """Weak references to the arrays read from model files from now on, by shape."""
    found: dict[tuple[int, ...], weakref.ref] = {}
    original = onnx_lean._remember

    def remember(array: np.ndarray, origin: onnx_lean.FileOrigin) -> None:
        found[array.shape] = weakref.ref(array)
        original(array, origin)

    monkeypatch.setattr(onnx_lean, "_remember", remember)
    return found


def _check_outputs(session: InferenceSession, model: onnx.ModelProto) -> None:
    for batch in (1, 2, 16):
        x = RNG.standard_normal((batch, 800)).astype(np.float32)
        want = run_onnxruntime(model, {"x": x})[0]
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("trans_b", [True, False], ids=["transB", "B"])
def test_a_large_weight_read_from_a_file_is_held_only_as_panels(monkeypatch, tmp_path, trans_b: bool) -> None:  # noqa: ANN001
    model = _fc_model(trans_b)
    raw = numpy_helper.to_array(model.graph.initializer[0])
    read = _read_arrays(monkeypatch)
    session = InferenceSession(_saved(model, tmp_path), threads=2)
    mapped = session.graph.initializers["w1"]
    assert isinstance(mapped, np.memmap)
    assert read[raw.shape]() is None  # the raw array read from the file is gone
    np.testing.assert_array_equal(mapped, raw)  # the graph still reads the weights' values
    assert not isinstance(session.graph.initializers["w2"], np.memmap)  # small: its raw array stays
    assert dense.PANELS.get(mapped, int(trans_b)).size == 8 * 64 * 800  # packed when the session was made
    _check_outputs(session, model)


def test_a_large_weight_given_in_memory_keeps_its_raw_array(tmp_path) -> None:  # noqa: ANN001
    model = _fc_model(trans_b=True)
    session = InferenceSession(model, threads=2)
    assert not isinstance(session.graph.initializers["w1"], np.memmap)
    _check_outputs(session, model)


def test_a_memory_budget_keeps_the_weights_it_plans(tmp_path) -> None:  # noqa: ANN001
    model = _fc_model(trans_b=True)
    session = InferenceSession(_saved(model, tmp_path), threads=2, memory_budget="64MB")
    assert not isinstance(session.graph.initializers["w1"], np.memmap)
    _check_outputs(session, model)


def test_a_file_changed_after_reading_gives_no_origin(tmp_path) -> None:  # noqa: ANN001
    path = _saved(_fc_model(trans_b=True), tmp_path)
    graph = import_onnx(path)
    weight = graph.initializers["w1"]
    origin = file_origin(weight)
    assert origin is not None and origin.path == path.resolve()
    np.testing.assert_array_equal(origin.rows(weight, 3, 9), weight[3:9])
    assert file_origin(weight.copy()) is None  # not read from a file
    assert file_origin(graph.initializers["b1"]) is None  # too small to be read from the file apart
    os.utime(path, ns=(0, 0))
    assert file_origin(weight) is None


def test_a_held_weight_never_falls_back_to_its_mapped_raw_array(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """An A the dense kernel cannot read in place (here a Fortran-ordered feed) is copied: BLAS on the
    raw weights, a mapping of the file that is often unaligned, would run without BLAS's kernels."""
    model = _fc_model(trans_b=True)
    session = InferenceSession(_saved(model, tmp_path), threads=2)
    odd_inputs: list[bool] = []
    original = dense.DenseCall.__call__

    def call(self, arrays):  # noqa: ANN001, ANN202
        if self.held:
            odd_inputs.append(not arrays[0].flags.c_contiguous)
            self.fallback = None  # calling it would fail the test
        return original(self, arrays)

    monkeypatch.setattr(dense.DenseCall, "__call__", call)
    for batch in (1, 16):
        x = np.asfortranarray(RNG.standard_normal((batch, 800)).astype(np.float32))
        want = run_onnxruntime(model, {"x": np.ascontiguousarray(x)})[0]
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)
    assert True in odd_inputs  # the batch's feed reached the held layer as it was
