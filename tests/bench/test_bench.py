"""``hetflow bench`` targets in their quick form: every configuration runs and the result holds up."""

from __future__ import annotations

import json

import pytest

from hetflow.bench import TARGETS, Options, run_target
from hetflow.bench.targets import bench_cnndroid, bench_placements, googlenet_conv_shapes
from hetflow.cli import main
from hetflow.errors import HetflowError

QUICK = Options(repeat=1, quick=True, threads=1)


def _column(result, name):
    index = result.columns.index(name)
    return [row[index] for row in result.rows]


def test_matmul_target_measures_both_devices_at_each_size(tmp_path):
    result = run_target("matmul", QUICK)
    assert _column(result, "n") == [64, 128]
    assert all(ms > 0 for ms in _column(result, "CPU ms"))
    # GFLOP/s is 2 n^3 / time: consistent with the ms column.
    for n, ms, rate in zip(_column(result, "n"), _column(result, "CPU ms"), _column(result, "CPU GFLOP/s")):
        assert rate == pytest.approx(2 * n**3 / (ms / 1e3) / 1e9, rel=1e-6)
    written = result.write(tmp_path)
    assert {p.suffix for p in written} >= {".md", ".json"} and len(written) == 3
    assert json.loads(written[1].read_text())["target"] == "matmul"


def test_googlenet_conv_shapes_start_at_the_image():
    shapes = googlenet_conv_shapes()
    assert (shapes[0].channels, shapes[0].size, shapes[0].kernel, shapes[0].stride) == (3, 224, 7, 2)
    assert len(shapes) == len(set(shapes)) > 20


def test_placements_run_every_configuration_or_say_why():
    result = bench_placements(QUICK, model="zoo:lenet")
    assert _column(result, "batch") == [1, 2]
    cpu = _column(result, "CPU only ms")
    assert all(ms is not None and ms > 0 for ms in cpu)
    for label in ("OpenCL MatMul+Conv", "OpenCL MatMul only", "OpenCL only", "auto"):
        values = _column(result, f"{label} ms")
        # A configuration is either measured at every batch or explained in the notes (one note for every
        # OpenCL column where there is no OpenCL device).
        explained = any(n.startswith((label, "no opencl:0 columns")) for n in result.notes)
        assert all(v is not None for v in values) or explained
    for row, cpu_ms in zip(result.rows, cpu):
        auto, singles = row[result.columns.index("auto ms")], [cpu_ms, row[result.columns.index("OpenCL only ms")]]
        if auto is not None:
            best = min(v for v in singles if v is not None)
            assert row[result.columns.index("auto / best single")] == pytest.approx(auto / best, rel=1e-6)
            assert any(n.startswith(f"auto at batch {row[0]} timed") for n in result.notes)


def test_cnndroid_reports_per_image_times():
    result = bench_cnndroid(QUICK, models=("lenet",))
    [row] = result.rows
    sequential = row[result.columns.index("sequential ms/image")]
    parallel = row[result.columns.index("parallel ms/image")]
    assert sequential > 0 and parallel > 0
    assert row[result.columns.index("parallel speed-up")] == pytest.approx(sequential / parallel, rel=1e-6)


def test_unknown_target_lists_the_known_ones(capsys):
    with pytest.raises(HetflowError, match="matmul"):
        run_target("nope")
    assert main(["bench", "nope"]) == 1
    assert "targets:" in capsys.readouterr().err
    assert main(["bench"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in TARGETS)
