"""The ``hetflow`` command, driven through ``cli.main`` as a user would."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hetflow.cli import main
from tests.devices.conftest import opencl  # noqa: F401  (skips where no OpenCL platform exists)
from tests.helpers import add_relu_model, make_model, prelu_softmax_model


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


def test_profile_says_which_nodes_a_captured_run_replays(capsys):
    assert main(["profile", "zoo:lenet", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "captured runs: 8 nodes replayed from compiled code" in out and "called from Python: none" in out


def test_compile_writes_a_package_that_hetflow_lite_runs_to_the_sessions_outputs(tmp_path, capsys):
    import hetflow
    from hetflow_lite import CompiledSession

    folder = tmp_path / "lenet-b1"
    assert main(["compile", "zoo:lenet", "-o", str(folder), "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {folder}" in out and " jobs, " in out and "output  prob1: float32 [1, 10]" in out
    assert main(["run", str(folder), "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "jobs, hetflow_lite" in out and "output  prob1: tensor(float) [1, 10]" in out and "over 2 runs" in out
    lite = CompiledSession(folder)
    x = np.random.default_rng(3).standard_normal((1, 1, 28, 28)).astype(np.float32)
    expected = hetflow.InferenceSession("zoo:lenet", threads=1).run(None, {"data": x})[0]
    np.testing.assert_allclose(lite.run(None, {"data": x})[0], expected, rtol=1e-5, atol=1e-6)


def test_compile_of_a_model_it_cannot_capture_is_an_error_exit(tmp_path, capsys):
    model_path = tmp_path / "prelu.onnx"
    onnx.save(prelu_softmax_model(), model_path)
    assert main(["compile", str(model_path), "-o", str(tmp_path / "package"), "--threads", "1"]) == 1
    assert "still run from Python" in capsys.readouterr().err


def test_session_reports_tuning_cache_use(classifier_path):
    import hetflow

    session = hetflow.InferenceSession(str(classifier_path))
    report = session.tuning_report()
    assert set(report["algorithms"]) == {"hits", "misses", "measured"}
    assert all(count >= 0 for count in report["algorithms"].values())


@pytest.fixture
def digits_classifier_path(tmp_path):
    """Softmax regression over the digits' 1x28x28 pixels: trains in a fraction of a second."""
    weights = np.random.default_rng(0).standard_normal((784, 10)).astype(np.float32) * 0.01
    model = make_model(
        [
            helper.make_node("Flatten", ["data"], ["flat"]),
            helper.make_node("Gemm", ["flat", "w", "b"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["prob"]),
        ],
        [("data", TensorProto.FLOAT, ["N", 1, 28, 28])],
        [("prob", TensorProto.FLOAT, ["N", 10])],
        {"w": weights, "b": np.zeros(10, np.float32)},
    )
    path = tmp_path / "digits_classifier.onnx"
    onnx.save(model, str(path))
    return path


def _train(path, device, capsys):
    pytest.importorskip("sklearn")
    import json

    argv = ["train", str(path), "--epochs", "1", "--batch-size", "128", "--lr", "0.01", "--device", device, "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(out[-1])
    assert summary["epochs"] == 1 and summary["test_accuracy"] > 0.5  # chance is 0.1
    return out


def test_train_runs_on_the_device_named(digits_classifier_path, capsys):
    out = _train(digits_classifier_path, "cpu", capsys)
    assert any(line.startswith(f"trained {digits_classifier_path} on digits with cpu in") for line in out)


@pytest.mark.usefixtures("opencl")
def test_train_on_opencl(digits_classifier_path, capsys):
    out = _train(digits_classifier_path, "opencl:0", capsys)
    assert any(" on digits with opencl:0 in " in line for line in out), out
