"""Check an estimate against the device: time every layer and the whole model, measure the memory peak.

Per layer, Augur's overhead-free method: one forward pass supplies every layer's real inputs, then each
layer alone is warmed up and run many times between two clock reads (one synchronisation), and the
fastest round of two such passes counts, one pass before and one after the whole model is timed. Each
call is the device's ``timed_call``, as a run makes it: on the CPU the kernel writes into outputs and a
workspace allocated once, as the arena's are, under the threads a run of the plan holds. The whole
model is timed as users see it, ``session.run`` end to end, the minimum over several runs, counted
once some ran with the cores' L3 shared (``model_seconds``; the VM's slow spells). The memory
peak is what tracemalloc sees numpy allocate during one (warm) run: activations and scratch, not the
weights or the caller's inputs, which exist before the run starts.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.estimate.predict import Estimate, batch_bindings
from hetflow.estimate.spells import CacheProbe, process_probe
from hetflow.estimate.timing import (
    amortised_seconds,
    layer_rounds,
    replay,
    timed_first_call,
    weight_positions,
)
from hetflow.graph import Node
from hetflow.runtime.executor import (
    holds_batch,
    memory_plan,
    plan_conv_work,
    plan_recurrent_batch,
    run_threads,
)
from hetflow.runtime.session import InferenceSession


def random_feeds(session: InferenceSession, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the session's declared shapes, symbolic dimensions set to ``batch``."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in session.graph.input_values():
        shape = [d if isinstance(d, int) else batch for d in value.shape or ()]
        if value.dtype.kind == "f":
            feeds[value.name] = rng.standard_normal(shape).astype(value.dtype)
        elif value.dtype.kind in "iu":
            feeds[value.name] = rng.integers(0, 10, size=shape).astype(value.dtype)
        else:
            feeds[value.name] = np.zeros(shape, dtype=value.dtype)
    return feeds


def layer_seconds(
    session: InferenceSession,
    feeds: Mapping[str, np.ndarray],
    *,
    min_time: float = 0.05,
    rounds: int = 3,
) -> dict[str, float]:
    """Seconds per call of every step of the session's plan for these feeds, each on its real inputs."""
    bindings = {}
    for value in session.graph.input_values():
        for dim, actual in zip(value.shape or (), feeds[value.name].shape):
            if isinstance(dim, str):
                bindings[dim] = int(actual)
    plan = session.plan_for(bindings)
    device = {step.node.name: step.device for step in plan.steps}
    planned = memory_plan(plan, [v.name for v in session.get_outputs()])
    measured: dict[str, float] = {}

    def visit(index: int, node: Node, kernel: Kernel, inputs: list[np.ndarray | None]) -> Sequence | None:
        sync = device[node.name].synchronize
        outputs = kernel.fn(node, inputs)  # warm-up: a compiled kernel's first call compiles it
        placed = planned.placed_inputs(node.inputs, node.outputs) if planned is not None else []
        if node.op_type == "Concat" and any(placed):
            call = _placed_concat_call(kernel, node, inputs, outputs[0], placed)
        else:
            call = device[node.name].timed_call(kernel, node, inputs, outputs, weight_positions(node, plan.graph))
        first, settle = timed_first_call(call, sync)
        measured[node.name] = amortised_seconds(call, min_time=min_time, rounds=rounds, synchronize=sync,
                                                first_seconds=first, settle=settle,
                                                round_seconds=layer_rounds(device[node.name]))
        return outputs

    # NOTE: the threads a run of this plan holds (BLAS's, hetflow's own GEMM splits, or its spinning pool).
    conv_macs, direct_macs = plan_conv_work(plan)
    with run_threads(conv_macs, holds_batch(feeds), session.threads, direct_macs, plan_recurrent_batch(plan)):
        replay(plan.graph, [(step.node, step.kernel) for step in plan.steps], feeds, visit)
    return measured


def _placed_concat_call(
    kernel: Kernel, node: Node, inputs: Sequence[np.ndarray | None], output: np.ndarray, placed: Sequence[bool]
) -> Callable[[], object]:
    """A Concat's call as a run makes it when the memory plan placed some of its inputs in its output
    (``placed``, per input: ``MemoryPlan.placed_inputs``): those already lie in their slices, written by
    their producers, and the kernel copies only the rest (the executor hands the slices over after the
    output)."""
    target = np.empty_like(output)
    axis = node.attrs.axis % target.ndim
    arrays: list[np.ndarray | None] = []
    slices: list[np.ndarray | None] = []
    start = 0
    for inside, x in zip(placed, inputs, strict=True):
        if x is None:
            arrays.append(None)
            slices.append(None)
            continue
        part = target[(slice(None),) * axis + (slice(start, start + x.shape[axis]),)]
        start += x.shape[axis]
        if inside:
            part[...] = x
        arrays.append(part if inside else x)
        slices.append(part if inside else None)
    out = [target, *slices]
    return lambda: kernel.fn(node, arrays, out)


#: Runs ``model_seconds`` stops at, whatever its budget: enough that a small network's fastest run comes
#: after its threads have settled. A new session of the mentee at batch 1 sometimes ran its first 50-100
#: runs at 0.66-0.90 ms and then 0.53 (6 fresh processes here): 50 runs measured it 31% slow.
MAX_MODEL_RUNS = 2000


#: Seconds of whole runs between two readings of ``model_seconds``' cache probe: the VM's spells with
#: the L3 split (``hetflow.estimate.spells``) came and went every 1-3 s on 2026-12-07.
BURST_SECONDS = 0.2
#: Seconds ``model_seconds`` times at most, waiting for runs with the cores' L3 shared. On 2026-12-07
#: DenseNet-121 at batch 1 ran 48 ms with the L3 split and 28 with it shared, seconds apart; a 1-second
#: budget timed inside one spell measured the model 1.7x slow.
CALM_PATIENCE_SECONDS = 20.0


def model_seconds(
    session: InferenceSession, feeds: Mapping[str, np.ndarray], *, min_runs: int = 3, budget: float = 1.0,
    max_runs: int = MAX_MODEL_RUNS, probe: CacheProbe | None = None, patience: float = CALM_PATIENCE_SECONDS,
) -> float:
    """The fastest of several ``session.run`` calls after one warm-up (at least ``min_runs``, and more
    while the total stays under ``budget`` seconds, up to ``max_runs``).

    With a ``probe``, the runs go in bursts of ``BURST_SECONDS`` with the cores' L3 probed before and
    after each, and only the bursts with it shared on both sides count towards those limits: the timing
    goes on, for ``patience`` seconds at most, until enough of them have run."""
    session.run(None, dict(feeds))
    best = float("inf")
    calm_seconds = 0.0
    calm_runs = 0
    burst_limit = budget if probe is None else min(budget, BURST_SECONDS)
    started = time.perf_counter()
    while calm_runs < min_runs or (calm_seconds < budget and calm_runs < max_runs):
        if probe is not None and time.perf_counter() - started > patience:
            probe.give_up_waiting()
            break
        calm_before = _shared(probe)
        spent, runs, fastest = _burst(session, feeds, min_runs, burst_limit, max_runs - calm_runs)
        best = min(best, fastest)
        if calm_before and _shared(probe):
            calm_seconds += spent
            calm_runs += runs
    return best


def _burst(
    session: InferenceSession, feeds: Mapping[str, np.ndarray], min_runs: int, limit: float, max_runs: int,
) -> tuple[float, int, float]:
    """Runs timed back to back, at least ``min_runs`` and on while they total under ``limit`` seconds, at
    most ``max_runs``: (seconds spent, runs, the fastest run's seconds)."""
    best = float("inf")
    spent = 0.0
    runs = 0
    while runs < max_runs and (runs < min_runs or spent < limit):
        started = time.perf_counter()
        session.run(None, dict(feeds))
        elapsed = time.perf_counter() - started
        best = min(best, elapsed)
        spent += elapsed
        runs += 1
    return spent, runs, best


def calm_probe(session: InferenceSession) -> CacheProbe | None:
    """The cache probe ``model_seconds`` times ``session``'s runs with: the process's, where a run uses
    more than one thread (one thread's runs do not pass data between the cores); else None."""
    return process_probe() if session.threads > 1 else None


def _shared(probe: CacheProbe | None) -> bool:
    """Whether the probe finds the cores' L3 shared now (or its split is the machine's layout); True
    without a probe."""
    return probe is None or probe.shared() is not False or probe.split_by_layout


def peak_run_bytes(session: InferenceSession, feeds: Mapping[str, np.ndarray]) -> int:
    """Bytes allocated at the peak of one warm ``session.run`` (tracemalloc: numpy reports to it), plus
    the arena its activations and scratch live in (allocated once per session, so not seen by a warm
    run)."""
    # Warm: lazily built per-session state is not part of a run. A run's capture for replay
    # (``hetflow.runtime.replay``) is such state, and one warm run did not always make it: in a fresh
    # process ``hetflow estimate zoo:lenet --validate`` read a peak 28% over the prediction (0.24 MiB
    # against 0.17), the same run measured after other models had run 0.6%; two warm runs read 0.7%.
    for _ in range(2):
        session.run(None, dict(feeds))
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        outputs = session.run(None, dict(feeds))
        peak = tracemalloc.get_traced_memory()[1]
        del outputs
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return max(0, peak - before) + session.arena_bytes(feeds)


def validate(
    result: Estimate,
    session: InferenceSession,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    min_time: float = 0.05,
    rounds: int = 3,
    memory: bool = True,
) -> Estimate:
    """Fill ``result`` with measurements on the session's device: every layer's ``measured_ms`` (the
    faster of two passes, before and after the whole model is timed), the whole model's ``measured_ms``
    and the measured memory peak. Returns ``result``."""
    feeds = dict(feeds) if feeds is not None else random_feeds(session, result.batch)
    _check_batch(session, feeds, result.batch)
    if memory:
        result.memory.measured_peak_bytes = peak_run_bytes(session, feeds)
    # A batch the session runs as runs of fewer images (``images_per_run``): its layers are timed as
    # those runs make them, once a run. Otherwise the feeds stay whole: slicing them to the batch cut a
    # time-major LSTM's [100, 1, 6] sequence to one step (its layer measured at 0.065 ms of 3.2).
    images = session.images_per_run(result.batch)
    part = feeds if images is None else {name: value[:images] for name, value in feeds.items()}
    runs = 1.0 if images is None else result.batch / images
    measured = layer_seconds(session, part, min_time=min_time, rounds=rounds)
    result.measured_ms = model_seconds(session, feeds, probe=calm_probe(session)) * 1e3
    # NOTE: the layers are timed again after the whole model, each keeping its faster pass. On the
    # 2-vCPU Zen 4 VM a pass sometimes timed a layer split over both threads at one thread's speed for
    # seconds at a time (AlexNet's im2col layers at batch 1 2.5 / 4.0 ms, MobileNet v2's expansions
    # 0.17 / 0.35 ms in back-to-back passes, LeNet's batch-16 classifier 0.068 / 0.114) while whole runs
    # did not slow: the calibration keeps each probe's faster of two sweeps the same way.
    again = layer_seconds(session, part, min_time=min_time, rounds=rounds)
    measured = {name: runs * min(seconds, again.get(name, seconds)) for name, seconds in measured.items()}
    for layer in result.layers:
        seconds = measured.get(layer.name)
        layer.measured_ms = None if seconds is None else seconds * 1e3
    return result


def _check_batch(session: InferenceSession, feeds: Mapping[str, np.ndarray], batch: int) -> None:
    expected = batch_bindings(session.graph, batch)
    for value in session.graph.input_values():
        for dim, actual in zip(value.shape or (), feeds[value.name].shape):
            if isinstance(dim, str) and expected.get(dim) != actual:
                raise ValueError(f"feed '{value.name}' sets '{dim}' to {actual}; the estimate is for batch {batch}")
