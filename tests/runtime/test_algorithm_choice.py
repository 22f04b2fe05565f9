"""Per-layer algorithm choice: cached measurements first, cost model otherwise, plans per batch size,
``tune=True`` and ``hetflow tune``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.cli import main
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu import threads as cpu_threads
from hetflow.devices.cpu.kernels import jit_gemm
from hetflow.frontends import load_model
from hetflow.options import HOME_ENV
from hetflow.passes import bind_batch
from hetflow.runtime import executor
from hetflow.runtime.executor import ThreadArrangement
from hetflow.runtime.planner import input_infos, make_plan, run_arrangement
from hetflow.tuning import select
from hetflow.tuning.cache import TuningCache, TuningRecord, cache_path, kernels_hash
from hetflow.tuning.measure import MeasureOptions
from hetflow.tuning.select import Tuner, in_arrangement, tune_graph
from hetflow.tuning.space import tunable_kernels, workload_of
from tests.helpers import make_model, run_onnxruntime

WIDE, NARROW = "wide", "narrow"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty HETFLOW_HOME (tuning cache, zoo builds)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    return tmp_path


def two_conv_model() -> onnx.ModelProto:
    """A 3x3 conv wide and large enough for Winograd (128 -> 128 at 28x28) then a narrow one (128 -> 8)."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": (rng.standard_normal((128, 128, 3, 3)) * 0.05).astype(np.float32),
        "b1": rng.standard_normal(128).astype(np.float32),
        "w2": (rng.standard_normal((8, 128, 3, 3)) * 0.05).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h"], name=WIDE, pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Conv", ["r", "w2"], ["y"], name=NARROW, kernel_shape=[3, 3]),
    ]
    model = make_model(nodes, [("x", TensorProto.FLOAT, ["N", 128, 28, 28])], [("y", TensorProto.FLOAT, None)],
                       weights)
    model.ir_version = 8
    return model


def _bound_graph(batch: int = 1):
    return bind_batch(load_model(two_conv_model()), {"N": batch})


def _algorithms(plan) -> dict[str, str]:
    return {s.node.name: s.kernel.algorithm for s in plan.steps if s.node.op_type == "Conv"}


def _record_for(
    graph, node_name: str, times: dict[str, float], fingerprint=None, arrangement: ThreadArrangement | None = None
) -> TuningRecord:
    """A record of ``times`` for the node, timed in ``arrangement`` (the one a run of ``graph`` holds)."""
    device = CPUDevice()
    node = graph.node(node_name)
    inputs = input_infos(graph, node)
    kernels = tunable_kernels(device, node, inputs)
    return TuningRecord(
        fingerprint=fingerprint or device.fingerprint(),
        device="cpu",
        workload=in_arrangement(workload_of(node, inputs), device, arrangement or run_arrangement(graph)),
        kernels=kernels_hash(kernels),
        candidates=times,
        chosen=min(times, key=times.__getitem__),
    )


def test_without_measurements_the_cost_model_chooses():
    """Winograd for the wide layer; the narrow one's 8 kernels make a thin GEMM: the direct kernel."""
    plan = make_plan(_bound_graph(), [CPUDevice()])
    assert _algorithms(plan) == {WIDE: "winograd_f43", NARROW: "direct_fma"}


def test_a_symbolic_plan_dispatches_at_run_time():
    plan = make_plan(load_model(two_conv_model()), [CPUDevice()])
    assert set(_algorithms(plan).values()) == {"auto"}


def test_the_cached_fastest_wins_over_the_cost_model():
    graph = _bound_graph()
    cache = TuningCache(cache_path(), CPUDevice().fingerprint())
    cache.add(_record_for(graph, WIDE, {"im2col": 0.001, "winograd_f43": 0.002, "winograd_f23": 0.003}))
    cache.add(_record_for(graph, NARROW, {"im2col": 0.002, "winograd_f23": 0.001}))
    plan = make_plan(graph, [CPUDevice()], Tuner())
    assert _algorithms(plan) == {WIDE: "im2col", NARROW: "winograd_f23"}
    # Without a tuner the planner reads no file: the cost model again.
    assert _algorithms(make_plan(graph, [CPUDevice()])) == {WIDE: "winograd_f43", NARROW: "direct_fma"}


def test_records_of_another_machine_fall_back_to_the_cost_model():
    graph = _bound_graph()
    elsewhere = {"kind": "cpu", "processor": "elsewhere"}
    TuningCache(cache_path(), elsewhere).add(_record_for(graph, WIDE, {"im2col": 0.001, "winograd_f43": 0.002},
                                                         fingerprint=elsewhere))
    assert _algorithms(make_plan(graph, [CPUDevice()], Tuner()))[WIDE] == "winograd_f43"


def test_a_recorded_algorithm_that_no_longer_applies_is_skipped():
    graph = _bound_graph()
    TuningCache(cache_path(), CPUDevice().fingerprint()).add(
        _record_for(graph, WIDE, {"gone": 0.0001, "im2col": 0.001, "winograd_f43": 0.002})
    )
    assert _algorithms(make_plan(graph, [CPUDevice()], Tuner()))[WIDE] == "im2col"


def test_a_record_timed_in_other_threads_does_not_decide():
    """A batch of this graph runs on the spinning pool or hetflow's own threads; a record timed on BLAS's
    says nothing of it."""
    graph = _bound_graph(batch=16)
    assert run_arrangement(graph).kind in ("spin", "own")
    TuningCache(cache_path(), CPUDevice().fingerprint()).add(_record_for(
        graph, WIDE, {"im2col": 0.001, "winograd_f43": 0.002}, arrangement=ThreadArrangement("blas", 2)))
    assert _algorithms(make_plan(graph, [CPUDevice()], Tuner()))[WIDE] == "winograd_f43"
    # The same times recorded in the run's arrangement decide.
    TuningCache(cache_path(), CPUDevice().fingerprint()).add(
        _record_for(graph, WIDE, {"im2col": 0.001, "winograd_f43": 0.002}))
    assert _algorithms(make_plan(graph, [CPUDevice()], Tuner()))[WIDE] == "im2col"


@pytest.mark.parametrize(
    ("batch", "threads", "kind"),
    [(16, 2, "spin" if jit_gemm.available() and executor.BATCHES_SPIN else "own"), (16, 1, "blas"),
     (2, 2, "spin" if jit_gemm.available() else "blas")],
)
def test_tuning_measures_in_the_threads_a_run_holds(monkeypatch: pytest.MonkeyPatch, batch, threads, kind):
    """A batch multiplies on the spinning pool (without one, a large network's on hetflow's own threads,
    BLAS at one): its candidates are timed there, and the records say so."""
    owned = kind != "blas"
    seen: list[bool] = []

    def spy(*args, **kwargs):
        seen.append(cpu_threads.owns_threads())
        return measure(*args, **kwargs)

    measure = select.measure
    monkeypatch.setattr(select, "measure", spy)
    graph = _bound_graph(batch)
    tuner = Tuner(tune=True, options=MeasureOptions(warmup=1, repeats=1, min_seconds=0.0))
    layers = tune_graph(graph, CPUDevice(), tuner, threads=threads)
    assert seen == [owned, owned]
    label = run_arrangement(graph, threads).label
    assert {layer.record.workload.params["threads"] for layer in layers} == {label}
    assert label.startswith(f"{kind}:")
    assert not cpu_threads.owns_threads()  # released after tuning


def test_session_plans_per_batch_and_reads_the_cache():
    graph = _bound_graph(batch=2)
    TuningCache(cache_path(), CPUDevice().fingerprint()).add(
        _record_for(graph, WIDE, {"im2col": 0.001, "winograd_f43": 0.002})
    )
    model = two_conv_model()
    session = hetflow.InferenceSession(model)
    x = np.random.default_rng(1).standard_normal((2, 128, 28, 28)).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    (expected,) = run_onnxruntime(model, {"x": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    assert _algorithms(session.plan_for({"N": 2}))[WIDE] == "im2col"  # the record for batch 2
    assert _algorithms(session.plan_for({"N": 1}))[WIDE] == "winograd_f43"  # none for batch 1
    assert session.plan_for({"N": 2}) is session.plan_for({"N": 2})
    assert _algorithms(session.plan)[WIDE] == "auto"


def test_no_measurement_unless_tune_is_asked_for():
    model = two_conv_model()
    x = np.zeros((1, 128, 28, 28), np.float32)
    hetflow.InferenceSession(model).run(None, {"x": x})
    assert not cache_path().exists()
    session = hetflow.InferenceSession(model, tune=True)
    session._tuner.options = MeasureOptions(warmup=1, repeats=1, min_seconds=0.0)  # keep the test fast
    session.run(None, {"x": x})
    records = TuningCache(cache_path(), CPUDevice().fingerprint()).records()
    assert len(records) == 2
    chosen = _algorithms(session.plan_for({"N": 1}))
    by_shape = {r.workload.params["w"][0]: r.chosen for r in records}
    assert chosen == {WIDE: by_shape[128], NARROW: by_shape[8]}
    # A second tuned session finds the records and measures nothing more.
    hetflow.InferenceSession(model, tune=True).run(None, {"x": x})
    assert len(cache_path().read_text().splitlines()) == 2


def test_a_session_reads_and_records_in_the_tuning_cache_it_is_given(tmp_path: Path):
    model = two_conv_model()
    x = np.zeros((1, 128, 28, 28), np.float32)
    own = tmp_path / "own" / "records.jsonl"
    session = hetflow.InferenceSession(model, tune=True, tuning_cache=own)
    session._tuner.options = MeasureOptions(warmup=1, repeats=1, min_seconds=0.0)  # keep the test fast
    session.run(None, {"x": x})
    assert len(own.read_text().splitlines()) == 2 and not cache_path().exists()
    reader = hetflow.InferenceSession(model, tuning_cache=own)
    reader.run(None, {"x": x})
    assert reader.tuning_report()["algorithms"] == {"hits": 2, "misses": 0, "measured": 0}
    assert _algorithms(reader.plan_for({"N": 1})) == _algorithms(session.plan_for({"N": 1}))
    # A cache file that does not exist reads as empty and is not created without tune.
    fresh = hetflow.InferenceSession(model, tuning_cache=tmp_path / "none.jsonl")
    fresh.run(None, {"x": x})
    assert fresh.tuning_report()["algorithms"]["measured"] == 0 and not (tmp_path / "none.jsonl").exists()


def test_tune_command_writes_records_and_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture):
    path = tmp_path / "two_conv.onnx"
    onnx.save(two_conv_model(), str(path))
    assert main(["tune", str(path), "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert WIDE in out and NARROW in out and "winograd_f43" in out and "predicted gain" in out
    records = TuningCache(cache_path(), CPUDevice().fingerprint()).records()
    assert {tuple(r.workload.params["x"]) for r in records} == {(2, 128, 28, 28), (2, 128, 28, 28)}
    assert len(records) == 2
    wide = next(r for r in records if r.workload.params["w"][0] == 128)
    assert set(wide.candidates) == {"im2col", "winograd_f23", "winograd_f43", "direct_fma"}


def test_tune_command_on_a_zoo_model(capsys: pytest.CaptureFixture):
    assert main(["tune", "zoo:cifar10-quick", "--batch", "1"]) == 0
    assert "conv" in capsys.readouterr().out
    records = TuningCache(cache_path(), CPUDevice().fingerprint()).records()
    assert len(records) == 3
    # Its 5x5 layers: im2col or the direct kernel, whichever measured faster.
    for record in records:
        assert record.workload.params["x"][0] == 1
        assert set(record.candidates) == {"im2col", "direct_fma"}
        assert record.chosen == min(record.candidates, key=record.candidates.__getitem__)


@pytest.mark.parametrize(
    ("channels", "kernels", "side", "batch", "expected"),
    [
        (64, 64, 16, 1, "direct_fma"),  # 9.4 M multiply-adds: one image runs direct
        (64, 64, 16, 16, "direct_fma"),  # a batch: direct where one image would take im2col
        (512, 512, 7, 16, "direct_fma"),
        (128, 128, 14, 16, "winograd_f43"),  # a batch keeps Winograd where it fits; deep: F(4,3) from 14x14
        (112, 224, 14, 16, "winograd_f23"),  # under F43_MIN_CHANNELS_DEEP_BATCH input channels
        (512, 512, 14, 16, "winograd_f23"),  # past F43_MAX_CHANNELS_DEEP_BATCH: F(4,3)'s weights 4x the raw
        (512, 512, 28, 16, "winograd_f43"),  # from 24x24 the channel cap does not apply
        (256, 256, 14, 1, "winograd_f23"),  # one image: F(4,3) from 24x24 only
        (64, 64, 56, 16, "direct_fma"),  # few channels: F(4,3)'s transforms outweigh its savings
        (64, 96, 28, 16, "direct_fma"),
        (96, 96, 28, 16, "winograd_f43"),  # harmonic mean 96: past DIRECT_OVER_F43_MAX_MEAN
        (64, 192, 56, 16, "winograd_f43"),
        (64, 64, 224, 16, "winograd_f43"),  # maps past DIRECT_OVER_F43_MAX_SIDE
        (64, 64, 56, 1, "winograd_f43"),  # one image: 116 M multiply-adds
        (224, 224, 7, 1, "direct_fma"),  # wide channels, small map: 22 M
        (512, 512, 7, 1, "im2col"),  # 116 M
        (128, 32, 56, 1, "winograd_f43"),  # thin, but 116 M and Winograd fits
        (128, 32, 56, 16, "direct_fma"),  # thin at a batch
        (112, 224, 13, 1, "direct_fma"),  # 38 M: under DIRECT_MAX_MACS_ONE_IMAGE
        (128, 256, 14, 1, "winograd_f23"),  # 58 M
    ],
)
def test_the_cost_model_runs_small_layers_direct(channels, kernels, side, batch, expected, monkeypatch):
    """The cost model where Winograd's transforms run as loops (a CPU without AVX-512's gathers)."""
    from hetflow.ops import conv
    from hetflow.ops.conv import ConvAttrs, conv_window, heuristic_conv_algorithm

    monkeypatch.setattr(conv, "_winograd_in_lanes", lambda dtype: False)

    spec = conv_window(ConvAttrs(pads=(1, 1, 1, 1)), (kernels, channels, 3, 3))
    shape = (batch, channels, side, side)
    assert heuristic_conv_algorithm(spec, shape, kernels, 1, np.dtype(np.float32)) == expected
    if expected == "direct_fma":  # without X's dtype the direct kernel is not considered
        assert heuristic_conv_algorithm(spec, shape, kernels, 1) in ("im2col", "winograd_f23", "winograd_f43")


@pytest.mark.parametrize(
    ("channels", "kernels", "side", "batch", "expected"),
    [
        (64, 64, 16, 1, "winograd_f43"),  # 16 tiles of F(4,3): one whole vector of the products
        (16, 64, 55, 1, "winograd_f43"),  # SqueezeNet's expand layer: 16 channels are enough
        (8, 64, 55, 1, None),  # fewer are not
        (64, 128, 8, 1, None),  # 4 tiles of F(4,3), 16 of F(2,3) but under LANES_F23_MIN_CHANNELS
        (64, 128, 8, 16, "winograd_f43"),  # a batch's 64 tiles fill F(4,3)'s vectors
        (512, 512, 7, 1, "winograd_f23"),  # one image's 7x7: F(2,3)'s 16 tiles
        (512, 512, 7, 16, "winograd_f23"),  # F(4,3) multiplies fewer vectors, but its weights are 4x
        (160, 320, 6, 1, None),  # 9 tiles of F(2,3): the direct kernel
        (160, 320, 6, 16, "winograd_f23"),  # a tie in vectors goes to F(2,3)
        (256, 256, 14, 1, "winograd_f43"),
        (512, 512, 14, 1, "winograd_f23"),  # past F43_MAX_CHANNELS_DEEP_BATCH below 24x24
        (512, 512, 28, 16, "winograd_f43"),
    ],
)
def test_lanes_winograd_takes_the_layers_whose_products_fill_vectors(channels, kernels, side, batch, expected):
    from hetflow.ops.conv import lanes_winograd

    assert lanes_winograd((side, side), batch, channels, kernels) == expected


def test_the_cost_model_takes_lanes_winograd_where_the_transforms_run_in_lanes(monkeypatch):
    from hetflow.ops import conv
    from hetflow.ops.conv import ConvAttrs, conv_window, heuristic_conv_algorithm

    monkeypatch.setattr(conv, "_winograd_in_lanes", lambda dtype: True)
    spec = conv_window(ConvAttrs(pads=(1, 1, 1, 1)), (64, 64, 3, 3))
    assert heuristic_conv_algorithm(spec, (1, 64, 16, 16), 64, 1, np.dtype(np.float32)) == "winograd_f43"
    assert heuristic_conv_algorithm(spec, (1, 64, 8, 8), 64, 1, np.dtype(np.float32)) == "direct_fma"
    strided = conv_window(ConvAttrs(pads=(1, 1, 1, 1), strides=(2, 2)), (64, 64, 3, 3))
    assert heuristic_conv_algorithm(strided, (1, 64, 16, 16), 64, 1, np.dtype(np.float32)) != "winograd_f43"


@pytest.mark.parametrize(
    ("channels", "kernels", "side", "batch", "residual", "activation", "expected"),
    [
        (192, 64, 14, 1, False, "Relu", "direct_fma"),  # one image, X in L2, whole vectors: direct
        (144, 32, 28, 1, False, None, "direct_fma"),
        (256, 64, 32, 1, False, "Relu", "direct_fma"),  # X exactly POINTWISE_DIRECT_MAX_X_BYTES
        (96, 24, 56, 1, False, None, "pointwise"),  # X 1.2 MB: past L2, re-read per block of kernels
        (576, 160, 7, 1, False, None, "pointwise"),  # 49 of 64 lanes: the lanes variant, slower
        (192, 64, 14, 1, True, "Relu", "pointwise"),  # a folded residual: the tile GEMM adds it
        (192, 64, 14, 1, False, "Clip", "pointwise"),  # Relu6 would run after the direct kernel
        (192, 64, 14, 16, False, "Relu", "pointwise"),  # a batch keeps the tile GEMM
    ],
)
def test_one_images_1x1_layers_run_direct_where_x_stays_in_l2(
    channels, kernels, side, batch, residual, activation, expected
):
    from hetflow.ops.conv import ConvAttrs, conv_window, heuristic_conv_algorithm

    spec = conv_window(ConvAttrs(), (kernels, channels, 1, 1))
    shape = (batch, channels, side, side)
    chosen = heuristic_conv_algorithm(spec, shape, kernels, 1, np.dtype(np.float32), residual, activation)
    assert chosen == expected
    assert heuristic_conv_algorithm(spec, shape, kernels, 1, None, residual, activation) == "pointwise"


def test_a_1x1_layer_run_direct_matches_onnx_runtime():
    rng = np.random.default_rng(3)
    weights = {"w": rng.standard_normal((48, 96, 1, 1)).astype(np.float32),
               "b": rng.standard_normal(48).astype(np.float32)}  # fmt: skip
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [("x", TensorProto.FLOAT, [1, 96, 13, 13])], [("y", TensorProto.FLOAT, None)], weights)
    x = rng.standard_normal((1, 96, 13, 13)).astype(np.float32)
    session = hetflow.InferenceSession(model)
    assert [step.kernel.algorithm for step in session.plan_for({}).steps] == ["direct_fma"]
    np.testing.assert_allclose(session.run(None, {"x": x})[0], run_onnxruntime(model, {"x": x})[0],
                               rtol=1e-4, atol=1e-4)  # fmt: skip
