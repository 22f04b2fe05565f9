"""Which device runs each node: the user's rules first, then measured costs or the priority order.

Three sources decide, in this order (ONNX Runtime's partitioning contract, plus RSTensorFlow's lesson
that the accelerator is not always faster):

1. **rules** the user wrote: ``placement={"conv1": "cpu"}`` pins a node by name,
   ``placement={"Conv": "cpu", "Gemm": "opencl:0"}`` pins every node of an op type (a node's own
   rule wins over its op type's);
2. **measured costs** (``device="auto"`` with more than one device, once the shapes are concrete): every
   node's time on every device that has a kernel for it, taken from a profiled run of the whole graph
   on each device (``measure_costs``); when a per-node mix sums to more than ``MIN_MIX_GAIN`` below
   the best single device, each node goes where it was fastest;
3. **priority order**: the first device, in the session's order, with a kernel for the node.

Per-node sums are only a guide: a profiled run waits for every node, and misses what a run pays
between nodes (an accelerator's queue latency at each crossing, another device's threads spinning on
shared cores). So ``"auto"`` finally times whole runs of its candidates, each device alone and the
mix, and keeps the fastest (``time_plans``; the session does this): it is never slower than the best
single device by more than the timing noise.

Host-side shape arithmetic (ops with the ``shape`` trait) stays on the CPU unless a rule
says otherwise: moving it would only add transfers.

Transfers: the executor keeps a value where its producer left it and moves it once to each other
place that reads it (``hetflow.runtime.executor``), so a chain of nodes on one device moves nothing
between them. The measured per-node times come from single-device runs and hold no such crossings;
``crossing_seconds`` adds them, priced by ``measure_transfers``, wherever a placement puts a value's
producer and a reader on different devices (weights never cross: devices keep them resident).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hetflow.devices.base import Device
from hetflow.graph import Graph, Node
from hetflow.ops import registry
from hetflow.runtime.plan import Plan

#: Op traits whose nodes the CPU keeps when no rule names them (reshapes are not among them: an
#: accelerator aliases its own buffer, where a move to the host would cost two transfers).
HOST_TRAITS = frozenset({"shape"})
#: A node moves off the priority device only when another one is faster by more than this fraction:
#: smaller differences are measurement noise, and every move is a possible extra transfer.
MIN_GAIN = 0.05


@dataclass(frozen=True)
class PlacementRules:
    """Device pins by node name and by op type.

    Attributes:
        nodes: node name -> device id.
        ops: op type -> device id.
    """

    nodes: Mapping[str, str] = field(default_factory=dict)
    ops: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, mapping: Mapping[str, str] | None, graph: Graph) -> PlacementRules:
        """Split ``mapping`` into node and op-type rules; a key must name a node of ``graph`` or an op.

        Raises:
            ValueError: a key that is neither, or a value that is not a string.
        """
        if not mapping:
            return cls()
        node_names = {node.name for node in graph.nodes}
        nodes: dict[str, str] = {}
        ops: dict[str, str] = {}
        unknown = []
        for key, device_id in mapping.items():
            if not isinstance(device_id, str):
                raise ValueError(f"placement for '{key}' must be a device id string, not {device_id!r}")
            if key in node_names:
                nodes[key] = device_id
            elif registry.lookup(key) is not None:
                ops[key] = device_id
            else:
                unknown.append(key)
        if unknown:
            raise ValueError(
                f"placement keys {unknown} name neither a node of the model nor an op type; nodes look like "
                f"{sorted(node_names)[:5]}, op types like {sorted({n.op_type for n in graph.nodes})[:8]}"
            )
        return cls(nodes, ops)

    def device_ids(self) -> set[str]:
        """Every device a rule names."""
        return set(self.nodes.values()) | set(self.ops.values())

    def rule_for(self, node: Node) -> str | None:
        """The device id a rule pins ``node`` to, or None."""
        return self.nodes.get(node.name) or self.ops.get(node.op_type)

    def __bool__(self) -> bool:
        return bool(self.nodes or self.ops)


#: node name -> device id -> seconds on that device.
NodeCosts = Mapping[str, Mapping[str, float]]


@dataclass(frozen=True)
class TransferCost:
    """What moving a value between the host and one device costs: ``latency + bytes * per_byte``.

    Attributes:
        latency_s: seconds per transfer.
        to_device_s: seconds per byte, host to device.
        to_host_s: seconds per byte, device to host.
    """

    latency_s: float = 0.0
    to_device_s: float = 0.0
    to_host_s: float = 0.0

    def up(self, nbytes: int) -> float:
        return self.latency_s + nbytes * self.to_device_s

    def down(self, nbytes: int) -> float:
        return self.latency_s + nbytes * self.to_host_s


#: device id -> its transfer cost; devices not listed work in host memory (moving costs nothing).
TransferCosts = Mapping[str, TransferCost]


def value_bytes(graph: Graph, name: str) -> int:
    """Bytes of a value with a concrete shape (0 when unknown)."""
    value = graph.values.get(name)
    if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape):
        return 0
    return int(np.prod(value.shape, dtype=np.int64)) * np.dtype(value.dtype).itemsize


def crossing_seconds(
    graph: Graph, placement: Mapping[str, str], transfers: TransferCosts, host: str = "cpu"
) -> float:
    """Seconds ``placement`` (node name -> device id) spends moving values between devices, as the
    executor moves them: a value produced on a device goes to the host once if anything elsewhere reads
    it, and to each other device once. Weights never move; graph inputs and returned values are left
    out: the measured time of the node that first reads or makes one on a device includes its move."""
    producer: dict[str, str] = {}
    for node in graph.nodes:
        for name in node.present_outputs():
            producer[name] = placement.get(node.name, host)
    readers: dict[str, set[str]] = {}
    for node in graph.nodes:
        for name in node.present_inputs():
            if name in producer:
                readers.setdefault(name, set()).add(placement.get(node.name, host))
    seconds = 0.0
    for name, places in readers.items():
        source = producer[name]
        elsewhere = places - {source}
        if not elsewhere:
            continue
        nbytes = value_bytes(graph, name)
        if source in transfers:
            seconds += transfers[source].down(nbytes)
        seconds += sum(transfers[place].up(nbytes) for place in elsewhere if place in transfers)
    return seconds


def input_seconds(
    graph: Graph, node: Node, device_id: str, where: Mapping[str, str], transfers: TransferCosts
) -> float:
    """Seconds to bring ``node``'s inputs to ``device_id`` from where their producers were placed
    (``where``: value name -> device id). Weights and graph inputs are left out, as in
    ``crossing_seconds``."""
    seconds = 0.0
    for name in node.present_inputs():
        if name not in where:
            continue
        source = where[name]
        if source == device_id:
            continue
        nbytes = value_bytes(graph, name)
        if source in transfers:
            seconds += transfers[source].down(nbytes)
        if device_id in transfers:
            seconds += transfers[device_id].up(nbytes)
    return seconds


def keeps_on_host(node: Node) -> bool:
    """Whether ``node`` is host-side shape arithmetic that no accelerator should take."""
    definition = registry.lookup(node.op_type, node.domain)
    return definition is not None and bool(definition.traits & HOST_TRAITS)


def candidate_devices(node: Node, devices: Sequence[Device], rules: PlacementRules) -> list[Device]:
    """The devices, in priority order, that may run ``node`` under ``rules``.

    A pinned node has exactly its rule's device; host-side shape arithmetic has the CPU (when the session
    has one); everything else has every device.
    """
    pinned = rules.rule_for(node)
    if pinned is not None:
        return [d for d in devices if d.id == pinned]
    if keeps_on_host(node):
        host = [d for d in devices if d.kind == "cpu"]
        if host:
            return host
    return list(devices)


def cheapest(
    node: Node,
    usable: Sequence[Device],
    costs: NodeCosts | None,
    moving: Callable[[Device], float] | None = None,
) -> Device:
    """Among ``usable`` (priority order, every one able to run ``node``), the measured-fastest one.

    Without measurements for the node the first device wins; another wins only when faster by more
    than ``MIN_GAIN`` (so a noisy tie keeps the priority order). ``moving(device)``: seconds to bring
    the node's inputs to ``device`` (``input_seconds``), added to its time, so that a node leaves the
    device its inputs are on only when it gains more than the crossing costs.
    """
    best = usable[0]
    times = costs.get(node.name) if costs else None
    if not times or len(usable) == 1:
        return best

    def total(device: Device) -> float | None:
        seconds = times.get(device.id)
        if seconds is None:
            return None
        return seconds + (moving(device) if moving is not None else 0.0)

    for device in usable[1:]:
        seconds = total(device)
        best_seconds = total(best)
        if seconds is None:
            continue
        if best_seconds is None or seconds < best_seconds * (1 - MIN_GAIN):
            best = device
    return best


#: A mix of devices must beat the best single device by this much of its total, or the single device
#: runs everything: per-node times miss what a mix costs between nodes (another device's worker
#: threads spinning on shared cores, caches refilled after a hand-over).
MIN_MIX_GAIN = 0.10


def best_single_device(
    graph: Graph, devices: Sequence[Device], costs: NodeCosts, transfers: TransferCosts | None = None
) -> Device | None:
    """The device that should run the whole graph alone, or None when a per-node mix is worth it.

    A device's total is its measured time for every node it can run plus the CPU's time for the
    rest; the mix's total is every node's fastest time. Each total also pays for the values its
    placement moves between devices (``crossing_seconds`` with ``transfers``). The mix wins only when
    it is faster than the best single total by more than ``MIN_MIX_GAIN``.
    """
    host = next((d for d in devices if d.kind == "cpu"), None)
    if host is None:
        return None
    totals: dict[str, float] = {}
    placements: dict[str, dict[str, str]] = {d.id: {} for d in devices}
    mixed_placement: dict[str, str] = {}
    mixed = 0.0
    for node in graph.nodes:
        times = costs.get(node.name)
        if not times:
            continue
        fastest = min(times, key=times.__getitem__)
        mixed += times[fastest]
        mixed_placement[node.name] = fastest
        for device in devices:
            place = device.id if device.id in times else host.id
            seconds = times.get(place)
            if seconds is not None:
                totals[device.id] = totals.get(device.id, 0.0) + seconds
                placements[device.id][node.name] = place
    if not totals:
        return None
    if transfers:
        for device_id in totals:
            totals[device_id] += crossing_seconds(graph, placements[device_id], transfers, host.id)
        mixed += crossing_seconds(graph, mixed_placement, transfers, host.id)
    best_id = min(totals, key=totals.__getitem__)
    if mixed < totals[best_id] * (1 - MIN_MIX_GAIN):
        return None
    return next(d for d in devices if d.id == best_id)


def measure_transfers(devices: Sequence[Device], nbytes: int = 1 << 20, rounds: int = 5) -> dict[str, TransferCost]:
    """The transfer cost of each device that keeps values resident (it answers ``device_inputs``): the
    fastest of ``rounds`` moves of 64 bytes (the latency) and of ``nbytes`` each way. On unified memory
    a move is a map, and costs next to nothing. The devices' transfer counters are left as they were."""
    found: dict[str, TransferCost] = {}
    for device in devices:
        if not callable(getattr(device, "device_inputs", None)):
            continue
        stats = getattr(device, "transfers", None)
        saved = dict(vars(stats)) if stats is not None else {}
        found[device.id] = _transfer_cost(device, nbytes, rounds)
        if stats is not None:
            vars(stats).update(saved)
    return found


def _transfer_cost(device: Device, nbytes: int, rounds: int) -> TransferCost:
    small, large = np.zeros(16, np.float32), np.zeros(nbytes // 4, np.float32)
    up = [_fastest(functools.partial(_upload, device, a), rounds) for a in (small, large)]
    down = [_fastest(functools.partial(device.to_host, device.to_device(a)), rounds) for a in (small, large)]
    span = large.nbytes - small.nbytes
    return TransferCost(
        latency_s=min(up[0], down[0]),
        to_device_s=max(up[1] - up[0], 0.0) / span,
        to_host_s=max(down[1] - down[0], 0.0) / span,
    )


def _upload(device: Device, array: np.ndarray) -> None:
    device.to_device(array)
    device.synchronize()


def _fastest(fn: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(max(rounds, 1)):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def measure_costs(
    graph: Graph, devices: Sequence[Device], rounds: int = 3, seed: int = 0
) -> dict[str, dict[str, float]]:
    """Every node's time on every device, from profiled runs of ``graph`` placed on each device alone.

    ``graph`` must have concrete input shapes (bind the batch first). For each device a plan puts every
    node it can run on it (the CPU takes the rest), runs once to warm up (builds, caches) and then
    ``rounds`` times with a per-node timer; a node's cost on a device is its fastest round there. Nodes
    a device could not run are recorded for the device that did.
    """
    from hetflow.runtime.executor import execute
    from hetflow.runtime.planner import make_plan

    feeds = random_feeds(graph, seed)
    hosts = [d for d in devices if d.kind == "cpu"]
    costs: dict[str, dict[str, float]] = {}
    for device in devices:
        order = [device, *[h for h in hosts if h is not device]]
        plan = make_plan(graph, order)
        best: dict[str, tuple[str, float]] = {}

        def observe(step, seconds, best=best) -> None:  # noqa: ANN001  (the executor's Observer)
            name = step.node.name
            previous = best.get(name)
            if previous is None or seconds < previous[1]:
                best[name] = (step.device.id, seconds)

        execute(plan, feeds)
        for _ in range(rounds):
            execute(plan, feeds, observer=observe)
        for name, (device_id, seconds) in best.items():
            node_costs = costs.setdefault(name, {})
            node_costs[device_id] = min(seconds, node_costs.get(device_id, seconds))
    return costs


def time_plans(
    plans: Mapping[str, Plan], feeds: Mapping[str, np.ndarray], rounds: int = 3, threads: int | None = None
) -> dict[str, float]:
    """The fastest of ``rounds`` whole runs of each plan (label -> seconds), after one warm-up run each
    (builds, caches); the plans take turns, round by round, so that a drift of the machine's speed
    touches them alike. The plans are executed, so they must not be edited afterwards."""
    from hetflow.runtime.executor import execute

    for plan in plans.values():
        execute(plan, feeds, threads=threads)
    best = dict.fromkeys(plans, float("inf"))
    for _ in range(max(rounds, 1)):
        for label, plan in plans.items():
            started = time.perf_counter()
            execute(plan, feeds, threads=threads)
            best[label] = min(best[label], time.perf_counter() - started)
    return best


def random_feeds(graph: Graph, seed: int = 0, batch: int | None = None) -> dict[str, np.ndarray]:
    """Seeded inputs of the graph's input shapes (concrete, or their symbolic dimensions set to
    ``batch``): normal floats, zeros for integers."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input_values():
        shape = tuple(int(d) if batch is None or isinstance(d, int) else batch for d in value.shape or ())
        if np.issubdtype(value.dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(value.dtype)
        else:
            feeds[value.name] = np.zeros(shape, value.dtype)
    return feeds
