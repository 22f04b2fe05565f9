"""Calibration reads a slow-spell gauge between its probes and measures again, once the machine is calm,
what every sweep timed in a spell; the cache probe tells whether the two cores share their L3."""

from __future__ import annotations

import importlib
import os
import time

import numpy as np
import pytest

from hetflow.devices.registry import get_device
from hetflow.estimate.spells import SPELL_RATIO, CacheProbe, SpellGauge

calibrate = importlib.import_module("hetflow.estimate.calibrate")
probes = importlib.import_module("hetflow.estimate.probes")


class _ScriptedGauge:
    """A gauge whose readings are given in order (the last one repeats)."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = list(readings)
        self.fastest = min(readings)
        self.reads = 0

    def read(self) -> float:
        self.reads += 1
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def slow(self, reading: float) -> bool:
        return reading > SPELL_RATIO * self.fastest

    def wait_for_calm(self, limit_s: float, pause_s: float = 0.5) -> bool:
        return not self.slow(self.read())


class _SplitProbe:
    """A cache probe that reads the cores' L3 as split (or shared) as told."""

    available = True

    def __init__(self, split: bool) -> None:
        self.split = split

    def shared(self) -> bool:
        return not self.split


def test_the_gauge_reads_the_layer_and_keeps_the_fastest_reading():
    # The cores' L3 is told shared: the real probe reads a CI runner's cores as split at times.
    gauge = SpellGauge(threads=2, probe=_SplitProbe(split=False))
    reading = gauge.read()
    assert 0 < gauge.fastest <= reading
    assert not gauge.slow(gauge.fastest)
    assert gauge.slow(gauge.fastest * SPELL_RATIO * 1.01)


def test_probes_timed_next_to_a_slow_reading_are_marked(quick_profile, monkeypatch, no_bar):
    monkeypatch.setattr(calibrate, "WATCH_INTERVAL_SECONDS", 0.0)  # a reading after every probe
    monkeypatch.setattr(calibrate, "SETTLE_SECONDS", 0.0)
    names = ["maxpool 2x2/2 32x32", "avgpool 3x3/1 256x28", "maxpool 2x2/2 20x24", "maxpool 2x2/2 96x8"]
    chosen = [next(p for p in probes.catalogue() if p.name == name) for name in names]
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    # Readings: before the first probe, then after each (a slow one is read again: two readings), and
    # one at the sweep's end.
    gauge = _ScriptedGauge([1.0, 1.0, 3.0, 3.0, 1.0, 1.0, 1.0])
    swept = calibrate._time_probes(chosen, calibrate.QUICK, get_device("cpu"), terms, no_bar, gauge=gauge)
    # The second probe's reading after it stayed slow; the third's reading before it is that same one.
    assert swept.spells == [False, True, True, False]


def test_a_slow_reading_that_does_not_last_marks_nothing(quick_profile, monkeypatch, no_bar):
    monkeypatch.setattr(calibrate, "WATCH_INTERVAL_SECONDS", 0.0)
    monkeypatch.setattr(calibrate, "SETTLE_SECONDS", 0.0)
    chosen = [next(p for p in probes.catalogue() if p.name == "maxpool 2x2/2 32x32")]
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    gauge = _ScriptedGauge([1.0, 3.0, 1.0, 1.0])  # slow once (OpenBLAS's workers spinning), then calm again
    swept = calibrate._time_probes(chosen, calibrate.QUICK, get_device("cpu"), terms, no_bar, gauge=gauge)
    assert swept.spells == [False]


def test_probes_timed_in_spells_are_measured_again_and_keep_the_faster_samples(quick_profile, monkeypatch, no_bar):
    chosen = [next(p for p in probes.catalogue() if p.name == name)
              for name in ["maxpool 2x2/2 32x32", "avgpool 3x3/1 256x28"]]  # fmt: skip
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    device = get_device("cpu")
    measured = calibrate._time_probes(chosen, calibrate.QUICK, device, terms, no_bar).samples
    slowed = [[_slowed(sample) for sample in group] for group in measured]
    timed: list[str] = []
    original = calibrate._time_probe
    monkeypatch.setattr(calibrate, "_time_probe",
                        lambda probe, *args, **kwargs: timed.append(probe.name) or original(probe, *args, **kwargs))
    done = calibrate._remeasure_spells(chosen, slowed, [False, True], calibrate.QUICK, device, terms,
                                       _ScriptedGauge([1.0]))  # fmt: skip
    assert done == 1 and timed == ["avgpool 3x3/1 256x28"]
    assert slowed[0][0].seconds > 100  # not in a spell: not measured again
    assert all(sample.seconds < 100 for sample in slowed[1])
    # The re-measured samples keep the allocation counts of the first sweep.
    assert [s.transient_bytes for s in slowed[1]] == [s.transient_bytes for s in measured[1]]


def test_no_probe_is_measured_again_while_the_spell_lasts(quick_profile, no_bar):
    chosen = [next(p for p in probes.catalogue() if p.name == "maxpool 2x2/2 32x32")]
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    device = get_device("cpu")
    measured = calibrate._time_probes(chosen, calibrate.QUICK, device, terms, no_bar).samples
    slowed = [[_slowed(sample) for sample in group] for group in measured]
    gauge = _ScriptedGauge([1.0, 3.0])  # the fastest reading was 1.0; the machine reads 3.0 from now on
    gauge.readings.pop(0)
    assert calibrate._remeasure_spells(chosen, slowed, [True], calibrate.QUICK, device, terms, gauge) == 0
    assert slowed[0][0].seconds > 100


def _slowed(sample):
    import dataclasses

    return dataclasses.replace(sample, seconds=sample.seconds + 1000.0, features=np.array(sample.features))



def test_the_cache_probe_compares_a_read_across_cores_with_one_on_a_core():
    """On two CPUs the probe times a read of what the other CPU wrote against a read of its own writes:
    a positive, finite ratio, near 1 where they share their L3 (the split state reads ~2)."""
    probe = CacheProbe()
    if len(os.sched_getaffinity(0)) < 2:
        assert not probe.available and probe.shared() is None
        return
    ratio = probe.ratio(reads=2)
    assert 0.3 < ratio < 20
    assert probe.shared() in (True, False)
    assert probe.wait_until_shared(0.0) in (True, False)


def test_the_cache_probe_without_two_cpus_says_so(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    probe = CacheProbe()
    assert not probe.available
    assert probe.shared() is None
    assert probe.wait_until_shared(1.0) is None
    with pytest.raises(RuntimeError, match="two CPUs"):
        probe.ratio()


def test_a_reading_with_the_l3_split_is_slow_however_fast_the_gauge_ran():
    """A gauge made inside a long spell keeps a spell's reading as its fastest; the cache probe still
    marks what it reads then."""
    probe = _SplitProbe(split=False)
    gauge = SpellGauge(probe=probe)
    assert not gauge.split
    assert not gauge.slow(gauge.fastest)
    probe.split = True
    reading = gauge.read()
    assert gauge.split
    assert gauge.slow(min(reading, gauge.fastest))
    probe.split = False
    gauge.read()
    assert not gauge.split
    assert not gauge.slow(gauge.fastest)


def _scripted_probe(monkeypatch, ratios: list[float]) -> CacheProbe:
    """A cache probe reading ``ratios`` in turn (the last one repeats), with two CPUs."""
    probe = CacheProbe()
    probe.cpus = (0, 1)
    readings = list(ratios)
    monkeypatch.setattr(probe, "ratio", lambda reads=3: readings.pop(0) if len(readings) > 1 else readings[0])
    return probe


def test_a_probe_that_never_reads_the_l3_shared_stops_waiting_for_it(monkeypatch):
    probe = _scripted_probe(monkeypatch, [2.0])  # split by the machine's layout
    assert probe.wait_until_shared(0.05, pause_s=0.01) is False
    assert probe.split_by_layout
    started = time.perf_counter()
    assert probe.wait_until_shared(30.0, pause_s=0.01) is False
    assert time.perf_counter() - started < 1.0


def test_a_probe_that_has_read_the_l3_shared_waits_out_a_split(monkeypatch):
    probe = _scripted_probe(monkeypatch, [1.0, 2.0, 2.0])
    assert probe.shared() is True
    assert probe.wait_until_shared(0.05, pause_s=0.01) is False  # ran out: a spell, not the layout
    assert not probe.split_by_layout
    probe = _scripted_probe(monkeypatch, [1.0, 2.0, 2.0, 1.0])
    assert probe.shared() is True
    assert probe.wait_until_shared(30.0, pause_s=0.01) is True


def test_a_shared_reading_after_the_layout_verdict_brings_the_waits_back(monkeypatch):
    probe = _scripted_probe(monkeypatch, [2.0, 2.0, 1.0, 2.0])
    assert probe.wait_until_shared(0.0, pause_s=0.01) is False  # ran out with no shared reading
    assert probe.split_by_layout
    assert probe.wait_until_shared(30.0, pause_s=0.01) is False  # one reading, no wait
    assert probe.shared() is True  # the cores share their L3 after all: a spell it was
    assert not probe.split_by_layout and probe.ever_shared
