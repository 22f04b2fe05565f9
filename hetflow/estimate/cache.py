"""What a layer loses inside a whole run: the bytes it finds in cache when timed alone, and in memory in a run.

Validation (Augur's overhead-free method) times each layer alone, over and over, on its real inputs:
after the first call, its weights, inputs, outputs and scratch all sit in the last-level cache when
they fit. Inside a whole run they often do not: the layer's weights were last read a whole run ago, and
the arena region its output goes to was last written by some other layer. On the 2-vCPU Zen 5 VM, a
fully connected layer with 8 MB of weights took 0.047 ms alone and 0.175 ms in ResNet-50's run, and the
whole runs lost 5-20% against their layers' sum, more for networks whose weights outgrow the 32 MiB L3
(ResNet-50) than for those whose weights fit (SqueezeNet, MobileNet v2).

The model replays the run's accesses through a least-recently-used cache of the device's last-level
size, in blocks: what each step touches is byte ranges (the arena's regions, so a value written where
a dead one lay just before is warm, and the kernels' weights in address spaces of their own). The
steady state is the second of two passes; a step's cold bytes are those it misses in that pass, less
those it misses when replayed alone (a layer larger than the cache misses in both). The bytes are
priced at the bandwidth of a working set past the cache (``DeviceProfile.memory``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The granularity of the simulated cache: coarse enough that a run of a large network at batch 16
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
        """The indices of the cache blocks the range covers."""
        if self.nbytes <= 0:
            return range(0)
        return range(self.offset // BLOCK_BYTES, (self.offset + self.nbytes - 1) // BLOCK_BYTES + 1)


class LruCache:
    """A least-recently-used cache of ``capacity`` bytes in blocks of ``BLOCK_BYTES``."""

    def __init__(self, capacity: int):
        self._slots = max(1, capacity // BLOCK_BYTES)
        self._resident: OrderedDict[tuple[str, int], None] = OrderedDict()

    def touch(self, touches: Iterable[Touch]) -> int:
        """Access every block of ``touches``; returns the bytes that were not resident."""
        missed = 0
        for touch in touches:
            for block in touch.blocks():
                key = (touch.space, block)
                if key in self._resident:
                    self._resident.move_to_end(key)
                    continue
                missed += BLOCK_BYTES
                self._resident[key] = None
                if len(self._resident) > self._slots:
                    self._resident.popitem(last=False)
        return missed


def cold_bytes(steps: Sequence[Sequence[Touch]], capacity: int) -> list[int]:
    """Per step of a run: the bytes it brings from memory in the run's steady state that it finds in a
    cache of ``capacity`` bytes when it runs alone, call after call."""
    if capacity <= 0:
        return [0] * len(steps)
    run = LruCache(capacity)
    for touches in steps:  # the previous run: what the steady state starts from
        run.touch(touches)
    cold = []
    for touches in steps:
        in_run = run.touch(touches)
        alone = LruCache(capacity)
        alone.touch(touches)
        cold.append(max(0, in_run - alone.touch(touches)))
    return cold


_SYSFS_CPU_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def last_level_cache_bytes() -> int:
    """The size of this CPU's last-level cache in bytes (0 when the system does not say)."""
    sizes: dict[int, int] = {}
    for index in sorted(_SYSFS_CPU_CACHE.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text().strip())
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data"):
            sizes[level] = max(sizes.get(level, 0), size)
    if sizes:
        return sizes[max(sizes)]
    for name in ("SC_LEVEL3_CACHE_SIZE", "SC_LEVEL2_CACHE_SIZE"):
        try:
            size = os.sysconf(name)
        except (ValueError, OSError):
            continue
        if size > 0:
            return int(size)
    return 0


#: A working set counts as held by the outer cache while its copy bandwidth is at least this share of
#: the rate right after the inner cache's drop (the outer cache's plateau).
PLATEAU_SHARE = 0.9
#: The least a measured drop caps a reported cache to: a quick calibration copies three working sets,
#: and one slowed by another process (a test run beside it) put the drop at 512 KiB.
MIN_EFFECTIVE_CACHE_BYTES = 8 << 20


def effective_cache_bytes(reported: int, working_set_bytes: Sequence[float], bandwidth_gbs: Sequence[float]) -> int:
    """The last-level cache a run keeps: the ``reported`` size (``last_level_cache_bytes``), capped where
    the copy bandwidth measured over working sets (``DeviceProfile.memory``, rising sizes) leaves the
    outer cache's plateau. The plateau is the rate right after the curve's steepest drop (the inner
    cache's edge); the cap is the geometric mean of the last working set still at ``PLATEAU_SHARE`` of
    it and the next one, ``MIN_EFFECTIVE_CACHE_BYTES`` at least.

    Why: a VM's sysfs may report the host's whole L3 (480 MiB on the 2-vCPU Xeon VM of 2026-12-01),
    where one-thread copies ran at 84-96 GB/s up to 1 MiB, 26-28 GB/s at 4-16 MiB, 20-25 at 64 MiB and
    13-14 from 256 MiB. Replayed through 480 MiB, no layer of any zoo model missed, and the branchy
    networks' runs came out 17-27% over their predictions. The rule before this one (the last working
    set still 1.5x memory's rate) put the cap at 32 MiB or 128 MiB from one calibration to the next (a
    64 MiB copy at 20.7 or 24.7 GB/s), and the in-run term of DenseNet-121 at batch 1 from 3.2 ms to 0.
    A report of 0 (no cache model: a device that is not the CPU) stays 0."""
    if reported <= 0 or len(working_set_bytes) < 3 or len(working_set_bytes) != len(bandwidth_gbs):
        return reported
    rates = list(bandwidth_gbs)
    drops = [rate / max(following, 1e-9) for rate, following in zip(rates, rates[1:])]
    edge = int(np.argmax(drops)) + 1  # the first working set past the inner cache
    plateau = rates[edge]
    for index in range(edge + 1, len(rates)):
        if rates[index] < PLATEAU_SHARE * plateau:
            knee = (working_set_bytes[index - 1] * working_set_bytes[index]) ** 0.5
            return min(reported, max(MIN_EFFECTIVE_CACHE_BYTES, int(knee)))
    return reported


def _parse_size(text: str) -> int:
    """``"32768K"`` / ``"32M"`` / ``"1024"`` -> bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)
