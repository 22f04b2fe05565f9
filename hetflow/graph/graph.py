"""Graph, Node and Value: the one IR that frontends produce and every other unit reads."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.errors import InvalidModelError
from hetflow.graph.shapes import Shape, format_shape


@dataclass
class Value:
    """A tensor flowing through the graph: its name, shape (may hold symbols) and dtype."""

    name: str
    shape: Shape | None
    dtype: np.dtype

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} {format_shape(self.shape)}"


@dataclass
class Node:
    """One operator application.

    Attributes:
        op_type: the ONNX op name, e.g. ``"Conv"``.
        name: unique within the graph (the importer names anonymous nodes).
        inputs: value names; ``""`` marks an omitted optional input.
        outputs: value names; ``""`` marks an omitted optional output.
        attrs: the op definition's frozen, typed attribute object (defaults already applied).
        domain: the operator set domain; ``""`` is the default ONNX domain.
    """

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: Any = None
    domain: str = ""

    def present_inputs(self) -> list[str]:
        return [name for name in self.inputs if name]

    def present_outputs(self) -> list[str]:
        return [name for name in self.outputs if name]


@dataclass
class Graph:
    """A dataflow graph with initializers (weights and constants) and static value information.

    ``nodes`` is kept in topological order by everything that edits it (``toposort`` restores it).
    """

    nodes: list[Node] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    values: dict[str, Value] = field(default_factory=dict)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    name: str = "graph"
    opset: int = 0
    metadata: dict[str, str] = field(default_factory=dict)

    # -- queries -------------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        """Map from value name to the node that writes it."""
        return {out: node for node in self.nodes for out in node.present_outputs()}

    def consumers(self) -> dict[str, list[Node]]:
        """Map from value name to the nodes that read it, in node order."""
        readers: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.present_inputs():
                readers.setdefault(name, []).append(node)
        return readers

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node named '{name}'")

    def is_constant(self, name: str) -> bool:
        return name in self.initializers

    def input_values(self) -> list[Value]:
        """The values a caller must feed (graph inputs that are not initializers)."""
        return [self.values[n] for n in self.inputs if n not in self.initializers]

    def output_values(self) -> list[Value]:
        return [self.values[n] for n in self.outputs]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def copy(self) -> Graph:
        """A structural copy; initializer arrays are shared (treat them as read-only)."""
        clone = copy.copy(self)
        clone.nodes = [copy.copy(n) for n in self.nodes]
        for node in clone.nodes:
            node.inputs = list(node.inputs)
            node.outputs = list(node.outputs)
        clone.inputs = list(self.inputs)
        clone.outputs = list(self.outputs)
        clone.values = {k: copy.copy(v) for k, v in self.values.items()}
        clone.initializers = dict(self.initializers)
        clone.metadata = dict(self.metadata)
        return clone

    # -- edits ---------------------------------------------------------------------------------
    def toposort(self) -> None:
        """Order nodes so that every value is written before it is read; raises on cycles."""
        available = set(self.inputs) | set(self.initializers) | {""}
        pending = list(self.nodes)
        ordered: list[Node] = []
        while pending:
            ready = [n for n in pending if all(i in available for i in n.inputs)]
            if not ready:
                missing = sorted({i for n in pending for i in n.inputs if i not in available})
                names = ", ".join(f"'{n.name}'" for n in pending[:5])
                raise InvalidModelError(
                    f"graph has a cycle or reads undefined values {missing[:10]} (nodes {names} ...)"
                )
            ready_ids = {id(n) for n in ready}
            ordered.extend(ready)
            available.update(o for n in ready for o in n.outputs)
            pending = [n for n in pending if id(n) not in ready_ids]
        self.nodes = ordered

    def remove_unused(self) -> None:
        """Drop nodes and initializers that no graph output depends on."""
        needed = set(self.outputs)
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(o in needed for o in node.present_outputs()):
                kept.append(node)
                needed.update(node.present_inputs())
        self.nodes = kept[::-1]
        self.initializers = {k: v for k, v in self.initializers.items() if k in needed}
        live = needed | set(self.inputs) | {o for n in self.nodes for o in n.outputs}
        self.values = {k: v for k, v in self.values.items() if k in live}

    def rename_value(self, old: str, new: str) -> None:
        """Make every reader of ``old`` read ``new`` instead (graph outputs included)."""
        for node in self.nodes:
            node.inputs = [new if i == old else i for i in node.inputs]
        self.outputs = [new if o == old else o for o in self.outputs]

    def validate(self) -> None:
        """Check names are unique, defined before use, and known; raises InvalidModelError."""
        written: dict[str, str] = {}
        for node in self.nodes:
            for out in node.present_outputs():
                if out in written or out in self.initializers or out in self.inputs:
                    raise InvalidModelError(f"value '{out}' is written twice (node '{node.name}')")
                written[out] = node.name
        available = set(self.inputs) | set(self.initializers)
        for node in self.nodes:
            for name in node.present_inputs():
                if name not in available:
                    raise InvalidModelError(
                        f"node '{node.name}' ({node.op_type}) reads '{name}', which is not defined "
                        "before it"
                    )
            available.update(node.present_outputs())
        for out in self.outputs:
            if out not in available:
                raise InvalidModelError(f"graph output '{out}' is never produced")
