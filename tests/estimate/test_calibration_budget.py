"""A full calibration keeps to its time budget: the later pass and the re-measurements take only what the
first pass left, and a profile comes out either way."""

from __future__ import annotations

import dataclasses
import importlib
import time

import pytest

from hetflow.devices.registry import get_device

calibrate = importlib.import_module("hetflow.estimate.calibrate")
probes = importlib.import_module("hetflow.estimate.probes")


def _sweeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Records the ``stop_at`` of every probe sweep a calibration makes."""
    stops: list[float] = []
    original = calibrate._time_probes

    def spy(*args, **kwargs):
        stops.append(kwargs.get("stop_at", float("inf")))
        return original(*args, **kwargs)

    monkeypatch.setattr(calibrate, "_time_probes", spy)
    return stops


def _two_passes(monkeypatch: pytest.MonkeyPatch, budget: float | None) -> None:
    """The quick calibration, swept twice, with ``budget`` seconds."""
    monkeypatch.setattr(calibrate, "QUICK", dataclasses.replace(calibrate.QUICK, passes=2, budget_seconds=budget))


def test_an_unbounded_calibration_sweeps_the_probes_every_pass(monkeypatch):
    stops = _sweeps(monkeypatch)
    _two_passes(monkeypatch, None)
    profile = calibrate.calibrate("cpu", quick=True, progress=False)
    assert stops == [float("inf"), float("inf")]
    assert profile.ops


def test_a_spent_budget_skips_the_later_pass_and_still_fits_a_profile(monkeypatch):
    stops = _sweeps(monkeypatch)
    remeasured: list[str] = []
    monkeypatch.setattr(calibrate, "_measured_again",
                        lambda probe, samples, *args: remeasured.append(probe.name) or samples)
    monkeypatch.setattr(calibrate, "OUTLIER_RATIO", 1.0001)  # every probe an outlier, were there time
    _two_passes(monkeypatch, 0.0)
    started = time.perf_counter()
    profile = calibrate.calibrate("cpu", quick=True, progress=False)
    assert len(stops) == 1  # the first pass only
    assert remeasured == []
    assert profile.ops and profile.gemm.peak_gflops > 0
    assert time.perf_counter() - started < 60


def test_a_sweep_stops_before_the_next_probe_once_its_time_is_up(quick_profile, no_bar):
    names = ["maxpool 2x2/2 32x32", "avgpool 3x3/1 256x28"]
    chosen = [next(p for p in probes.catalogue() if p.name == name) for name in names]
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    device = get_device("cpu")
    swept = calibrate._time_probes(chosen, calibrate.QUICK, device, terms, no_bar, stop_at=time.perf_counter())
    assert swept.samples == []
    whole = calibrate._time_probes(chosen, calibrate.QUICK, device, terms, no_bar)
    assert len(whole.samples) == 2 and all(whole.samples)


def test_the_budget_counts_down_from_its_start():
    budget = calibrate._Budget(10.0, started=time.perf_counter() - 4.0)
    assert 5.9 < budget.left() <= 6.0
    assert budget.until(3.0) == pytest.approx(budget.started + 7.0)
    unbounded = calibrate._Budget(None)
    assert unbounded.left() == float("inf") and unbounded.until(5.0) == float("inf")


def test_a_budget_with_time_left_sweeps_again_until_its_reserve(monkeypatch):
    stops = _sweeps(monkeypatch)
    _two_passes(monkeypatch, 1000.0)
    started = time.perf_counter()
    calibrate.calibrate("cpu", quick=True, progress=False)
    assert len(stops) == 2 and stops[0] == float("inf")
    reserve = calibrate.OUTLIER_RESERVE_SECONDS + calibrate.SPELL_RESERVE_SECONDS
    assert started + 1000.0 - reserve - 60 < stops[1] < started + 1000.0 - reserve
