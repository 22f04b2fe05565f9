"""Every zoo model can be trained: each node on its gradient path has a backward rule; small ones take
real steps, and a trained MobileNetV2 (BatchNormalization, Clip, depthwise convs, residual Adds) exports
to ONNX that ONNX Runtime runs like hetflow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from hetflow import zoo
from hetflow.train import SGD, Trainer

NAMES = [entry.name for entry in zoo.list_models()]
STEPPED = ["lenet", "cifar10-quick", "mentee", "lstm-gesture", "squeezenet"]


@pytest.fixture(scope="module", autouse=True)
def _zoo_home(zoo_home: Path) -> Path:
    return zoo_home


def _batch(name: str, batch: int) -> np.ndarray:
    shape = [batch if isinstance(d, str) else d for d in zoo.entry(name).input_shape]
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_every_zoo_model_has_rules_on_its_gradient_path(name: str) -> None:
    trainer = Trainer(f"zoo:{name}", optimizer=SGD(0.01))
    assert trainer.trainable
    first_conv_or_fc = next(n for n in trainer.graph.nodes if n.op_type in ("Conv", "Gemm", "LSTM", "MatMul"))
    assert first_conv_or_fc.inputs[1] in trainer.trainable


@pytest.mark.parametrize("name", STEPPED)
def test_small_zoo_models_take_steps(name: str) -> None:
    trainer = Trainer(f"zoo:{name}", optimizer=SGD(1e-4))  # small steps: the loss falls monotonically
    x, y = _batch(name, 2), np.array([0, 1])
    before = {n: p.copy() for n, p in trainer.params.items()}
    losses = [trainer.train_step(x, y)[0] for _ in range(3)]
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]  # the same batch three times: the loss must fall
    assert all(not np.array_equal(before[n], trainer.params[n]) for n in trainer.trainable)


def test_trained_mobilenetv2_exports_like_onnx_runtime(tmp_path: Path) -> None:
    trainer = Trainer("zoo:mobilenetv2", optimizer=SGD(0.01, momentum=0.9))
    x = _batch("mobilenetv2", 2)
    trainer.train_step(x, np.array([3, 7]))
    path = tmp_path / "mobilenetv2-trained.onnx"
    trainer.export(path)
    ours = trainer.predict(x)
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4 * float(np.abs(theirs).max()))
