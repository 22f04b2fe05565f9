"""Per-node timing collected through the executor's observer hook."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.devices.base import Device
from hetflow.runtime.plan import Step


@dataclass
class NodeRecord:
    """What one node cost over the observed runs.

    Attributes:
        name: node name.
        op_type: its op.
        device: the device id that ran it.
        algorithm: the kernel's algorithm.
        seconds: wall time summed over the observed runs.
        calls: how many times it ran.
        copied_bytes: host<->device bytes copied for it (OpenCL devices; 0 on the CPU): its inputs
            brought where it runs, and its outputs brought to the host when they are returned. Values
            passed between nodes on one device are never copied.
        copied_in_bytes: of those, host to device.
        copied_out_bytes: of those, device to host.
        mapped_bytes: bytes that a host-unified-memory device mapped instead of copying (the copies a
            discrete GPU would make).
    """

    name: str
    op_type: str
    device: str
    algorithm: str
    seconds: float = 0.0
    calls: int = 0
    copied_bytes: int = 0
    copied_in_bytes: int = 0
    copied_out_bytes: int = 0
    mapped_bytes: int = 0


@dataclass
class Profiler:
    """Accumulates wall time (and transfer bytes) per node and per op type over one or more runs.

    Pass ``profiler.observe`` as the ``observer`` of ``InferenceSession.run``. With ``devices`` given,
    each node is also charged the bytes those devices copied or mapped for it (read from their
    ``transfers`` counters; an observed run is sequential and moves a value just before the node that
    reads it, and a returned value just after the node that makes it, so the attribution is exact).
    """

    devices: Sequence[Device] = ()
    node_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    op_seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    node_op: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    _last_transfers: tuple[int, int, int] = (0, 0, 0)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._last_transfers = self._transfer_totals()

    def observe(self, step: Step, seconds: float) -> None:
        node = step.node
        with self._lock:
            self.node_seconds[node.name] += seconds
            self.op_seconds[node.op_type] += seconds
            self.node_op[node.name] = node.op_type
            record = self.nodes.get(node.name)
            if record is None:
                record = NodeRecord(node.name, node.op_type, step.device.id, step.kernel.algorithm)
                self.nodes[node.name] = record
            record.seconds += seconds
            record.calls += 1
            totals = self._transfer_totals()
            copied_in, copied_out, mapped = (now - last for now, last in zip(totals, self._last_transfers))
            record.copied_in_bytes += copied_in
            record.copied_out_bytes += copied_out
            record.copied_bytes += copied_in + copied_out
            record.mapped_bytes += mapped
            self._last_transfers = totals

    def _transfer_totals(self) -> tuple[int, int, int]:
        """(copied in, copied out, mapped) bytes over ``devices`` so far."""
        copied_in = copied_out = mapped = 0
        for device in self.devices:
            stats = getattr(device, "transfers", None)
            if stats is not None:
                copied_in += stats.copied_in
                copied_out += stats.copied_out
                mapped += stats.mapped
        return copied_in, copied_out, mapped

    def op_type_shares(self) -> list[tuple[str, float, float]]:
        """(op type, seconds, share of the total) sorted by time, largest first."""
        total = sum(self.op_seconds.values()) or 1.0
        rows = sorted(self.op_seconds.items(), key=lambda item: -item[1])
        return [(op, seconds, seconds / total) for op, seconds in rows]

    def device_totals(self) -> list[tuple[str, int, float, int, int]]:
        """Per device: (id, nodes, seconds, copied bytes, mapped bytes), in first-use order."""
        totals: dict[str, list[float]] = {}
        for record in self.nodes.values():
            row = totals.setdefault(record.device, [0, 0.0, 0, 0])
            row[0] += 1
            row[1] += record.seconds
            row[2] += record.copied_bytes
            row[3] += record.mapped_bytes
        return [(device, int(r[0]), r[1], int(r[2]), int(r[3])) for device, r in totals.items()]
