"""Real data, real accuracy: LeNet trained from scratch on scikit-learn's digits (the ``zoo:lenet-digits``
demo, built once per test session by training), checked on the held-out split with hetflow and ONNX
Runtime, and the ``hetflow train`` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import hetflow
from hetflow import zoo
from hetflow.cli import main
from hetflow.train.data import load_digits
from hetflow.zoo.demos import sample_digits


@pytest.fixture(scope="module")
def trained_path(zoo_home: Path) -> Path:
    return zoo.model_path("lenet-digits")  # trains on first use (8 epochs), then cached


def test_lenet_trained_from_scratch_reaches_97_percent(trained_path: Path) -> None:
    data = load_digits()
    session = hetflow.InferenceSession(trained_path)
    (probabilities,) = session.run(None, {"data": data.x_test})
    accuracy = float(np.mean(probabilities.argmax(axis=1) == data.y_test))
    assert len(data.y_test) >= 350
    assert accuracy >= 0.97, f"test accuracy {accuracy:.4f}"


def test_trained_model_agrees_with_onnx_runtime(trained_path: Path) -> None:
    data = load_digits()
    ours = hetflow.InferenceSession(trained_path).run(None, {"data": data.x_test})[0]
    theirs = ort.InferenceSession(str(trained_path), providers=["CPUExecutionProvider"]).run(
        None, {"data": data.x_test}
    )[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * float(np.abs(theirs).max()))


def test_run_shows_real_predictions(
    trained_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    images, labels = sample_digits(4)
    path = tmp_path / "digits.npy"
    np.save(path, images)
    assert main(["run", "zoo:lenet-digits", "--input", str(path), "--repeat", "1"]) == 0
    printed = capsys.readouterr().out
    predicted = [
        int(line.split("(class:score) ")[1].split(":")[0]) for line in printed.splitlines() if "top-5" in line
    ]
    assert len(predicted) == 4
    # NOTE: ~98% accurate, so one miss in four real digits is possible; chance would be 0.4 hits.
    assert sum(p == int(label) for p, label in zip(predicted, labels)) >= 3, (predicted, labels)


def test_run_without_input_shows_real_digits_and_their_labels(
    trained_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["run", "zoo:lenet-digits", "--repeat", "1"]) == 0
    printed = capsys.readouterr().out
    assert "input   data: tensor(float) [8, 1, 28, 28]" in printed
    [predicted_line] = [line for line in printed.splitlines() if "predicted" in line]
    [true_line] = [line for line in printed.splitlines() if line.strip().startswith("true")]
    predicted = [int(v) for v in predicted_line.split("predicted")[1].split()]
    true = [int(v) for v in true_line.split("true")[1].split("(")[0].split()]
    _, labels = sample_digits(8)
    assert true == [int(label) for label in labels]  # the held-out digits, in order
    hits = sum(p == t for p, t in zip(predicted, true))
    assert f"({hits}/8 correct)" in true_line
    assert hits >= 6  # ~98% accurate on real digits; chance would be under 1 in 8


def test_train_command_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "trained.onnx"
    assert main(["train", "zoo:lenet", "--data", "digits", "--epochs", "1", "--out", str(out), "--json"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = json.loads(last)
    assert set(summary) == {"epochs", "seconds", "train_loss", "test_accuracy"}
    assert summary["epochs"] == 1 and summary["seconds"] > 0
    assert summary["test_accuracy"] > 0.5  # one epoch from random weights: far above chance (0.1)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert session.run(None, {"data": load_digits().x_test[:2]})[0].shape == (2, 10)
