"""Bookkeeping shared by the rewriting passes: who reads what, new constants, node removal.

A pass builds one ``Rewriter`` over the graph, edits through it (so its producer/reader maps stay
true while the graph changes), and calls ``finish`` once at the end. Constants are never modified in
place: ``optimize`` works on ``graph.copy()``, whose initializer arrays are shared with the loaded
graph, so a changed weight is always a new array.
"""

from __future__ import annotations

import numpy as np

from hetflow.graph import Graph, Node, Value


class Rewriter:
    """Producer and reader maps of a graph that stay correct through the edits made with it."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers: dict[str, Node] = graph.producers()
        self.readers: dict[str, list[Node]] = graph.consumers()
        self._removed: set[int] = set()
        self._taken = set(graph.values) | set(graph.initializers) | {n.name for n in graph.nodes}

    # -- queries -------------------------------------------------------------------------------
    def sole_reader(self, name: str) -> Node | None:
        """The one node reading ``name`` (once), or None when it has several readers or is an output."""
        readers = self.readers.get(name, [])
        if len(readers) != 1 or name in self.graph.outputs:
            return None
        return readers[0]

    def only_reader_is(self, name: str, node: Node) -> bool:
        """True when ``node`` alone reads ``name`` (once) and it is not a graph output."""
        return self.sole_reader(name) is node

    def constant(self, name: str) -> np.ndarray | None:
        """The initializer called ``name``, or None (also for an omitted input ``""``)."""
        return self.graph.initializers.get(name) if name else None

    # -- edits ---------------------------------------------------------------------------------
    def set_constant(self, node: Node, index: int, array: np.ndarray, hint: str) -> None:
        """Make input ``index`` of ``node`` the constant ``array`` (appending the input if needed).

        The initializer it read is replaced under its own name when ``node`` is its only reader, else
        a fresh name is used so that other readers keep the old value.
        """
        while len(node.inputs) <= index:
            node.inputs.append("")
        old = node.inputs[index]
        exclusive = old in self.graph.initializers and self.only_reader_is(old, node)
        name = old if exclusive else self.fresh_name(f"{node.name}_{hint}")
        if old and not exclusive:
            self._forget_reader(old, node)
        array = np.ascontiguousarray(array).reshape(array.shape)
        self.graph.initializers[name] = array
        self.graph.values[name] = Value(name, tuple(array.shape), array.dtype)
        node.inputs[index] = name
        self.readers[name] = [node]

    def add_constant(self, name: str, array: np.ndarray) -> None:
        """Turn value ``name`` (whose producer is being removed) into an initializer."""
        self.graph.initializers[name] = array
        self.graph.values[name] = Value(name, tuple(array.shape), array.dtype)
        self.producers.pop(name, None)

    def take_over_output(self, producer: Node, old: str, node: Node) -> None:
        """``producer`` now writes ``node``'s first output instead of ``old``; ``node`` is removed.

        ``old`` must be read by ``node`` alone, so it disappears from the graph.
        """
        new = node.outputs[0]
        producer.outputs = [new if o == old else o for o in producer.outputs]
        self.producers[new] = producer
        self.producers.pop(old, None)
        self.readers.pop(old, None)
        self.graph.values.pop(old, None)
        self.remove(node)

    def rename_output(self, producer: Node, old: str, new: str) -> None:
        """``producer`` writes ``new`` instead of ``old``, and every reader of ``old`` reads ``new``."""
        producer.outputs = [new if o == old else o for o in producer.outputs]
        self.producers.pop(old, None)
        self.producers[new] = producer
        self.redirect_readers(old, new)
        self.graph.values.pop(old, None)

    def redirect_readers(self, old: str, new: str) -> None:
        """Every node reading ``old`` reads ``new`` instead (graph outputs are left alone)."""
        moved = self.readers.pop(old, [])
        for reader in moved:
            reader.inputs = [new if i == old else i for i in reader.inputs]
        self.readers.setdefault(new, []).extend(moved)

    def remove(self, node: Node) -> None:
        """Drop ``node`` (its inputs lose a reader); the node list is filtered in ``finish``."""
        self._removed.add(id(node))
        for name in node.present_inputs():
            self._forget_reader(name, node)
        for name in node.present_outputs():
            if self.producers.get(name) is node:
                del self.producers[name]

    def fresh_name(self, hint: str) -> str:
        name, suffix = hint, 1
        while name in self._taken:
            name, suffix = f"{hint}_{suffix}", suffix + 1
        self._taken.add(name)
        return name

    def finish(self) -> Graph:
        """Apply the removals and drop initializers nothing reads any more; returns the graph."""
        graph = self.graph
        if self._removed:
            graph.nodes = [n for n in graph.nodes if id(n) not in self._removed]
        read = {name for node in graph.nodes for name in node.present_inputs()}
        read |= set(graph.outputs) | set(graph.inputs)
        for name in [n for n in graph.initializers if n not in read]:
            del graph.initializers[name]
            graph.values.pop(name, None)
        return graph

    def _forget_reader(self, name: str, node: Node) -> None:
        readers = self.readers.get(name)
        if readers is None:
            return
        for position, reader in enumerate(readers):
            if reader is node:
                del readers[position]
                break
        if not readers:
            del self.readers[name]
