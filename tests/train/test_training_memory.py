"""``hetflow estimate --train``: the predicted training memory is what a step of the trainer measures."""

from __future__ import annotations

import json

import pytest

from hetflow.cli import main
from hetflow.estimate.training import training_memory
from hetflow.train import Adam, Trainer
from tests.train.test_trainer import deep_cnn, separable_data


def test_prediction_equals_the_measured_step() -> None:
    model = deep_cnn()
    report = training_memory(model, batch=16, optimizer="adam")
    trainer = Trainer(model, optimizer=Adam(0.01))
    x, y = separable_data()
    trainer.train_step(x[:16], y[:16])
    state = sum(a.nbytes for slots in trainer.optimizer.state.values() for k, a in slots.items() if k != "t")
    assert report.optimizer_state == state
    assert report.gradients == sum(p.nbytes for p in trainer.params.values())
    assert report.step_peak == trainer.tape.peak_bytes
    assert report.total == trainer.fixed_bytes() + trainer.tape.peak_bytes
    assert report.activations + report.activation_gradients == report.step_peak
    assert report.recomputed_total < report.total


def test_estimate_train_command(capsys: pytest.CaptureFixture) -> None:
    assert (
        main(["estimate", "zoo:lenet", "--train", "--batch", "8", "--optimizer", "momentum", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["batch"] == 8 and report["optimizer"] == "momentum"
    assert (
        report["optimizer_state"] == report["gradients"] == report["weights"]
    )  # LeNet: every initializer learns
    assert report["total"] > report["weights"]
    assert main(["estimate", "zoo:lenet", "--train", "--batch", "8"]) == 0
    assert "activations kept for backward" in capsys.readouterr().out
