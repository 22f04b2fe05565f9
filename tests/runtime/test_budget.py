"""memory_budget: Winograd off, weights streamed from disk largest-resident-first, the promise measured."""

from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

import hetflow
from hetflow.errors import BudgetError
from hetflow.ops.conv import WINOGRAD_TILE
from hetflow.runtime.budget import choose_streamed, transformed_weight_bytes
from hetflow.runtime.executor import compiled
from hetflow.zoo import model_path

pytestmark = pytest.mark.usefixtures("zoo_home")


def _feed(session: hetflow.InferenceSession, seed: int = 0) -> dict[str, np.ndarray]:
    arg = session.get_inputs()[0]
    shape = [1 if isinstance(d, str) else d for d in arg.shape]
    return {arg.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def _large(snapshot: tracemalloc.Snapshot, floor: int = 16 * 1024) -> int:
    """Bytes held in allocations of at least ``floor`` bytes: tensors, not Python bookkeeping."""
    return sum(trace.size for trace in snapshot.traces if trace.size >= floor)


def _held_by(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int = 6) -> str:
    """Where the large allocations made between two snapshots were made: for a failing test's message."""
    grown = [stat for stat in after.compare_to(before, "traceback") if stat.size_diff >= 16 * 1024]
    return "\n".join(f"{stat.size_diff} B in {stat.count_diff}:\n" + "\n".join(stat.traceback.format()) for stat in grown[:top])


def _measure(
    path: str, feed: dict[str, np.ndarray], **options: object
) -> tuple[hetflow.InferenceSession, int, str]:
    """A session made and warmed under tracemalloc: the tensor bytes it holds plus what a run adds, and
    where the held bytes were allocated."""
    gc.collect()
    tracemalloc.start(12)
    try:
        before = tracemalloc.take_snapshot()
        session = hetflow.InferenceSession(path, **options)
        session.run(None, feed)
        gc.collect()
        after = tracemalloc.take_snapshot()
        held = _large(after) - _large(before)
        now = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        session.run(None, feed)
        transient = tracemalloc.get_traced_memory()[1] - now
    finally:
        tracemalloc.stop()
    return session, held + transient, _held_by(before, after)


def test_choose_streamed_keeps_the_largest_resident_first():
    weights = {"a": 100, "b": 50, "c": 30}
    layers = [["x", "a"], ["b"], ["c"]]
    # Everything streamed needs 100 + 100; keeping a leaves b (50) as the largest streamed layer.
    assert choose_streamed(weights, layers, 100, 250) == {"b", "c"}
    assert choose_streamed(weights, layers, 100, 10_000) == frozenset()
    assert choose_streamed(weights, layers, 100, 200) == {"a", "b", "c"}
    with pytest.raises(BudgetError, match="cannot be met"):
        choose_streamed(weights, layers, 100, 199)


def test_a_budget_under_the_weights_streams_them_and_is_never_exceeded(ci_cores):
    path = str(model_path("squeezenet"))
    reference = hetflow.InferenceSession(path)
    feed = _feed(reference)
    [expected] = reference.run(None, feed)
    report = reference.memory_report(1)
    budget = report.arena_bytes + report.weights_bytes // 2 + 512 * 1024
    del reference

    free, free_bytes, _ = _measure(path, feed)
    assert free_bytes > budget  # without a budget the session would break the promise
    del free
    # Warm-up: a budgeted session's first run may compile kernels (after a kernel source changed, the
    # cache is empty), and numba's compiles would count as the measured session's allocations.
    hetflow.InferenceSession(path, memory_budget=budget).run(None, feed)
    session, used, sites = _measure(path, feed, memory_budget=budget)
    residency = session.residency(1)
    assert residency is not None and residency.streamed_bytes > 0 and residency.resident_bytes > 0
    # Mapped weights are not allocations: while their layer runs they count as planned.
    assert used + residency.stream_peak_bytes <= budget, f"{used} B used, {residency}; held:\n{sites}"
    assert residency.planned_bytes <= budget
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-4, atol=1e-6)

    plan = session.plan_for({"N": 1})
    assert plan.streamed
    program = compiled(plan, tuple(v.name for v in session.get_outputs()))
    # Streamed weights are not held by the program nor, as arrays, by the graph.
    for name in plan.streamed:
        assert program.template[program.slots[name]] is None
        assert isinstance(session.graph.initializers[name], np.memmap)
    # Largest first: weights were kept resident from the largest down while they fit, so some resident
    # weight is at least as large as the smallest streamed one.
    sizes = {n: a.nbytes for n, a in plan.graph.initializers.items()}
    resident = [n for n in sizes if n not in plan.streamed]
    assert max(sizes[n] for n in resident) >= min(sizes[n] for n in plan.streamed)


def test_budget_strings_and_sizes():
    path = str(model_path("lenet"))
    assert hetflow.InferenceSession(path, memory_budget="64MB").residency(1).streamed_bytes == 0
    assert hetflow.InferenceSession(path, memory_budget=64 * 2**20).residency(1).budget == 64 * 2**20
    with pytest.raises(ValueError, match="memory size"):
        hetflow.InferenceSession(path, memory_budget="lots")


def test_a_budget_too_small_even_for_streaming_is_a_clear_error():
    with pytest.raises(BudgetError, match=r"cannot be met: .* even when every weight is streamed"):
        hetflow.InferenceSession(str(model_path("squeezenet")), memory_budget="1MB")


def test_a_larger_batch_that_cannot_fit_raises_on_its_first_run():
    path = str(model_path("squeezenet"))
    report = hetflow.InferenceSession(path).memory_report(1)
    session = hetflow.InferenceSession(path, memory_budget=report.arena_bytes + report.weights_bytes + 2**20)
    arg = session.get_inputs()[0]
    big = np.zeros([8 if isinstance(d, str) else d for d in arg.shape], np.float32)
    with pytest.raises(BudgetError):
        session.run(None, {arg.name: big})


def test_winograd_is_dropped_first_when_its_transforms_do_not_fit():
    path = str(model_path("resnet50"))
    free = hetflow.InferenceSession(path)
    plan = free.plan_for({"N": 1})
    transformed = transformed_weight_bytes(plan)
    assert transformed > 0 and any(s.kernel.algorithm in WINOGRAD_TILE for s in plan.steps)
    report = free.memory_report(1)
    budget = report.weights_bytes + report.arena_bytes + 2**20  # no room for the transforms
    session = hetflow.InferenceSession(path, memory_budget=budget)
    residency = session.residency(1)
    assert residency.winograd_off and residency.transformed_bytes == 0
    fitted = session.plan_for({"N": 1})
    assert not any(s.kernel.algorithm in WINOGRAD_TILE for s in fitted.steps)
    assert residency.planned_bytes <= budget


def test_the_scratch_file_goes_with_the_session(ci_cores):
    path = str(model_path("squeezenet"))
    report = hetflow.InferenceSession(path).memory_report(1)
    session = hetflow.InferenceSession(path, memory_budget=report.arena_bytes + report.weights_bytes // 2 + 2**19)
    plan = session.plan_for({"N": 1})
    scratch = next(iter(plan.streamed.values())).path
    assert os.path.exists(scratch)
    del session, plan
    gc.collect()
    assert not os.path.exists(scratch)
