"""Per-node timing collected through the executor's observer hook."""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field

from hetflow.runtime.plan import Step


@dataclass
class Profiler:
    """Accumulates wall time per node and per op type over one or more runs.

    Pass ``profiler.observe`` as the ``observer`` of ``InferenceSession.run``.
    """

    node_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    node_op: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def observe(self, step: Step, seconds: float) -> None:
        with self._lock:
            self.node_seconds[step.node.name] += seconds
            self.op_seconds[step.node.op_type] += seconds
            self.node_op[step.node.name] = step.node.op_type

    def op_type_shares(self) -> list[tuple[str, float, float]]:
        """(op type, seconds, share of the total) sorted by time, largest first."""
        total = sum(self.op_seconds.values()) or 1.0
        rows = sorted(self.op_seconds.items(), key=lambda item: -item[1])
        return [(op, seconds, seconds / total) for op, seconds in rows]
