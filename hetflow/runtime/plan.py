"""Plan: which kernel on which device runs each node, and when each value can be released."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.base import Device, Kernel
from hetflow.graph import Graph, Node


@dataclass(frozen=True)
class StreamedWeight:
    """A weight that is not kept in memory: where it lies in a raw scratch file."""

    path: str
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def map(self) -> np.ndarray:
        """A read-only mapping of the weight (unmapped when the array is collected)."""
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)


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
        streamed: initializers read from disk when a step needs them (``hetflow.runtime.budget``).
    """

    graph: Graph
    steps: list[Step]
    release_after: dict[int, list[str]] = field(default_factory=dict)
    streamed: dict[str, StreamedWeight] = field(default_factory=dict)
    #: Compiled forms by requested outputs (``executor.compiled``); kept on the plan so they die with it.
    programs: dict[tuple[str, ...], Any] = field(default_factory=dict, repr=False, compare=False)

    def placement(self) -> dict[str, str]:
        """Node name -> device id."""
        return {step.node.name: step.device.id for step in self.steps}
