"""The TensorFlow+ training targets in their quick form, without the PyTorch peer (tests never import it)."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

from hetflow.bench import TARGETS, Options, run_target, torch_peer
from hetflow.bench.targets import PHASES, conv_stack_model
from hetflow.train import SGD, Trainer

QUICK = Options(repeat=1, quick=True, threads=1)


@pytest.fixture
def no_torch(monkeypatch):
    """PyTorch reported missing, whether or not it is installed: the targets must say so, not fail."""
    monkeypatch.setattr(torch_peer, "torch_available", lambda: False)


def _column(result, name):
    index = result.columns.index(name)
    return [row[index] for row in result.rows]


def test_training_targets_are_registered():
    assert {"train", "train-scaling"} <= set(TARGETS)


def test_train_splits_the_step_into_phases_without_torch(no_torch):
    result = run_target("train", QUICK)
    assert _column(result, "phase") == list(PHASES)
    ours = dict(zip(PHASES, _column(result, "hetflow ms")))
    assert all(ours[phase] > 0 for phase in PHASES)
    # Every step's total is the sum of its phases, so the fastest total is at least the fastest phases.
    assert ours["step"] >= ours["forward"] + ours["backward"] + ours["update"] - 1e-9
    assert _column(result, "PyTorch ms") == [None] * len(PHASES)
    assert _column(result, "hetflow / PyTorch") == [None] * len(PHASES)
    assert any("torch is not installed" in note for note in result.notes)
    assert [series.label for series in result.series][0] == "hetflow"


def test_train_puts_the_opencl_step_beside_the_cpu_one(no_torch):
    from hetflow.devices.opencl import OpenCLDevice

    result = run_target("train", QUICK)
    accelerated = _column(result, "OpenCL ms")
    if OpenCLDevice.is_available() is not None:
        assert accelerated == [None] * len(PHASES)
        assert any(note.startswith("no opencl:0 columns") for note in result.notes)
        return
    assert all(ms > 0 for ms in accelerated)
    ratios = _column(result, "OpenCL / CPU")
    assert all(r is not None and r > 0 for r in ratios)
    assert [series.label for series in result.series] == ["hetflow", "hetflow OpenCL"]
    [memory] = [n for n in result.notes if n.startswith("peak bytes allocated during one step")]
    assert "hetflow OpenCL" in memory
    [placement] = [n for n in result.notes if n.startswith("hetflow OpenCL: forward, backward")]
    assert "forward on the CPU: none" in placement


def test_train_reports_the_trainers_peak_memory(no_torch):
    result = run_target("train", QUICK)
    [note] = [n for n in result.notes if n.startswith("hetflow peak step memory")]
    trainer = Trainer("zoo:mentee", optimizer=SGD(0.01, momentum=0.9))
    report = trainer.memory_report(8)
    assert f"{report['step_bound_bytes'] / 2**20:.1f} MiB bound" in note
    assert f"{report['fixed_bytes'] / 2**20:.1f} MiB of weights" in note


def test_train_scaling_covers_depth_and_width_without_torch(no_torch, tmp_path):
    result = run_target("train-scaling", QUICK)
    assert _column(result, "depth") == [1, 2]
    assert _column(result, "width") == [8, 8]
    assert all(ms > 0 for ms in _column(result, "hetflow ms"))
    assert _column(result, "PyTorch ms") == [None, None]
    assert any("torch is not installed" in note for note in result.notes)
    written = result.write(tmp_path)
    assert {p.suffix for p in written} >= {".md", ".json"}


@pytest.mark.parametrize("depth, width", [(1, 4), (3, 8)])
def test_conv_stack_model_is_valid_and_trains(depth, width):
    model = conv_stack_model(depth, width, size=8)
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node].count("Conv") == depth
    trainer = Trainer(model, optimizer=SGD(0.05, momentum=0.9))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    first, _ = trainer.train_step(x, y)
    for _ in range(15):
        last, _ = trainer.train_step(x, y)
    assert last < first  # the same batch again and again: the loss must fall


def test_torch_peer_reports_availability_without_importing_torch():
    before = "torch" in sys.modules
    assert isinstance(torch_peer.torch_available(), bool)
    assert ("torch" in sys.modules) == before
