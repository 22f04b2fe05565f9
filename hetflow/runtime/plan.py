"""Plan: which kernel on which device runs each node, and when each value can be released."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetflow.devices.base import Device, Kernel
from hetflow.graph import Graph, Node


@dataclass(frozen=True)
class Step:
    """One node bound to the kernel and device that run it."""

    node: Node
    kernel: Kernel
    device: Device


@dataclass
class Plan:
    """An executable schedule for one graph.

    Attributes:
        graph: the graph the steps come from (shapes may still be symbolic).
        steps: in execution order.
        release_after: step index -> value names whose last reader is that step.
    """

    graph: Graph
    steps: list[Step]
    release_after: dict[int, list[str]] = field(default_factory=dict)

    def placement(self) -> dict[str, str]:
        """Node name -> device id."""
        return {step.node.name: step.device.id for step in self.steps}
