"""OpenCL GEMM tuning: the declared space, shape classes, labels, the cache round trip (a new device
object reads what a search wrote; another driver or another kernel source does not), the session and
planner hook, and which products a node runs. No timing is asserted."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices.opencl.kernels.gemm import (
    DEFAULT_CONFIG,
    GEMM_SPACE,
    GPU_DEFAULT_CONFIG,
    GPU_SMALL_CONFIGS,
    GemmConfig,
    default_config,
)
from hetflow.devices.opencl.tuning import (
    EFFORTS,
    FAST_CONFIGS,
    GEMM_OP,
    GEMM_SOURCE_HASH,
    GemmTuning,
    candidates,
    config_label,
    gemm_workload,
    node_gemms,
    parse_label,
    search,
    shape_class,
    tune_gemms,
)
from hetflow.graph import Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import ConvAttrs
from hetflow.passes import bind_batch
from hetflow.tuning.cache import TuningCache

#: Two configurations instead of the whole fast list: the tests check bookkeeping, not speed.
QUICK = (DEFAULT_CONFIG, GemmConfig(rm=2, rn=1, vw=4))


@pytest.fixture(scope="module")
def opencl():
    from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

    reason = OpenCLDevice.is_available()
    if reason is not None:
        pytest.skip(f"no OpenCL platform: {reason}")
    return get_opencl_device(0)


@pytest.fixture
def tuning(opencl, tmp_path: Path):
    """The device's GEMM tuning pointed at a private cache file, restored afterwards."""
    opencl.gemm_tuning.reset(tmp_path / "records.jsonl")
    yield opencl.gemm_tuning
    opencl.gemm_tuning.reset()


def test_fast_list_lies_in_the_declared_space():
    space = {knob.name: set(knob.values) for knob in GEMM_SPACE}
    for config in FAST_CONFIGS:
        for name, value in dataclasses.asdict(config).items():
            assert value in space[name], (config, name)
    assert FAST_CONFIGS[0] == DEFAULT_CONFIG


def test_the_default_follows_the_device_type(opencl):
    assert default_config(opencl, 2048, 2048) == (DEFAULT_CONFIG if opencl.is_cpu else GPU_DEFAULT_CONFIG)
    assert default_config(SimpleNamespace(is_cpu=True), 8, 8) == DEFAULT_CONFIG
    gpu = SimpleNamespace(is_cpu=False, compute_units=132)  # an H100's streaming multiprocessors
    assert default_config(gpu, 2048, 2048) == GPU_DEFAULT_CONFIG  # 64 x 32 tiles of 32 x 64
    assert default_config(gpu, 384, 36) == GPU_SMALL_CONFIGS[-1]  # 48 tiles of 8 x 32: the smallest
    assert default_config(gpu, 384, 36, batch=16) == GPU_DEFAULT_CONFIG  # 12 x 16 = 192 groups
    assert default_config(gpu, 1024, 256) == GPU_SMALL_CONFIGS[0]  # 64 x 8 tiles of 16 x 32
    fast = candidates("fast", max_work_group=256, first=GPU_DEFAULT_CONFIG)
    assert fast[0] == GPU_DEFAULT_CONFIG and len(fast) == len(set(fast)) == len(FAST_CONFIGS)
    assert GPU_DEFAULT_CONFIG.local and GPU_DEFAULT_CONFIG.wgm * GPU_DEFAULT_CONFIG.wgn == 64


def test_full_effort_extends_the_fast_list_within_the_work_group_limit():
    fast = candidates("fast", max_work_group=64)
    full = candidates("full", max_work_group=64)
    assert full[: len(fast)] == fast and len(full) > len(fast)
    assert all(c.wgm * c.wgn <= 64 for c in full)
    assert len(set(full)) == len(full)
    assert EFFORTS["full"].budget_seconds > EFFORTS["fast"].budget_seconds


def test_labels_round_trip():
    for config in FAST_CONFIGS:
        assert parse_label(config_label(config)) == config
    with pytest.raises(ValueError):
        parse_label("rm=4,bogus=1")


def test_shape_classes_round_up_to_powers_of_two():
    assert shape_class(61, 3025, 363) == {"m": 64, "n": 4096, "k": 512, "batched": 0}
    assert shape_class(64, 4096, 512, batch=2)["batched"] == 1
    assert gemm_workload(61, 3025, 363) == gemm_workload(64, 4096, 512)
    assert gemm_workload(1, 1, 1).op == GEMM_OP


def test_search_records_every_candidate_and_a_new_device_object_reads_it(opencl, tuning, tmp_path):
    record = search(opencl, 19, 40, 23, 1, "fast", configs=QUICK)
    assert record.chosen in record.candidates and config_label(DEFAULT_CONFIG) in record.candidates
    assert record.kernels == GEMM_SOURCE_HASH
    assert record.fingerprint == opencl.fingerprint()
    assert {"platform", "device", "driver"} <= set(record.fingerprint)
    tuning.cache().add(record)
    line = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[0])
    assert line["op"] == GEMM_OP and line["workload"] == shape_class(19, 40, 23)
    assert line["protocol"]["shape"] == [19, 40, 23, 1]

    fresh = GemmTuning(opencl, tmp_path / "records.jsonl")
    assert fresh.config(30, 33, 20) == parse_label(record.chosen)  # same class
    assert fresh.stats.hits == 1 and fresh.stats.misses == 0
    assert fresh.config(300, 33, 20) == default_config(opencl, 300, 33)  # another class: the default
    assert fresh.stats.misses == 1


def test_records_of_another_driver_or_kernel_source_are_ignored(opencl, tuning, tmp_path):
    path = tmp_path / "records.jsonl"
    record = search(opencl, 9, 9, 9, 1, "fast", configs=QUICK)
    other_driver = dataclasses.replace(record, fingerprint={**record.fingerprint, "driver": "0.0-other"})
    other_source = dataclasses.replace(record, kernels="0123456789abcdef")
    TuningCache(path, other_driver.fingerprint).add(other_driver)
    TuningCache(path, record.fingerprint).add(other_source)
    fresh = GemmTuning(opencl, path)
    assert fresh.cached(gemm_workload(9, 9, 9)) is None
    assert fresh.config(9, 9, 9) == default_config(opencl, 9, 9) and fresh.stats.misses == 1


def test_ensure_searches_once_then_hits(opencl, tuning, monkeypatch):
    calls = []

    def fake_search(device, m, n, k, batch, effort):
        calls.append((m, n, k, batch, effort))
        return search(device, m, n, k, batch, effort, configs=QUICK)

    monkeypatch.setattr("hetflow.devices.opencl.tuning.search", fake_search)
    assert tuning.ensure(5, 6, 7, 1, "none") == default_config(tuning.device, 5, 6) and not calls
    tuning.ensure(5, 6, 7, 1, "fast")
    tuning.ensure(5, 6, 7, 1, "fast")
    assert calls == [(5, 6, 7, 1, "fast")]
    assert tuning.stats.tuned == 1 and tuning.cached(gemm_workload(5, 6, 7)) is not None


def test_a_product_looked_up_before_its_class_was_tuned_gets_the_tuned_configuration(
    opencl, tuning, monkeypatch
):
    tuned = GemmConfig(rm=2, rn=1, vw=4)
    monkeypatch.setattr(
        "hetflow.devices.opencl.tuning.search",
        lambda device, m, n, k, batch, effort: search(device, m, n, k, batch, effort, configs=[tuned]),
    )
    assert tuning.config(5, 6, 7) == default_config(opencl, 5, 6) != tuned
    assert tuning.ensure(5, 6, 7, 1, "fast") == tuned
    assert tuning.config(5, 6, 7) == tuned


def _info(*shape: int) -> TensorInfo:
    return TensorInfo(shape, np.dtype(np.float32))


def test_node_gemms_of_conv_gemm_and_lstm():
    conv = Node("Conv", "c", ["x", "w"], ["y"], attrs=ConvAttrs(pads=(1, 1, 1, 1)))
    products = node_gemms(conv, [_info(2, 8, 10, 12), _info(16, 8, 3, 3)])
    assert (16, 120, 72, 2) in products  # im2col: K x P x C*9, one per image
    assert (16, 2 * 5 * 6, 8, 16) in products  # Winograd F(2,3): 16 products over the tiles
    grouped = Node("Conv", "g", ["x", "w"], ["y"], attrs=ConvAttrs(group=2))
    assert node_gemms(grouped, [_info(1, 8, 5, 5), _info(6, 4, 1, 1)]) == [(3, 25, 4, 2)]
    from hetflow.ops.gemm import GemmAttrs

    fc = Node("Gemm", "fc", ["a", "b"], ["y"], attrs=GemmAttrs(transB=1))
    assert node_gemms(fc, [_info(3, 20), _info(7, 20)]) == [(3, 7, 20, 1)]
    from hetflow.ops.rnn import LSTMAttrs

    lstm = Node("LSTM", "l", ["x", "w", "r"], ["y"], attrs=LSTMAttrs(hidden_size=4))
    # A small batch runs its steps in the fused kernel: only the input projection is a GEMM.
    assert node_gemms(lstm, [_info(6, 2, 3), _info(1, 16, 3), _info(1, 16, 4)]) == [(12, 16, 3, 1)]
    from hetflow.devices.opencl.kernels.lstm import FUSED_MAX_BATCH

    big = FUSED_MAX_BATCH + 1
    assert node_gemms(lstm, [_info(6, big, 3), _info(1, 16, 3), _info(1, 16, 4)]) == [(6 * big, 16, 3, 1), (big, 16, 4, 1)]


def test_tune_gemms_with_no_effort_measures_nothing(opencl, tuning, zoo_home):
    session = hetflow.InferenceSession("zoo:lenet", device="opencl:0")
    bound = bind_batch(session.graph, {"N": 1})
    rows = tune_gemms(bound, opencl, "none")
    assert rows and all(row.source == "default" and row.record is None for row in rows)
    assert not (tuning.path).exists()
    with pytest.raises(ValueError):
        tune_gemms(bound, opencl, "thorough")


def test_session_with_tune_searches_missing_classes_through_the_planner(opencl, tuning, zoo_home, monkeypatch):
    searched = []

    def quick(device, m, n, k, batch, effort):
        searched.append((m, n, k, batch))
        return search(device, m, n, k, batch, effort, configs=QUICK)

    monkeypatch.setattr("hetflow.devices.opencl.tuning.search", quick)
    session = hetflow.InferenceSession("zoo:lenet", device="opencl:0", tune=True)
    session.run(None, {session.get_inputs()[0].name: np.zeros((1, 1, 28, 28), np.float32)})
    assert searched
    assert opencl.tuning_stats()["tuned"] == len(searched)
    records = TuningCache(tuning.path, opencl.fingerprint()).records()
    assert {r.workload.op for r in records} == {GEMM_OP}


def test_cli_tune_with_no_effort_reports_the_gemm_classes(opencl, tuning, zoo_home, capsys):
    from hetflow.cli import main

    assert main(["tune", "zoo:lenet", "--device", "opencl:0", "--effort", "none"]) == 0
    out = capsys.readouterr().out
    assert "GEMM configurations on opencl:0" in out and "effort none" in out
    assert "miss(es)" in out and "0 searched now" in out


def test_timed_calls_stage_inputs_once_and_leave_results_on_the_device(opencl):
    # A discrete GPU's copy path: a timed call must hold the algorithm, not a PCIe round trip.
    from hetflow.devices.opencl import OpenCLDevice
    from hetflow.tuning.measure import measure, random_inputs
    from hetflow.tuning.space import tunable_kernels

    device = OpenCLDevice(opencl.index, unified=False)
    conv = Node("Conv", "c", ["x", "w"], ["y"], attrs=ConvAttrs(pads=(1, 1, 1, 1)))
    infos = [_info(1, 8, 12, 12), _info(16, 8, 3, 3)]
    kernels = tunable_kernels(device, conv, infos)
    assert len(kernels) > 1
    arrays = random_inputs(infos)
    for kernel in kernels:
        call = device.timed_call(kernel, conv, arrays)
        call()  # the weights' first upload (resident from then on)
        moved = (device.transfers.copied_in, device.transfers.copied_out)
        for _ in range(3):
            call()
        assert (device.transfers.copied_in, device.transfers.copied_out) == moved, kernel.algorithm
    results = measure(kernels, conv, infos, device=device)
    assert all(r.seconds is not None and r.seconds > 0 for r in results), results


def test_without_the_cost_models_algorithm_opencl_runs_its_stand_in(opencl, tmp_path: Path):
    """The cost model picks F(4,3) and 1x1 GEMMs that only the CPU implements; OpenCL runs F(2,3) and
    im2col instead (``ALGORITHM_FALLBACK``), and ``tune``'s untuned column names what actually runs."""
    from hetflow.ops.conv import IM2COL, WINOGRAD_F23
    from hetflow.runtime.planner import make_plan
    from hetflow.tuning.measure import MeasureOptions
    from hetflow.tuning.select import Tuner, tune_graph
    from tests.helpers import make_model

    rng = np.random.default_rng(9)
    nodes = [
        helper.make_node("Conv", ["x", "w3"], ["a"], name="three", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w1"], ["y"], name="one"),
    ]
    weights = {"w3": rng.standard_normal((64, 64, 3, 3)).astype(np.float32),
               "w1": rng.standard_normal((8, 64, 1, 1)).astype(np.float32)}  # fmt: skip
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 64, 56, 56])], [("y", TensorProto.FLOAT, None)], weights)
    graph = hetflow.InferenceSession(model, optimize=False).graph
    untuned = {s.node.name: s.kernel.algorithm for s in make_plan(graph, [opencl]).steps}
    assert untuned == {"three": WINOGRAD_F23, "one": IM2COL}
    options = MeasureOptions(warmup=0, repeats=1, min_seconds=0.0, max_repeats=1)
    tuner = Tuner(tune=True, options=options, path=tmp_path / "records.jsonl")
    layers = tune_graph(graph, opencl, tuner)
    assert {layer.node.name: layer.heuristic for layer in layers} == untuned
