"""Validation: measured time for every layer and the whole model; predicted memory vs tracemalloc."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.estimate.predict import estimate, open_session
from hetflow.estimate.report import dominant_layers, format_table, layer_accuracy
from hetflow.estimate.validate import layer_seconds, model_seconds, peak_run_bytes, random_feeds, validate
from hetflow.ops.base import planned_infos


@pytest.fixture(scope="module")
def lenet(zoo_home):
    return open_session("zoo:lenet", "cpu")


def test_validate_lenet_measures_every_layer(lenet, quick_profile):
    result = estimate(lenet, quick_profile, batch=2, validate=True)
    assert result.validated and result.measured_ms > 0
    assert len(result.layers) == len(lenet.plan_for({"N": 2}).steps)
    for layer in result.layers:
        assert layer.measured_ms is not None and layer.measured_ms > 0, layer.name
        assert layer.error() is not None
    assert result.memory.measured_peak_bytes and result.memory.measured_peak_bytes > 0
    share, count = layer_accuracy(result)
    assert 0.0 <= share <= 1.0 and 1 <= count <= len(result.layers)
    text = format_table(result)
    assert "meas ms" in text and "measured" in text and "measured run peak" in text


def test_dominant_layers_cover_ninety_percent(lenet, quick_profile):
    result = estimate(lenet, quick_profile, validate=True)
    chosen = dominant_layers(result.layers)
    total = sum(layer.measured_ms for layer in result.layers)
    assert sum(layer.measured_ms for layer in chosen) >= 0.9 * total
    # Minimal: without its last (fastest) layer the chosen set covers less than 90%.
    assert sum(layer.measured_ms for layer in chosen[:-1]) < 0.9 * total


def test_layer_timing_follows_the_plan_for_the_batch(lenet):
    feeds = random_feeds(lenet, 3)
    assert feeds["data"].shape == (3, 1, 28, 28)
    seconds = layer_seconds(lenet, feeds, min_time=0.001, rounds=1)
    assert set(seconds) == {step.node.name for step in lenet.plan_for({"N": 3}).steps}
    assert all(s > 0 for s in seconds.values())
    assert model_seconds(lenet, feeds, min_runs=2, budget=0.0) > 0


class _SpellyMachine:
    """A session and a cache probe on a fake clock: a run takes 2 ms while the probe's last reading
    found the L3 split, 1 ms once it found it shared; the first ``split_readings`` readings are split."""

    def __init__(self, split_readings: float) -> None:
        self.now = 0.0
        self.split_readings = split_readings
        self.readings = 0
        self.split = True
        self.waited_out = False

    def perf_counter(self) -> float:
        return self.now

    def run(self, outputs, feeds):
        self.now += 2e-3 if self.split else 1e-3

    def shared(self) -> bool:
        self.readings += 1
        self.split = self.readings <= self.split_readings
        return not self.split

    @property
    def split_by_layout(self) -> bool:
        return self.waited_out

    def give_up_waiting(self) -> None:
        self.waited_out = True


def test_whole_runs_count_once_the_l3_is_shared(monkeypatch):
    """A slow spell (the L3 split) outlasting the budget is waited out: the runs after it count."""
    from hetflow.estimate import validate as validation

    machine = _SpellyMachine(split_readings=20)
    monkeypatch.setattr(validation, "time", machine)
    seconds = model_seconds(machine, {}, budget=0.5, probe=machine)
    assert seconds == pytest.approx(1e-3)
    # Split for 20 bursts of 0.2 s (one reading each: a burst that starts split is not read after),
    # then a full budget of shared ones.
    assert machine.now >= 20 * validation.BURST_SECONDS + 0.5
    assert not machine.waited_out


def test_whole_runs_wait_for_the_shared_l3_only_so_long(monkeypatch):
    """Where the L3 never reads shared the timing stops after its patience, and later timings take
    the split for the machine's layout and do not wait."""
    from hetflow.estimate import validate as validation

    machine = _SpellyMachine(split_readings=float("inf"))
    monkeypatch.setattr(validation, "time", machine)
    assert model_seconds(machine, {}, budget=0.5, probe=machine, patience=3.0) == pytest.approx(2e-3)
    assert machine.waited_out and 3.0 < machine.now < 3.5
    started = machine.now
    model_seconds(machine, {}, budget=0.5, probe=machine, patience=3.0)
    assert machine.now - started < 0.8


def test_whole_runs_without_a_probe_run_for_the_budget(monkeypatch):
    from hetflow.estimate import validate as validation

    machine = _SpellyMachine(split_readings=float("inf"))
    monkeypatch.setattr(validation, "time", machine)
    assert model_seconds(machine, {}, budget=0.5) == pytest.approx(2e-3)
    assert 0.5 <= machine.now < 0.51 and machine.readings == 0


def test_validate_keeps_each_layers_faster_pass(lenet, quick_profile, monkeypatch):
    """The layers are timed in two passes, around the whole model's timing; each keeps its faster one."""
    from hetflow.estimate import validate as validation

    names = [step.node.name for step in lenet.plan_for({"N": 2}).steps]
    passes = iter([
        {name: (1e-3 if index % 2 else 3e-3) for index, name in enumerate(names)},
        {name: 2e-3 for name in names},
    ])
    order: list[str] = []
    monkeypatch.setattr(validation, "layer_seconds", lambda *a, **k: order.append("layers") or next(passes))
    monkeypatch.setattr(validation, "model_seconds", lambda *a, **k: order.append("model") or 5e-3)
    result = validate(estimate(lenet, quick_profile, batch=2), lenet, memory=False)
    assert order == ["layers", "model", "layers"]
    assert result.measured_ms == pytest.approx(5.0)
    for index, layer in enumerate(result.layers):
        assert layer.measured_ms == pytest.approx(1.0 if index % 2 else 2.0), layer.name


def test_validate_refuses_feeds_of_another_batch(lenet, quick_profile):
    result = estimate(lenet, quick_profile, batch=2)
    with pytest.raises(ValueError, match="batch 2"):
        validate(result, lenet, feeds=random_feeds(lenet, 3))


@pytest.mark.parametrize(("model", "batch"), [("mentee", 4), ("cifar10-quick", 8), ("googlenet", 1)])
def test_memory_peak_prediction_within_5_percent(zoo_home, quick_profile, model, batch):
    session = open_session(f"zoo:{model}", "cpu")
    result = estimate(session, quick_profile, batch=batch)
    measured = peak_run_bytes(session, random_feeds(session, batch))
    assert abs(result.memory.peak_bytes - measured) <= 0.05 * measured, (result.memory.peak_bytes, measured)


def test_a_captured_lstm_keeps_its_buffers_and_a_run_allocates_none_for_it(zoo_home, quick_profile):
    """lstm-gesture at batch 16: its LSTM is captured (``rnn.captures_sequence``), so its states, gates
    and outputs are kept between runs (``cache_bytes``) and the run's peak is the small rest; the old
    model priced the kernel's unbound scratch (0.4 MB) there against the run's 40 KB."""
    from hetflow.devices.cpu.kernels.rnn import gate_panel_bytes, sequence_capture_bytes

    session = open_session("zoo:lstm-gesture", "cpu")
    result = estimate(session, quick_profile, batch=16)
    measured = peak_run_bytes(session, random_feeds(session, 16))
    # A run's few interpreter objects (~2-5 KB: thread-count lookups, the feed signature) are not priced.
    assert abs(result.memory.peak_bytes - measured) <= 0.05 * measured + 8192, (result.memory.peak_bytes, measured)
    plan = session.plan_for({"N": 16})
    node = next(s.node for s in plan.steps if s.node.op_type == "LSTM")
    infos = planned_infos(node, plan.graph.values, plan.graph.initializers)
    assert sequence_capture_bytes(node, infos) > 0 and gate_panel_bytes(node, infos) == 0  # a batch: R unpacked
    assert result.memory.cache_bytes >= sequence_capture_bytes(node, infos)


def test_a_fresh_session_measures_the_same_peak_as_a_warm_one(zoo_home):
    """The first measurement of a session leaves out what its first runs build (the replay's capture):
    it had read LeNet's peak 39% over the next one."""
    session = open_session("zoo:lenet", "cpu")
    feeds = random_feeds(session, 1)
    first, again = peak_run_bytes(session, feeds), peak_run_bytes(session, feeds)
    assert abs(first - again) <= 0.02 * again, (first, again)


def test_planned_peak_replays_release_points(zoo_home, quick_profile, ci_cores):
    session = open_session("zoo:mentee", "cpu")
    one = estimate(session, quick_profile, batch=1).memory
    four = estimate(session, quick_profile, batch=4).memory
    # Activations scale with the batch, weights do not; mentee's Convs (3x3, pad 1) run direct on X and Y
    # where they lie, with no scratch, so the live peak scales as the activations do; every blob at once
    # is more than the live peak.
    assert four.data_bytes == 4 * one.data_bytes
    assert 3.9 * one.peak_bytes < four.peak_bytes < 4.1 * one.peak_bytes
    assert four.weights_bytes == one.weights_bytes
    assert one.data_bytes + one.workspace_bytes > one.peak_bytes
    assert one.weights_bytes == sum(int(a.nbytes) for a in session.graph.initializers.values())
    assert np.isfinite(one.augur_total_bytes)


def test_a_batch_run_in_parts_is_estimated_and_measured_as_its_runs(zoo_home, quick_profile, monkeypatch):
    """A session that runs a batch of 16 as runs of 4 (``images_per_run``): the estimate is four runs of
    4, the planned peak one run's; validation times the layers as a run of 4 makes them, four times."""
    from hetflow.estimate import validate as validation
    from hetflow.runtime import session as session_module

    monkeypatch.setattr(session_module, "last_level_cache_bytes", lambda: 32 << 20)
    session = open_session("zoo:squeezenet", "cpu")
    assert session.images_per_run(16) == 4
    whole, part = estimate(session, quick_profile, 16), estimate(session, quick_profile, 4)
    assert whole.batch == 16 and any("4 runs of 4 images" in note for note in whole.notes)
    assert whole.predicted_ms == pytest.approx(4 * part.predicted_ms)
    assert whole.memory.peak_bytes == part.memory.peak_bytes
    assert sum(layer.macs for layer in whole.layers) == 4 * sum(layer.macs for layer in part.layers)
    assert [layer.algorithm for layer in whole.layers] == [layer.algorithm for layer in part.layers]

    batches: list[int] = []

    def layers(session, feeds, **_):  # noqa: ANN001, ANN202
        batches.append(next(iter(feeds.values())).shape[0])
        return {layer.name: 1e-3 for layer in part.layers}

    monkeypatch.setattr(validation, "layer_seconds", layers)
    monkeypatch.setattr(validation, "model_seconds", lambda *a, **k: 5e-3)
    validate(whole, session, memory=False)
    assert batches == [4, 4]
    assert all(layer.measured_ms == pytest.approx(4.0) for layer in whole.layers)


def test_validate_times_the_layers_on_whole_feeds_without_a_batch_dimension(quick_profile, monkeypatch):
    """A time-major LSTM's input is [steps, 1, features] with no symbolic batch: its first axis is the
    sequence, and the layers are timed over every step (slicing it to the batch ran one)."""
    from hetflow.estimate import probes
    from hetflow.estimate import validate as validation

    session = open_session(probes.lstm(20, 1, 6, 32, last_only=True)(), "cpu")
    shapes: list[tuple[int, ...]] = []
    original = validation.layer_seconds
    monkeypatch.setattr(validation, "layer_seconds",
                        lambda s, feeds, **k: shapes.append(feeds["x"].shape) or original(s, feeds, **k))
    result = validate(estimate(session, quick_profile, batch=1), session, memory=False)
    assert shapes == [(20, 1, 6), (20, 1, 6)]
    (layer,) = result.layers
    assert layer.measured_ms > 0.25 * result.measured_ms  # the whole sequence, not one step of it
