"""Placement and lifetimes: turn a Graph into a Plan for a list of devices."""

from __future__ import annotations

from collections.abc import Sequence

from hetflow.devices.base import Device
from hetflow.errors import UnsupportedNode, UnsupportedOpsError
from hetflow.graph import Graph, Node
from hetflow.graph.shapes import is_static
from hetflow.ops.base import TensorInfo
from hetflow.runtime.plan import Plan, Step
from hetflow.tuning.select import Tuner


def make_plan(graph: Graph, devices: Sequence[Device], tuner: Tuner | None = None) -> Plan:
    """Assign each node to the first device (in priority order) that has a kernel for it, and pick the
    kernel.

    Where a node's input shapes are concrete (bind the batch first: ``passes.bind_batch``) and its
    device has several kernels for it (Conv's algorithms), ``tuner`` chooses one: a measurement from
    the tuning cache, else the cost model (``hetflow.tuning.select``). Without ``tuner`` the choice is
    the cost model's and no file is read. Nodes with symbolic shapes get the device's first kernel
    (for Conv a dispatcher that applies the cost model at run time).

    Raises:
        UnsupportedOpsError: listing every node no device can run.
    """
    tuner = tuner or Tuner(use_cache=False)
    steps: list[Step] = []
    missing: list[UnsupportedNode] = []
    for node in graph.nodes:
        inputs = input_infos(graph, node)
        for device in devices:
            kernel = device.kernels.lookup(node, inputs)
            if kernel is not None:
                choice = tuner.choose(device, node, inputs) if inputs is not None else None
                steps.append(Step(node, choice.kernel if choice else kernel, device))
                break
        else:
            reasons = "; ".join(
                f"{d.id}: {d.kernels.reason_unsupported(node, inputs)}" for d in devices
            )
            missing.append(UnsupportedNode(node.name, node.op_type, node.domain, reasons))
    if missing:
        raise UnsupportedOpsError(missing)
    return Plan(graph, steps, _release_points(graph, steps))


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
