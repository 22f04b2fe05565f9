"""What a layer loses inside a whole run: the bytes it finds in cache when timed alone, and in memory in a run.

Validation (Augur's overhead-free method) times each layer alone, over and over, on its real inputs:
after the first call, its weights, inputs, outputs and scratch all sit in the last-level cache when
they fit. Inside a whole run they often do not: the layer's weights were last read a whole run ago, and
the arena region its output goes to was last written by some other layer. On the 2-vCPU Zen 5 VM, a
fully connected layer with 8 MB of weights took 0.047 ms alone and 0.175 ms in ResNet-50's run, and the
whole runs lost 5-20% against their layers' sum, more for networks whose weights outgrow the 32 MiB L3
(ResNet-50) than for those whose weights fit (SqueezeNet, MobileNet v2).

The model replays the run's accesses in blocks: what each step touches is byte ranges (the arena's
regions, so a value written where a dead one lay just before is warm, and the kernels' weights in
address spaces of their own). Each block read again has a reuse distance: the distinct bytes the run
touched since its last access. The share of it still in cache at that distance (``HitCurve``) is read
off calibration's re-read rates over footprints (``HitCurve.of``; the copy rates in an older profile):
weights of a footprint ``S`` read in a cycle are each read again at distance ``S``, and their rate lies
between the cache's and memory's in proportion to the share found in cache. The steady state is the second of two passes; a step's
cold bytes are those it misses in that pass, less those it misses when repeated alone (at the distance
of its own footprint: a layer larger than the cache misses in both).

Why not a least-recently-used cache of one size, as before: it is all or nothing. A network whose
blocks come back at a distance just over the size misses all of them, one just under none, and the
VM's share of its L3 is neither fixed nor LRU: the Zen 4 VM (2026-12-06) copied 8 MiB working sets at
96 GB/s, 16 MiB at 32-70 from one calibration to the next, 64 MiB at 25-27 (memory: 18-20). On the
measurements of ``estimate_end.json`` (``benchmarks/results/2026-12-06-s45``), replayed through an LRU
cache ShuffleNet at batch 1 lost nothing from 16 MiB up (estimate -10.8%) and 0.41 ms at 12 MiB
(+7.2%), MobileNet v2 nothing at 32 MiB (-14.6%) and 0.64 ms at 24 (-1.2%), while AlexNet and VGG-19 at
batch 1 went from -8.3% and -4.5% at 32 MiB to -11.4% and -10.4% at 12: 26 or 27 of the 28 runs within
10% at any one size from 8 to 32 MiB (ShuffleNet at batch 1 outside from 16 MiB up, AlexNet and VGG-19
below).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hetflow.estimate.profile import MemoryModel

#: The granularity of the simulated accesses: coarse enough that a run of a large network at batch 16
#: (a few GB touched) replays in a fraction of a second, fine against a 32 MiB cache.
BLOCK_BYTES = 64 << 10


@dataclass(frozen=True)
class Touch:
    """A contiguous byte range one step reads or writes, in an address space (``"arena"``, or one of
    its own for a weight or a value outside the arena)."""

    space: str
    offset: int
    nbytes: int

    def blocks(self) -> range:
        """The indices of the blocks the range covers."""
        if self.nbytes <= 0:
            return range(0)
        return range(self.offset // BLOCK_BYTES, (self.offset + self.nbytes - 1) // BLOCK_BYTES + 1)


class HitCurve:
    """The share of a block's bytes found in cache when it is read again after ``distance`` other bytes,
    from read rates over footprints (``sizes``, rising; ``rates`` in GB/s): ``(1/r(S) - 1/r_memory) /
    (1/r_cache - 1/r_memory)``, with ``r_cache`` the rate of the smallest footprint, ``r_memory`` the
    largest's and ``r(S)`` interpolated log-log, as ``models.bandwidth`` does. 1 below the smallest
    footprint, 0 past the largest; 1 everywhere for a curve without a drop (nothing to lose)."""

    def __init__(self, sizes: Sequence[float], rates: Sequence[float]):
        if len(sizes) != len(rates) or not sizes:
            raise ValueError(f"a hit curve needs as many rates as sizes, at least one; got {len(sizes)} / {len(rates)}")
        self._log_sizes = [math.log(max(size, 1.0)) for size in sizes]
        self._log_rates = [math.log(rate) for rate in rates]
        self._cached = 1.0 / rates[0]
        self._uncached = 1.0 / rates[-1]

    @classmethod
    def of(cls, memory: MemoryModel) -> HitCurve:
        """The curve of a profile's memory model: its re-read rates (``calibrate``: the same weights read
        again after a footprint of others), or its copy rates in a profile calibrated before them.

        Why re-reads: they are what a run does with its weights, and the last-level cache keeps them
        less well than a copy's working set. On the Zen 4 VM (2026-12-06, two threads) 1 MiB matrices
        read in a cycle ran at 70-74 GB/s up to 8 MiB, 38-55 at 16, 26-33 at 20 and 13-18 from 32 MiB,
        where copies of 24-48 MiB working sets still ran at 32-53. On the measurements of s45's last
        accuracy run, with one profile (``benchmarks/results/2026-12-06-s46/cache_models.py``),
        MobileNet v2 at batch 1 came out -14.4% with an LRU cache of 32 MiB, -7.8% through the copy
        curve and -7.1% through the re-read curve. The copy curve also holds a share of a 64 MiB
        working set in cache, and so counted AlexNet's 67 MB fully connected layer 30% cached when it
        repeats alone and charged its run 0.8 ms more for it; the re-reads run at memory's rate there."""
        if memory.reread_bytes and len(memory.reread_bytes) == len(memory.reread_gbs):
            return cls(memory.reread_bytes, memory.reread_gbs)
        return cls(memory.working_set_bytes, memory.bandwidth_gbs)

    def __call__(self, distance: float) -> float:
        sizes = self._log_sizes
        position = math.log(distance) if distance > 0 else -math.inf
        if position <= sizes[0]:
            return 1.0
        if position > sizes[-1]:
            return 0.0
        span = self._uncached - self._cached
        if span <= 1e-9 * self._uncached:
            return 1.0
        right = bisect.bisect_left(sizes, position)
        left = right - 1
        weight = (position - sizes[left]) / (sizes[right] - sizes[left]) if sizes[right] > sizes[left] else 1.0
        rate = math.exp(self._log_rates[left] + weight * (self._log_rates[right] - self._log_rates[left]))
        return min(1.0, max(0.0, (self._uncached - 1.0 / rate) / span))


class _Marks:
    """A Fenwick tree over the replay's accesses: one mark per block at its latest access, so that the
    marks after an access count the distinct blocks touched since (its LRU stack distance)."""

    def __init__(self, size: int):
        self._tree = [0] * (size + 1)

    def add(self, access: int, count: int) -> None:
        index = access + 1
        while index < len(self._tree):
            self._tree[index] += count
            index += index & -index

    def up_to(self, access: int) -> int:
        """Marks at accesses ``0..access``."""
        index, total = access + 1, 0
        while index > 0:
            total += self._tree[index]
            index -= index & -index
        return total


def _step_blocks(touches: Sequence[Touch]) -> list[tuple[str, int]]:
    """The distinct blocks a step touches, in order."""
    return list(dict.fromkeys((touch.space, block) for touch in touches for block in touch.blocks()))


def cold_bytes(steps: Sequence[Sequence[Touch]], hit: Callable[[float], float]) -> list[float]:
    """Per step of a run: the bytes it brings from memory in the run's steady state beyond those it
    brings when repeated alone, with ``hit`` the share in cache by reuse distance (``HitCurve``)."""
    blocks = [_step_blocks(touches) for touches in steps]
    marks = _Marks(2 * sum(len(touched) for touched in blocks))
    last: dict[tuple[str, int], int] = {}
    access = 0
    cold = []
    for step, touched in enumerate(blocks + blocks):  # the first pass is the previous run
        missed = 0.0
        for block in touched:
            before = last.get(block)
            if before is None:
                missed += BLOCK_BYTES
            else:
                distance = (marks.up_to(access) - marks.up_to(before)) * BLOCK_BYTES
                missed += (1.0 - hit(distance)) * BLOCK_BYTES
                marks.add(before, -1)
            marks.add(access, 1)
            last[block] = access
            access += 1
        if step >= len(steps):
            footprint = len(touched) * BLOCK_BYTES
            alone = (1.0 - hit(footprint)) * footprint
            cold.append(max(0.0, missed - alone))
    return cold
