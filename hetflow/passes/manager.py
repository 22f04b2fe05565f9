"""The ordered list of optimisation passes a session applies to a loaded graph."""

from __future__ import annotations

from collections.abc import Callable

from hetflow.graph import Graph

Pass = Callable[[Graph], Graph]

#: Applied in order by ``optimize``; each is a ``Graph -> Graph`` function with its own tests.
OPTIMIZATION_PASSES: list[Pass] = []


def optimize(graph: Graph, passes: list[Pass] | None = None) -> Graph:
    """Apply the optimisation passes to a copy of ``graph`` (the loaded graph is left as it was)."""
    result = graph.copy()
    for graph_pass in OPTIMIZATION_PASSES if passes is None else passes:
        result = graph_pass(result)
    return result
