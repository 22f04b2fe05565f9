"""Side-by-side timing of several configurations in one process (NOTES.md's protocol).

Configurations are interleaved per repetition; before each timed call the configuration about to be
timed runs untimed for about 0.1 s (when one call is longer than that, the previous configuration's
worker threads — OpenBLAS, PoCL — get 0.15 s to stop spinning instead), so none pays for another's
spinning threads. Minimums are the stable statistic; medians are reported beside them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

#: How long a configuration runs untimed before each timed call.
SETTLE_SECONDS = 0.1


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the minimum and median over the repetitions."""

    min: float
    median: float

    @property
    def min_ms(self) -> float:
        return self.min * 1e3

    @property
    def median_ms(self) -> float:
        return self.median * 1e3


def side_by_side(calls: Mapping[str, Callable[[], object]], repeat: int) -> dict[str, Timing]:
    """Time every call ``repeat`` times, interleaved; each is run once first (builds, caches)."""
    for call in calls.values():
        call()
    samples: dict[str, list[float]] = {label: [] for label in calls}
    last = dict.fromkeys(calls, 0.0)
    for _ in range(max(repeat, 1)):
        for label, call in calls.items():
            _settle(call, last[label])
            started = time.perf_counter()
            call()
            last[label] = time.perf_counter() - started
            samples[label].append(last[label])
    return {label: Timing(min(v), float(np.median(v))) for label, v in samples.items()}


def _settle(call: Callable[[], object], last_seconds: float) -> None:
    if last_seconds > SETTLE_SECONDS:
        time.sleep(0.15)
        return
    deadline = time.perf_counter() + SETTLE_SECONDS
    while time.perf_counter() < deadline:
        call()
