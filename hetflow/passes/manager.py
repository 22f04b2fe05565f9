"""The ordered list of optimisation passes a session applies to a loaded graph."""

from __future__ import annotations

from collections.abc import Callable

from hetflow.graph import Graph
from hetflow.passes.drop_unread_outputs import drop_unread_outputs
from hetflow.passes.eliminate_noops import eliminate_noops
from hetflow.passes.fold_batchnorm import fold_batchnorm
from hetflow.passes.fold_channel_shuffle import fold_channel_shuffle
from hetflow.passes.fuse_activation import fuse_activation
from hetflow.passes.fuse_residual import fuse_residual
from hetflow.passes.infer_shapes import infer_shapes
from hetflow.passes.split_conv_groups import split_conv_groups

Pass = Callable[[Graph], Graph]

#: Applied in order by ``optimize``; each is a ``Graph -> Graph`` function with its own tests.
#: No-ops go first so that a Dropout between a Conv and its BatchNormalization does not block the
#: fold, and BatchNormalization folds before activations fuse (a fused activation ends the chain).
#: Grouped Convs split once their activation is fused (each part keeps it) and a residual is folded (a
#: Conv with one is left whole). Unread optional outputs go last, once no rewrite can add a reader.
OPTIMIZATION_PASSES: list[Pass] = [
    eliminate_noops, fold_batchnorm, fuse_activation, fold_channel_shuffle, fuse_residual, split_conv_groups,
    drop_unread_outputs,
]


#: Passes that fold nodes into hetflow-internal attributes only the CPU device's kernels implement (a
#: channel shuffle read in place, a residual added in the Conv's epilogue), or that rewrite for the CPU's
#: kernels (grouped Convs split for its one-group algorithms): a session with any other device skips
#: them, so that every node stays runnable there as the model gave it.
CPU_ONLY_PASSES: tuple[Pass, ...] = (fold_channel_shuffle, fuse_residual, split_conv_groups)


def optimize(graph: Graph, passes: list[Pass] | None = None, *, cpu_only: bool = True) -> Graph:
    """Apply the optimisation passes to a copy of ``graph`` (the loaded graph is left as it was); without
    ``cpu_only`` (the graph may run on another device) the ``CPU_ONLY_PASSES`` are skipped.

    The result is validated and its shapes re-inferred, so a faulty rewrite fails here, at session
    creation, naming the node, rather than inside a run.
    """
    result = graph.copy()
    chosen = OPTIMIZATION_PASSES if passes is None else passes
    for graph_pass in chosen:
        if not cpu_only and graph_pass in CPU_ONLY_PASSES:
            continue
        result = graph_pass(result)
    result.validate()
    return infer_shapes(result)
