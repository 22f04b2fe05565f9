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
