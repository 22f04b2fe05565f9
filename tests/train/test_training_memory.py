"""``hetflow estimate --train``: the predicted training memory is what a step of the trainer measures."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetflow.cli import main
from hetflow.estimate.training import training_memory
from hetflow.train import Adam, Trainer
from tests.train.test_trainer import deep_cnn, separable_data, traced_step


def test_prediction_equals_the_measured_step() -> None:
    model = deep_cnn()
    report = training_memory(model, batch=16, optimizer="adam")
    trainer = Trainer(model, optimizer=Adam(0.01))
    x, y = separable_data()
    trainer.train_step(x[:16], y[:16])
    state = sum(a.nbytes for slots in trainer.optimizer.state.values() for k, a in slots.items() if k != "t")
    assert report.optimizer_state == state
    assert report.gradients == sum(p.nbytes for p in trainer.params.values())
    assert report.tensors_peak == trainer.tape.peak_bytes
    assert report.step_peak == trainer.memory_report(16)["step_bound_bytes"]
    assert report.total == trainer.fixed_bytes() + report.step_peak
    assert report.activations + report.activation_gradients + report.scratch == report.step_peak
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


@pytest.mark.parametrize(
    ("model", "shape"),
    [(deep_cnn(), (16, 3, 9, 9)), ("zoo:lenet", (8, 1, 28, 28)), ("zoo:lstm-gesture", (2, 100, 6))],
    ids=["deep-cnn", "lenet", "lstm-gesture"],
)
def test_the_bound_holds_every_byte_numpy_allocates(model, shape) -> None:
    trainer = Trainer(model, optimizer=Adam(1e-4))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = np.arange(shape[0]) % 4
    trainer.train_step(x, y)  # the optimizer's state exists from here on
    _, traced = traced_step(trainer, x, y)
    assert traced <= trainer.memory_report(shape[0])["step_bound_bytes"]
