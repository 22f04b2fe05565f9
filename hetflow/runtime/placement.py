"""Which device runs each node: the user's rules first, then measured costs or the priority order.

Three sources decide, in this order (ONNX Runtime's partitioning contract, plus RSTensorFlow's lesson
that the accelerator is not always faster):

1. **rules** the user wrote: ``placement={"conv1": "cpu"}`` pins a node by name,
   ``placement={"Conv": "cpu", "Gemm": "opencl:0"}`` pins every node of an op type (a node's own
   rule wins over its op type's);
2. **measured costs** (``device="auto"`` with more than one device, once the shapes are concrete): every
   node's time on every device that has a kernel for it, taken from a profiled run of the whole graph
   on each device (``measure_costs``); the best single device runs everything unless a per-node mix
   measures more than ``MIN_MIX_GAIN`` faster, and then each node goes where it was fastest;
3. **priority order**: the first device, in the session's order, with a kernel for the node.

Host-side shape arithmetic (ops with the ``shape`` trait) stays on the CPU unless a rule
says otherwise: moving it would only add transfers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hetflow.devices.base import Device
from hetflow.graph import Graph, Node
from hetflow.ops import registry

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


def cheapest(node: Node, usable: Sequence[Device], costs: NodeCosts | None) -> Device:
    """Among ``usable`` (priority order, every one able to run ``node``), the measured-fastest one.

    Without measurements for the node the first device wins; another wins only when faster by more
    than ``MIN_GAIN`` (so a noisy tie keeps the priority order).
    """
    best = usable[0]
    times = costs.get(node.name) if costs else None
    if not times or len(usable) == 1:
        return best
    for device in usable[1:]:
        seconds = times.get(device.id)
        best_seconds = times.get(best.id)
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
    graph: Graph, devices: Sequence[Device], costs: NodeCosts
) -> Device | None:
    """The device that should run the whole graph alone, or None when a per-node mix is worth it.

    A device's total is its measured time for every node it can run plus the CPU's time for the
    rest; the mix's total is every node's fastest time. The mix wins only when it is faster than the
    best single total by more than ``MIN_MIX_GAIN``.
    """
    host = next((d for d in devices if d.kind == "cpu"), None)
    if host is None:
        return None
    totals: dict[str, float] = {}
    mixed = 0.0
    for node in graph.nodes:
        times = costs.get(node.name)
        if not times:
            continue
        mixed += min(times.values())
        for device in devices:
            seconds = times.get(device.id, times.get(host.id))
            if seconds is not None:
                totals[device.id] = totals.get(device.id, 0.0) + seconds
    if not totals:
        return None
    best_id = min(totals, key=totals.__getitem__)
    if mixed < totals[best_id] * (1 - MIN_MIX_GAIN):
        return None
    return next(d for d in devices if d.id == best_id)


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

    feeds = _random_feeds(graph, seed)
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


def _random_feeds(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of the graph's (concrete) input shapes: normal floats, zeros for integers."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input_values():
        shape = tuple(int(d) for d in value.shape or ())
        if np.issubdtype(value.dtype, np.floating):
            feeds[value.name] = rng.standard_normal(shape).astype(value.dtype)
        else:
            feeds[value.name] = np.zeros(shape, value.dtype)
    return feeds
