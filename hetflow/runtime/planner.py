"""Placement and lifetimes: turn a Graph into a Plan for a list of devices."""

from __future__ import annotations

from collections.abc import Sequence

from hetflow.devices.base import Device
from hetflow.errors import UnsupportedNode, UnsupportedOpsError
from hetflow.graph import Graph, Node
from hetflow.graph.shapes import is_static
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import DIRECT_FMA
from hetflow.runtime.executor import (
    ThreadArrangement,
    graph_recurrent_batch,
    node_conv_macs,
    thread_arrangement,
)
from hetflow.runtime.placement import (
    NodeCosts,
    PlacementRules,
    TransferCosts,
    candidate_devices,
    cheapest,
    input_seconds,
)
from hetflow.runtime.plan import Plan, Step
from hetflow.tuning.select import HEURISTICS, Tuner


def make_plan(
    graph: Graph,
    devices: Sequence[Device],
    tuner: Tuner | None = None,
    rules: PlacementRules | None = None,
    costs: NodeCosts | None = None,
    transfers: TransferCosts | None = None,
    threads: int | None = None,
) -> Plan:
    """Assign each node to a device that has a kernel for it, and pick the kernel.

    The device is the one ``rules`` pins the node to, else the measured-fastest per ``costs`` (counting,
    with ``transfers``, the moves of its inputs from where their producers were placed), else the
    first in priority order (``hetflow.runtime.placement``); host-side shape arithmetic stays on the
    CPU.

    Kernels are asked with what is known of the node's inputs (``known_infos``): with a symbolic
    batch the shapes hold symbols but the dtypes are known, so a float64 node is never placed on a
    float32-only kernel.

    Where a node's input shapes are concrete (bind the batch first: ``passes.bind_batch``) and its
    device has several kernels for it (Conv's algorithms), ``tuner`` chooses one: a measurement from
    the tuning cache, else the cost model (``hetflow.tuning.select``). Without ``tuner`` the choice is
    the cost model's and no file is read. A CPU kernel is measured, and its record looked up, in the
    thread arrangement a run of ``graph`` at ``threads`` will hold (``run_arrangement``). Nodes with
    symbolic shapes get the device's first kernel that supports what is known of them (for Conv on the
    CPU a dispatcher that applies the cost model at run time).

    Raises:
        UnsupportedOpsError: listing every node no device can run.
    """
    tuner = tuner or Tuner(use_cache=False)
    steps: list[Step] = []
    missing: list[UnsupportedNode] = []
    rules = rules or PlacementRules()
    where: dict[str, str] = {}  # value -> the device its producer was placed on
    # Only a tuner that reads or writes records needs it (one cost-model call per Conv).
    arrangement = run_arrangement(graph, threads) if tuner.use_cache or tuner.tune else None
    for node in graph.nodes:
        inputs = input_infos(graph, node)
        known = inputs if inputs is not None else known_infos(graph, node)
        allowed = candidate_devices(node, devices, rules)
        usable = [d for d in allowed if d.kernels.lookup(node, known) is not None]
        if not usable:
            reasons = _reasons(node, known, allowed, rules)
            missing.append(UnsupportedNode(node.name, node.op_type, node.domain, reasons))
            continue
        moving = None
        if transfers:
            def moving(device: Device, node: Node = node) -> float:
                return input_seconds(graph, node, device.id, where, transfers)
        device = cheapest(node, usable, costs, moving)
        where.update(dict.fromkeys(node.present_outputs(), device.id))
        kernel = device.kernels.lookup(node, known)
        assert kernel is not None
        choice = tuner.choose(device, node, inputs, arrangement) if inputs is not None else None
        steps.append(Step(node, choice.kernel if choice else kernel, device))
    if missing:
        raise UnsupportedOpsError(missing)
    return Plan(graph, steps, _release_points(graph, steps))


def run_arrangement(graph: Graph, threads: int | None = None) -> ThreadArrangement:
    """The threads a run of ``graph`` (its shapes bound) at ``threads`` will hold, with its Convs on the
    cost model's algorithms.

    The executor decides from the plan's own algorithms; only a small network's batch can differ, where
    tuned choices move the direct kernel's share across ``OWN_THREADS_MIN_DIRECT_SHARE``.
    """
    conv = direct = 0
    for node in graph.nodes:
        macs = node_conv_macs(node, graph.values)
        inputs = input_infos(graph, node) if macs else None
        if inputs is None:
            continue
        conv += macs
        if HEURISTICS["Conv"](node, inputs) == DIRECT_FMA:
            direct += macs
    return thread_arrangement(conv, _holds_batch(graph), threads, direct, graph_recurrent_batch(graph))


def _holds_batch(graph: Graph) -> bool:
    """Whether the graph's first input has a concrete leading dimension above one (as ``holds_batch``
    reads a run's feeds)."""
    first = next(iter(graph.input_values()), None)
    shape = first.shape if first is not None else None
    return bool(shape) and isinstance(shape[0], int) and shape[0] > 1


def _reasons(
    node: Node, inputs: list[TensorInfo | None] | None, allowed: Sequence[Device], rules: PlacementRules
) -> str:
    pinned = rules.rule_for(node)
    if pinned is not None and not allowed:
        return f"placed on '{pinned}' by a placement rule, but the session has no such device"
    reasons = "; ".join(f"{d.id}: {d.kernels.reason_unsupported(node, inputs)}" for d in allowed)
    return f"placed on '{pinned}' by a placement rule; {reasons}" if pinned is not None else reasons


def input_infos(graph: Graph, node: Node) -> list[TensorInfo | None] | None:
    """The node's input shapes and dtypes when every one is known and concrete, else None."""
    infos: list[TensorInfo | None] = []
    for name in node.inputs:
        if not name:
            infos.append(None)
            continue
        value = graph.values.get(name)
        if value is None or value.shape is None or not is_static(value.shape):
            return None
        infos.append(TensorInfo(tuple(value.shape), value.dtype))
    return infos


def known_infos(graph: Graph, node: Node) -> list[TensorInfo | None] | None:
    """The node's input shapes (symbolic dimensions kept) and dtypes; None when one is unknown."""
    infos: list[TensorInfo | None] = []
    for name in node.inputs:
        if not name:
            infos.append(None)
            continue
        value = graph.values.get(name)
        if value is None or value.shape is None:
            return None
        infos.append(TensorInfo(tuple(value.shape), value.dtype))
    return infos


def _release_points(graph: Graph, steps: Sequence[Step]) -> dict[int, list[str]]:
    """Step index -> values that step reads last (graph outputs and initializers are never released)."""
    last_reader: dict[str, int] = {}
    for index, step in enumerate(steps):
        for name in step.node.present_inputs():
            last_reader[name] = index
        for name in step.node.present_outputs():
            last_reader.setdefault(name, index)  # written but never read: release at once
    pinned = set(graph.outputs) | set(graph.initializers)
    release: dict[int, list[str]] = {}
    for name, index in last_reader.items():
        if name not in pinned:
            release.setdefault(index, []).append(name)
    return release
