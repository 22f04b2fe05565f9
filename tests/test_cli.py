"""The ``hetflow`` command, driven through ``cli.main`` as a user would."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetflow.cli import main
from tests.helpers import add_relu_model, make_model


@pytest.fixture
def classifier_path(tmp_path):
    """A 2-class softmax classifier over 4 features, saved to disk."""
    weights = np.array([[1.0, -1.0], [0.5, 0.5], [-1.0, 1.0], [0.0, 2.0]], np.float32)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"])],
        [("x", TensorProto.FLOAT, ["N", 4])],
        [("p", TensorProto.FLOAT, ["N", 2])],
        {"w": weights},
    )
    path = tmp_path / "classifier.onnx"
    onnx.save(model, str(path))
    return path


def test_run_prints_outputs_latency_and_op_share(classifier_path, capsys):
    assert main(["run", str(classifier_path), "--batch", "3", "--repeat", "4"]) == 0
    out = capsys.readouterr().out
    assert "input   x: tensor(float) [3, 4]" in out
    assert "output  p: tensor(float) [3, 2]" in out
    assert out.count("top-5") == 3
    assert "over 4 runs (batch 3)" in out
    assert "MatMul" in out and "Softmax" in out and "%" in out


def test_run_with_an_input_file_prints_its_values(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(path))
    x = np.array([[-3.0, 0.0, 1.5]], np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "[0.  1.  2.5]" in out


def test_run_with_a_wrongly_shaped_input_file_fails_cleanly(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_relu_model(), str(path))
    np.save(tmp_path / "x.npy", np.zeros((2, 5), np.float32))
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}"]) == 1
    assert "expected [N, 3]" in capsys.readouterr().err


def test_info_reports_inputs_ops_and_parameters(classifier_path, capsys):
    assert main(["info", str(classifier_path)]) == 0
    out = capsys.readouterr().out
    assert "input   x: tensor(float) [N, 4]" in out
    assert "params  8 " in out
    assert "MatMul" in out and "Softmax" in out


def test_missing_model_is_an_error_exit(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.onnx")]) == 1
    assert "not found" in capsys.readouterr().err


def test_profile_lists_every_node_with_its_device_and_time(classifier_path, capsys):
    import json

    assert main(["profile", str(classifier_path), "--batch", "2", "--repeat", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"] == 2 and report["batch"] == 2
    nodes = {r["op_type"]: r for r in report["nodes"]}
    assert set(nodes) == {"MatMul", "Softmax"}
    assert all(r["device"] == "cpu" and r["calls"] == 2 and r["seconds"] > 0 for r in nodes.values())
    assert all(r["copied_bytes"] == 0 for r in nodes.values())  # the CPU copies nothing


def test_profile_table_and_bad_placement_spec(classifier_path, capsys):
    assert main(["profile", str(classifier_path), "--placement", "MatMul=cpu", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "per device:" in out and "MatMul" in out
    assert main(["profile", str(classifier_path), "--placement", "MatMul"]) == 1
    assert "NODE_OR_OP=DEVICE" in capsys.readouterr().err


def test_session_reports_tuning_cache_use(classifier_path):
    import hetflow

    session = hetflow.InferenceSession(str(classifier_path))
    report = session.tuning_report()
    assert set(report["algorithms"]) == {"hits", "misses", "measured"}
    assert all(count >= 0 for count in report["algorithms"].values())
