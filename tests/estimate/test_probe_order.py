"""Calibration times a probe's own loops before its BLAS candidates, and out of reach of BLAS's spinning
workers: a direct Conv timed right after an im2col on BLAS's threads measured up to 1.7x its time."""

from __future__ import annotations

import importlib
import time

import numpy as np
import pytest

from hetflow.devices.registry import get_device
from hetflow.estimate.timing import SETTLE_SECONDS
from hetflow.graph import Node

# NOTE: ``hetflow.estimate.calibrate`` is also the name of a function the package exports.
calibrate = importlib.import_module("hetflow.estimate.calibrate")
probes = importlib.import_module("hetflow.estimate.probes")


def _node(op_type: str) -> Node:
    return Node(op_type=op_type, name="n", inputs=["x"], outputs=["y"])


@pytest.mark.parametrize(
    ("op_type", "algorithm", "key", "expected"),
    [
        ("Conv", "direct_fma", "Conv/direct_fma@spin", False),
        ("Conv", "depthwise", "Conv/depthwise@spin", False),
        ("Conv", "pointwise", "Conv/pointwise@own", False),
        ("Conv", "im2col", "Conv/im2col@spin", True),
        ("Conv", "winograd_f23", "Conv/winograd_f23@spin", True),
        ("Gemm", "default", "Gemm/default@spin", True),
        ("MaxPool", "default", "MaxPool/default@spin", False),
    ],
)
def test_which_candidates_may_call_blas(op_type, algorithm, key, expected):
    assert calibrate._may_call_blas(_node(op_type), algorithm, key) is expected


def test_blas_spin_waits_out_only_the_rest_of_the_spin():
    blas = calibrate.BlasSpin()
    started = time.perf_counter()
    blas.wait()  # nothing ran: no wait
    assert time.perf_counter() - started < SETTLE_SECONDS / 2
    blas.ran()
    started = time.perf_counter()
    blas.wait()
    assert time.perf_counter() - started >= SETTLE_SECONDS * 0.9
    started = time.perf_counter()
    blas.wait()  # already settled
    assert time.perf_counter() - started < SETTLE_SECONDS / 2


def _probe_events(probe_name: str, quick_profile) -> tuple[list[str], list[str]]:
    """The keys a probe's samples have, and when it told BLAS's spin it ran (``ran``) or waited (``wait``)."""
    probe = next(p for p in probes.catalogue() if p.name == probe_name)
    assert probe.spin and not probe.hold_blas
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    events: list[str] = []
    blas = calibrate.BlasSpin()
    blas.ran = lambda: events.append("ran")  # type: ignore[method-assign]
    blas.wait = lambda: events.append("wait")  # type: ignore[method-assign]
    samples = calibrate._time_probe(probe, calibrate.QUICK, get_device("cpu"), terms, blas=blas)
    return [sample.key for _, sample in samples], events


def test_a_probes_own_loops_are_timed_first_and_after_blas_settles(quick_profile, monkeypatch):
    from hetflow.devices.cpu.kernels import own_gemm

    # Its 800 column rows would run as whole columns on the tile GEMM: kept on BLAS here.
    monkeypatch.setattr(own_gemm, "COLUMNS_MAX_BYTES", 0)
    keys, events = _probe_events("conv 32x16x16 -> 32 k5 spin", quick_profile)
    assert keys == ["Conv/direct_fma@spin", "Conv/im2col@spin"]
    # The direct loop waited for BLAS before it was timed; the im2col candidate reported BLAS's run twice:
    # its unbound warm-up and its allocation count.
    assert events == ["wait", "ran", "ran"]


def test_a_candidate_timed_off_blas_is_warmed_up_bound(quick_profile):
    """The im2col candidate on whole columns runs the tile GEMM when timed; called unbound (as its
    allocation count calls it) it multiplies on BLAS. Its warm-up is the bound call it is timed with, so
    BLAS runs only after both candidates are timed."""
    keys, events = _probe_events("conv 32x16x16 -> 32 k5 spin", quick_profile)
    assert keys == ["Conv/direct_fma@spin", "Conv/im2col@columns"]
    assert events == ["wait", "wait", "ran"]


def test_a_sweep_times_every_probes_own_loops_before_blas_runs(quick_profile, monkeypatch, no_bar):
    """Probe by probe, each probe's own loops waited for the BLAS workers its predecessor left spinning:
    a sweep times the own loops of all of them first, then the rest."""
    from hetflow.devices.cpu.kernels import own_gemm

    monkeypatch.setattr(own_gemm, "COLUMNS_MAX_BYTES", 0)  # im2col on BLAS: each probe runs BLAS
    names = ["conv 32x16x16 -> 32 k5 spin", "conv 32x8x8 -> 64 k5 spin", "conv 3x32x32 -> 32 k3 spin"]
    chosen = [next(p for p in probes.catalogue() if p.name == name) for name in names]
    events: list[str] = []

    class Recording(calibrate.BlasSpin):
        def ran(self) -> None:
            events.append("ran")
            super().ran()

        def wait(self) -> None:
            events.append("wait")
            super().wait()

    monkeypatch.setattr(calibrate, "BlasSpin", Recording)
    terms = calibrate.Terms(quick_profile.gemm, quick_profile.memory, quick_profile.gemm_one_thread, 2)
    device = get_device("cpu")
    alone = [[s.key for _, s in calibrate._time_probe(p, calibrate.QUICK, device, terms)] for p in chosen]
    events.clear()
    swept = calibrate._time_probes(chosen, calibrate.QUICK, device, terms, no_bar)
    measured, seconds = swept.samples, swept.seconds
    assert [[sample.key for sample in group] for group in measured] == alone
    assert alone[0] == ["Conv/direct_fma@spin", "Conv/im2col@spin"]
    last_wait = len(events) - 1 - events[::-1].index("wait")
    assert "ran" in events and events.index("ran") > last_wait
    # The own loops' samples kept their allocation counts (taken after the BLAS candidates were timed).
    assert all(group[0].out_bytes > 0 for group in measured)
    assert len(seconds) == len(names) and all(spent > 0 for spent in seconds)
    assert swept.spells == [False] * len(names)  # no gauge: no spell read



def test_a_later_sweep_keeps_the_first_sweeps_allocation_counts():
    counted = calibrate.Sample("k", np.zeros(1), 2.0, np.zeros(1), 8, transient_bytes=100, retained_bytes=50)
    faster = calibrate.Sample("k", np.zeros(1), 1.0, np.zeros(1), 8, transient_bytes=0, retained_bytes=0)
    kept = calibrate._faster(counted, faster)
    assert (kept.seconds, kept.transient_bytes, kept.retained_bytes) == (1.0, 100, 50)
    assert calibrate._faster(faster, counted) is faster


@pytest.mark.parametrize(("algorithm", "expected"), [("direct_fma", False), ("depthwise", False), ("pointwise", True),
                                                     ("im2col", True)])  # fmt: skip
def test_unbound_calls_of_gemm_convs_count_as_blas(algorithm, expected):
    assert calibrate._unbound_calls_blas(_node("Conv"), algorithm) is expected
