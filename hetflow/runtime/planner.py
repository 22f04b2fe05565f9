"""Placement and lifetimes: turn a Graph into a Plan for a list of devices."""

from __future__ import annotations

from collections.abc import Sequence

from hetflow.devices.base import Device
from hetflow.errors import UnsupportedNode, UnsupportedOpsError
from hetflow.graph import Graph
from hetflow.runtime.plan import Plan, Step


def make_plan(graph: Graph, devices: Sequence[Device]) -> Plan:
    """Assign each node to the first device (in priority order) that has a kernel for it.

    Raises:
        UnsupportedOpsError: listing every node no device can run.
    """
    steps: list[Step] = []
    missing: list[UnsupportedNode] = []
    for node in graph.nodes:
        for device in devices:
            kernel = device.kernels.lookup(node)
            if kernel is not None:
                steps.append(Step(node, kernel, device))
                break
        else:
            reasons = "; ".join(
                f"{d.id}: {d.kernels.reason_unsupported(node)}" for d in devices
            )
            missing.append(UnsupportedNode(node.name, node.op_type, node.domain, reasons))
    if missing:
        raise UnsupportedOpsError(missing)
    return Plan(graph, steps, _release_points(graph, steps))


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
