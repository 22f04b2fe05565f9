"""Calibrations merged: a profile keeps every probe's time, and a later calibration of the same machine,
threads and sources keeps the faster of its own and the earlier one's, probe by probe."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

from hetflow.cli import main
from hetflow.devices.registry import get_device
from hetflow.estimate.profile import DeviceProfile

calibration = importlib.import_module("hetflow.estimate.calibrate")


def _sample(seconds: float) -> calibration.Sample:
    return calibration.Sample("Relu/default", np.ones(7), seconds, np.zeros(4), 4, 4, 4)


def test_each_sample_keeps_the_faster_of_its_time_and_the_earlier_one():
    samples = [_sample(2e-3), _sample(1e-3), _sample(5e-3)]
    names = ["a#0", "a#1", "b#0"]
    merged = calibration.merged_seconds(samples, names, {"a#0": 1.5e-3, "a#1": 4e-3})
    assert [s.seconds for s in merged] == [1.5e-3, 1e-3, 5e-3]
    assert merged[1] is samples[1] and merged[2] is samples[2]


def test_sample_names_follow_the_probes_and_their_samples():
    probe = calibration.probe_catalogue.Probe
    probes = [probe("relu 8", lambda: None), probe("fc 4", lambda: None)]
    assert calibration.sample_names(probes, [[_sample(1.0), _sample(1.0)], [_sample(1.0)]]) == [
        "relu 8#0", "relu 8#1", "fc 4#0"]
    with pytest.raises(ValueError):
        calibration.sample_names(probes, [[_sample(1.0)]])


def test_a_profile_of_another_machine_threads_or_sources_does_not_merge(quick_profile):
    cpu = get_device("cpu")
    threads = quick_profile.threads
    assert calibration.merge_refusal(quick_profile, cpu, threads, quick=True) is None
    assert "quick" in calibration.merge_refusal(quick_profile, cpu, threads, quick=False)
    other = dataclasses.replace(quick_profile, fingerprint={**quick_profile.fingerprint, "model": "another"})
    assert "another device" in calibration.merge_refusal(other, cpu, threads, quick=True)
    assert "thread" in calibration.merge_refusal(quick_profile, cpu, threads + 1, quick=True)
    stale = dataclasses.replace(quick_profile, sources="0" * 64)
    assert "sources" in calibration.merge_refusal(stale, cpu, threads, quick=True)
    empty = dataclasses.replace(quick_profile, probe_seconds={})
    assert "no probe timings" in calibration.merge_refusal(empty, cpu, threads, quick=True)


def test_a_profile_records_its_probe_times_and_round_trips(quick_profile, tmp_path):
    assert quick_profile.calibrations == 1
    assert quick_profile.sources == calibration.sources_digest()
    assert quick_profile.probe_seconds and all(s > 0 for s in quick_profile.probe_seconds.values())
    again = DeviceProfile.load(quick_profile.save(tmp_path / "p.json"))
    assert again.probe_seconds == quick_profile.probe_seconds
    assert (again.calibrations, again.sources) == (1, quick_profile.sources)


def test_a_merged_calibration_fits_the_faster_times(quick_profile):
    """An earlier profile whose probes all ran in a nanosecond: the merge keeps those, and the fitted
    models follow them down."""
    fast = dataclasses.replace(quick_profile, probe_seconds={name: 1e-9 for name in quick_profile.probe_seconds})
    merged = calibration.calibrate("cpu", quick=True, progress=False, merge=fast)
    assert merged.calibrations == 2
    assert merged.probe_seconds == pytest.approx(fast.probe_seconds)
    conv = next(key for key in merged.ops if key.startswith("Conv/"))
    features = np.ones(len(merged.ops[conv].coef)) * 1e-4
    assert merged.ops[conv].seconds(features) < quick_profile.ops[conv].seconds(features)
    refused = calibration.calibrate("cpu", quick=True, progress=False,
                                    merge=dataclasses.replace(fast, sources="0" * 64))
    assert refused.calibrations == 1
    assert min(refused.probe_seconds.values()) > 1e-9


def test_calibrate_merge_from_the_command_line(tmp_path, capsys, monkeypatch):
    target = tmp_path / "cpu.json"
    assert main(["calibrate", "--quick", "--merge", "--output", str(target)]) == 0
    assert "nothing to merge with" in capsys.readouterr().err
    assert DeviceProfile.load(target).calibrations == 1
    assert main(["calibrate", "--quick", "--merge", "--output", str(target)]) == 0
    merged = DeviceProfile.load(target)
    assert merged.calibrations == 2
    assert "fastest of 2 calibrations" in capsys.readouterr().out
