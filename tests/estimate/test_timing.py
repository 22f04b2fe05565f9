"""Amortised timing: the settle phase given to calls that split on hetflow's Python pool."""

from __future__ import annotations

import time

from hetflow.devices.cpu.threads import parallel_for, pool_handoffs
from hetflow.estimate.timing import SETTLE_SECONDS, amortised_seconds, timed_first_call


def test_pool_handoffs_counts_calls_that_use_the_pool_threads():
    before = pool_handoffs()
    parallel_for(lambda index: None, 4, threads=2)
    assert pool_handoffs() == before + 1
    parallel_for(lambda index: None, 4, threads=1)  # runs on the caller alone: no hand-off
    parallel_for(lambda index: None, 1, threads=2)
    assert pool_handoffs() == before + 1


def test_a_call_that_splits_on_the_pool_is_given_the_settle_phase():
    seconds, settle = timed_first_call(lambda: parallel_for(lambda index: None, 2, threads=2))
    assert settle == SETTLE_SECONDS and seconds > 0
    seconds, settle = timed_first_call(lambda: sum(range(100)))
    assert settle == 0.0 and seconds > 0


def test_amortised_seconds_runs_the_settle_phase_untimed():
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        time.sleep(0.001)

    started = time.perf_counter()
    seconds = amortised_seconds(call, min_time=0.002, rounds=1, first_seconds=0.001, settle=0.05)
    elapsed = time.perf_counter() - started
    # Two timed calls (min_time / first_seconds); the rest settled, and not counted in the time per call.
    assert elapsed >= 0.05 and calls >= 2 + 10
    assert 0.001 <= seconds < 0.01


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_short_rounds_time_a_call_as_its_fastest_runs_and_spend_the_same_budget():
    """Every other call slowed 5x (a disturbed machine): rounds of ``min_time`` average the slow calls in,
    short rounds (``round_seconds``, what the CPU's layers are timed with) find the fast ones, in about
    the same time; a device's layers keep the long rounds (``layer_rounds``)."""
    from types import SimpleNamespace

    from hetflow.estimate.timing import SHORT_ROUND_SECONDS, layer_rounds

    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        _busy(0.0005 if calls % 2 else 0.0001)

    long = amortised_seconds(call, min_time=0.01, rounds=3)
    started = time.perf_counter()
    short = amortised_seconds(call, min_time=0.01, rounds=3, round_seconds=0.00005)
    elapsed = time.perf_counter() - started
    assert long > 0.00025 and short < 0.00018 and 0.025 <= elapsed < 0.1
    assert layer_rounds(SimpleNamespace(kind="cpu")) == SHORT_ROUND_SECONDS
    assert layer_rounds(SimpleNamespace(kind="opencl")) is None


def _fully_connected(batch: int, inputs: int, outputs: int):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((outputs, inputs)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(outputs).astype(np.float32), "b")
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)
    graph = helper.make_graph(
        [node], "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, outputs])], [w, b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_weight_positions_are_the_inputs_that_are_initializers():
    from hetflow.estimate.timing import weight_positions
    from hetflow.frontends import load_model

    graph = load_model(_fully_connected(16, 32, 8))
    assert weight_positions(graph.nodes[0], graph) == (1, 2)


def test_a_timed_call_binds_the_weights_as_a_run_does():
    """A Gemm at a batch runs on the dense kernel over a packed copy of its weights only where it is
    bound to them as weights: a timed call told which inputs are weights takes that path (its panels
    get packed), one that is not told falls back to BLAS, and both compute the same product."""
    import numpy as np

    from hetflow.devices.cpu.kernels import dense
    from hetflow.devices.registry import get_device
    from hetflow.estimate.timing import weight_positions
    from hetflow.frontends import load_model
    from hetflow.ops.base import WeightInfo, array_infos

    graph = load_model(_fully_connected(16, 800, 500))
    node = graph.nodes[0]
    device = get_device("cpu")
    arrays = [np.random.default_rng(1).standard_normal((16, 800)).astype(np.float32),
              graph.initializers["w"], graph.initializers["b"]]
    infos = array_infos(arrays, weight_positions(node, graph))
    assert isinstance(infos[1], WeightInfo) and not isinstance(infos[0], WeightInfo)
    kernel = device.kernels.lookup(node, infos)
    dense.PANELS.clear()
    plain = device.timed_call(kernel, node, arrays)()
    assert dense.PANELS.nbytes() == 0
    as_run = device.timed_call(kernel, node, arrays, weights=weight_positions(node, graph))()
    assert dense.PANELS.nbytes() > 0
    expected = arrays[0] @ arrays[1].T + arrays[2]
    np.testing.assert_allclose(plain[0], expected, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(as_run[0], expected, rtol=1e-4, atol=1e-3)
