"""Is the machine in a slow spell? A small layer, run now and then, that shows it.

A shared VM's second vCPU is sometimes slow for seconds to minutes at a time. On the Zen 4 VM
(2026-12-06) the spells doubled MobileNet v2's batch-1 run (4.8 -> 9.2 ms) while numpy's two-thread
sgemm lost only ~12% and one thread's not at all, and they do not slow every kernel alike: a 1x1 Conv
from 24 to 144 channels at 56x56 (one image, on the spinning pool) went from 240-260 us to 630-730, a
depthwise 3x3 over the same map from ~107 to ~115. A calibration that ran through a spell fitted the
keys timed in it up to 2x slow (ShuffleNet's depthwise and grouped layers at batch 1: its estimate +18%),
and the sweeps' minimum does not help when a spell outlasts the time between them. ``SpellGauge``
times that 1x1 layer: a reading well over the fastest seen marks what was timed meanwhile.

What a spell is (measured 2026-12-06): the two vCPUs then sit on different L3 domains. One core reads
4 MB the other has just written in ~150 us against ~75 outside spells (and against ~72 for 4 MB it wrote
itself, in or out of one), while each core alone reads memory at the same ~30 GB/s and runs a network
on one thread as fast as ever (ResNet-50 at batch 1: 80 ms in and out of spells, ONNX Runtime's 75).
So only work that passes data between the cores slows: two threads ran ResNet-50 at batch 1 in 40 ms
outside spells and 53 in them, ONNX Runtime in 38 and 41; the spells come and go every 10 s to a few
minutes, and on that day held more than half the time. This gauge's layer (its output written by both
cores and read by the caller) reads 2-3.5x its calm time in them.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable

import numba
import numpy as np

#: A reading this many times the fastest one seen is a slow spell (spells read 2.5-2.9x; calm readings
#: spread by ~10%).
SPELL_RATIO = 1.4
#: Runs per reading (the fastest counts): ~1.3 ms a reading outside spells.
RUNS_PER_READING = 5


class SpellGauge:
    """Times a small spinning 1x1 Conv (``read``) and says whether a reading falls in a slow spell.

    A reading is slow against the fastest one seen, or where the cores did not share their L3 as it was
    taken (``CacheProbe``): a gauge made in a spell that outlasts it keeps a spell's reading as its
    fastest, and on 2026-12-06 a calibration so made fitted ResNet-50's keys with the L3 split (its
    estimate at batch 1 +18% against a run at full speed)."""

    def __init__(self, threads: int | None = None, probe: CacheProbe | None = None) -> None:
        from hetflow import InferenceSession
        from hetflow.estimate.probes import conv

        self.session = InferenceSession(conv(24, 56, 144, 1)(), threads=threads)
        name = self.session.get_inputs()[0].name
        self.feed = {name: np.random.default_rng(0).random((1, 24, 56, 56), dtype=np.float32)}
        self.probe = CacheProbe() if probe is None else probe
        self.fastest = float("inf")
        self.split = False  # whether the cores were on separate L3 domains at the last reading
        for _ in range(4):  # the first runs capture the run and warm its caches
            self.read()

    def read(self) -> float:
        """Seconds of the layer now (the fastest of ``RUNS_PER_READING`` runs); kept as the fastest
        seen when it is. Probes the cores' L3 too (``split``)."""
        best = float("inf")
        for _ in range(RUNS_PER_READING):
            started = time.perf_counter()
            self.session.run(None, self.feed)
            best = min(best, time.perf_counter() - started)
        self.split = self.probe.shared() is False
        self.fastest = min(self.fastest, best)
        return best

    def slow(self, reading: float) -> bool:
        """Whether ``reading`` (the last ``read``) was taken in a slow spell: over ``SPELL_RATIO`` times
        the fastest reading seen, or with the cores' L3 split."""
        return reading > SPELL_RATIO * self.fastest or self.split

    def wait_for_calm(self, limit_s: float, pause_s: float = 0.5) -> bool:
        """Read until a reading is not slow, ``pause_s`` apart, for at most ``limit_s`` seconds;
        whether the machine is calm now."""
        deadline = time.perf_counter() + limit_s
        while self.slow(self.read()):
            if time.perf_counter() + pause_s > deadline:
                return False
            time.sleep(pause_s)
        return True


# -- whether the two cores share their last-level cache now ------------------------------------------
#: Bytes one core writes and the other reads back (past L2, inside an L3).
PROBE_BYTES = 4 << 20
#: The other core's read of them taking this many times a core's read of its own writes: the cores are
#: on separate L3 domains (2026-12-06: 150 / 72 us split, 75 / 72 shared).
SPLIT_RATIO = 1.4


@numba.njit(nogil=True, cache=True)
def _fill(values, value):  # noqa: ANN001, ANN202
    for i in range(values.size):
        values[i] = value


@numba.njit(nogil=True, cache=True, fastmath=True)
def _total(values):  # noqa: ANN001, ANN202
    total = 0.0
    for i in range(values.size):
        total += values[i]
    return total


class CacheProbe:
    """Whether the first two CPUs of this process share their last-level cache now (``shared``): CPU 0
    writes ``PROBE_BYTES``, CPU 1 reads them, against CPU 1 reading what it wrote itself. On a VM whose
    vCPUs move between L3 domains this tells a slow spell apart from a slow kernel (see the module's
    docstring). Linux only (threads pinned with ``os.sched_setaffinity``).

    Cores on separate L3s by design (a desktop CPU's two core complexes, two sockets, CI's runner on
    2026-12-07) never read shared: once a wait runs out with no shared reading ever seen, the probe takes
    the split for the machine's layout and later waits return after one reading, until a reading finds
    the L3 shared after all."""

    def __init__(self) -> None:
        cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self.cpus = tuple(cpus[:2])
        self.ever_shared = False  # whether any reading found the L3 shared
        self.waited_out = False  # whether a wait ran to its limit
        self.values = np.ones(PROBE_BYTES // 4, np.float32)
        _fill(self.values, 1.0)
        _total(self.values)

    @property
    def available(self) -> bool:
        """Whether there are two CPUs to probe."""
        return len(self.cpus) == 2

    def ratio(self, reads: int = 3) -> float:
        """The other core's read time over the own core's (the fastest of ``reads`` each)."""
        if not self.available:
            raise RuntimeError("the cache probe needs two CPUs in this process's affinity mask")
        writer, reader = self.cpus
        crossed = min(self._read_after(writer, reader) for _ in range(reads))
        own = min(self._read_after(reader, reader) for _ in range(reads))
        return crossed / own

    def shared(self) -> bool | None:
        """Whether the two CPUs share their L3 now; None without two CPUs."""
        if not self.available:
            return None
        shared = self.ratio() < SPLIT_RATIO
        self.ever_shared |= shared
        return shared

    @property
    def split_by_layout(self) -> bool:
        """Whether the split is taken for the machine's layout: a wait ran out and no reading has found
        the L3 shared (one that does makes it a spell again)."""
        return self.waited_out and not self.ever_shared

    def wait_until_shared(self, limit_s: float, pause_s: float = 0.5) -> bool | None:
        """Probe until the CPUs share their L3, ``pause_s`` apart, for at most ``limit_s`` seconds;
        whether they do now (None without two CPUs). Without waiting where the split is the machine's
        layout (``split_by_layout``)."""
        deadline = time.perf_counter() + limit_s
        while (shared := self.shared()) is False and not self.split_by_layout:
            if time.perf_counter() + pause_s > deadline:
                self.give_up_waiting()
                break
            time.sleep(pause_s)
        return shared

    def give_up_waiting(self) -> None:
        """Note that a wait for the L3 shared ran out (see ``split_by_layout``)."""
        self.waited_out = True

    def _read_after(self, writer: int, reader: int) -> float:
        _on_cpu(writer, lambda: _fill(self.values, 2.0))

        def timed_read() -> float:
            started = time.perf_counter()
            _total(self.values)
            return time.perf_counter() - started

        return _on_cpu(reader, timed_read)


@functools.cache
def process_probe() -> CacheProbe | None:
    """One ``CacheProbe`` for the process (None without two CPUs): what it learnt of the machine's
    layout (``split_by_layout``) holds for every later measurement."""
    probe = CacheProbe()
    return probe if probe.available else None


def _on_cpu(cpu: int, work: Callable[[], float | None]) -> float | None:
    """``work()`` on a thread pinned to ``cpu``; its result."""
    result: list[float | None] = []

    def pinned() -> None:
        os.sched_setaffinity(0, {cpu})
        result.append(work())

    thread = threading.Thread(target=pinned)
    thread.start()
    thread.join()
    return result[0]
