"""The tuning cache: round trip, other machines ignored, corrupt lines skipped, best-on-load."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from hetflow.options import HOME_ENV
from hetflow.tuning.cache import FORMAT_VERSION, TuningCache, TuningRecord, cache_path, kernels_hash
from hetflow.tuning.space import Workload

HERE = {"kind": "cpu", "processor": "test cpu", "numpy": "2.4"}
ELSEWHERE = {"kind": "cpu", "processor": "another cpu", "numpy": "2.4"}
WORKLOAD = Workload("Conv", {"x": [1, 64, 28, 28], "w": [64, 64, 3, 3], "dtype": "float32", "group": 1})
OTHER = Workload("Conv", {"x": [2, 64, 28, 28], "w": [64, 64, 3, 3], "dtype": "float32", "group": 1})


def _record(times: dict[str, float], workload: Workload = WORKLOAD, fingerprint=HERE, kernels="k1", date="d1"):
    return TuningRecord(
        fingerprint=fingerprint,
        device="cpu",
        workload=workload,
        kernels=kernels,
        candidates=times,
        chosen=min(times, key=times.__getitem__),
        errors={"broken": "runtime_error: boom"},
        protocol={"warmup": 1, "repeats": 3},
        hetflow="0.1.0",
        date=date,
    )


def test_round_trip(tmp_path: Path):
    path = tmp_path / "tuning" / "records.jsonl"
    record = _record({"im2col": 0.002, "winograd_f43": 0.001})
    TuningCache(path, HERE).add(record)
    (line,) = path.read_text().splitlines()
    data = json.loads(line)
    for key in ("version", "fingerprint", "op", "kernels", "workload", "candidates", "chosen", "date"):
        assert key in data
    assert data["version"] == FORMAT_VERSION and data["op"] == "Conv"
    loaded = TuningCache(path, HERE).lookup(WORKLOAD, "k1")
    assert loaded == record
    assert loaded.chosen == "winograd_f43"


def test_add_is_visible_at_once_and_appends(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    cache = TuningCache(path, HERE)
    assert cache.lookup(WORKLOAD, "k1") is None and len(cache) == 0
    cache.add(_record({"im2col": 0.002}))
    cache.add(_record({"im2col": 0.003}, workload=OTHER))
    assert cache.lookup(WORKLOAD, "k1") is not None and len(cache) == 2
    assert len(path.read_text().splitlines()) == 2


def test_records_of_another_machine_or_kernel_version_are_ignored(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    TuningCache(path, ELSEWHERE).add(_record({"im2col": 0.002}, fingerprint=ELSEWHERE))
    here = TuningCache(path, HERE)
    assert here.lookup(WORKLOAD, "k1") is None
    assert here.ignored == 1
    TuningCache(path, HERE).add(_record({"im2col": 0.002}, kernels="k2"))
    assert TuningCache(path, HERE).lookup(WORKLOAD, "k1") is None
    assert TuningCache(path, HERE).lookup(WORKLOAD, "k2") is not None


def test_an_old_format_version_is_ignored(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    data = json.loads(_record({"im2col": 0.002}).to_json())
    data["version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(data) + "\n")
    assert TuningCache(path, HERE).lookup(WORKLOAD, "k1") is None


def test_corrupt_lines_are_skipped_with_one_warning(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    good = _record({"im2col": 0.002}).to_json()
    bad_chosen = json.loads(good)
    bad_chosen["chosen"] = "nonexistent"
    path.write_text(
        "{not json\n" + good + "\n" + '{"version": 1}\n' + "[1, 2]\n" + json.dumps(bad_chosen) + "\n" + good[:40]
    )
    with pytest.warns(UserWarning, match="skipped 5 line") as caught:
        cache = TuningCache(path, HERE)
    assert len(caught) == 1
    assert cache.corrupt == 5
    assert cache.lookup(WORKLOAD, "k1") is not None


def test_a_clean_file_loads_without_warnings(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    TuningCache(path, HERE).add(_record({"im2col": 0.002}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TuningCache(path, HERE)


def test_best_on_load_merges_every_measurement(tmp_path: Path):
    path = tmp_path / "records.jsonl"
    cache = TuningCache(path, HERE)
    cache.add(_record({"im2col": 0.002, "winograd_f43": 0.003}, date="2026-01-01"))
    cache.add(_record({"im2col": 0.005, "winograd_f43": 0.001, "winograd_f23": 0.004}, date="2026-01-02"))
    merged = TuningCache(path, HERE).lookup(WORKLOAD, "k1")
    assert merged.candidates == {"im2col": 0.002, "winograd_f43": 0.001, "winograd_f23": 0.004}
    assert merged.chosen == "winograd_f43"
    assert merged.date == "2026-01-02"
    assert merged.errors == {"broken": "runtime_error: boom"}


def test_default_path_follows_hetflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    assert cache_path() == tmp_path / "tuning" / "records.jsonl"


def test_kernels_hash_follows_the_sources():
    from hetflow.devices.cpu import CPUDevice

    conv = CPUDevice().kernels.kernels["Conv"]
    assert kernels_hash(conv) == kernels_hash(list(conv))
    assert len(kernels_hash(conv)) == 16
    # The Winograd bodies live in their own file: it takes part through __wrapped__.
    winograd_only = [k for k in conv if k.algorithm.startswith("winograd")]
    im2col_only = [k for k in conv if k.algorithm == "im2col"]
    assert kernels_hash(winograd_only) != kernels_hash(im2col_only)
