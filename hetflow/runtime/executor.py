"""Run a Plan: call each step's kernel in order, releasing values after their last reader."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from hetflow.errors import HetflowError
from hetflow.runtime.plan import Plan, Step


@dataclass(frozen=True)
class StepTiming:
    """Wall time of one step, for profiles and op-type time shares."""

    node_name: str
    op_type: str
    device: str
    seconds: float


Observer = Callable[[Step, float], None]


class KernelError(HetflowError):
    """A kernel raised while running a node; names the node and its input shapes."""


def execute(
    plan: Plan,
    feeds: Mapping[str, np.ndarray],
    outputs: list[str] | None = None,
    observer: Observer | None = None,
) -> dict[str, np.ndarray]:
    """Run ``plan`` on ``feeds`` and return the requested outputs (all graph outputs by default).

    Every call keeps its values in a local environment, so one Plan may be executed from several
    threads at once.
    """
    graph = plan.graph
    env: dict[str, np.ndarray] = dict(graph.initializers)
    env.update(feeds)
    wanted = list(graph.outputs) if outputs is None else outputs
    keep = set(wanted)
    for index, step in enumerate(plan.steps):
        node = step.node
        inputs = [env[name] if name else None for name in node.inputs]
        started = time.perf_counter() if observer is not None else 0.0
        try:
            results = step.kernel.fn(node, inputs)
        except HetflowError:
            raise
        except Exception as error:  # noqa: BLE001  (re-raised with the node's context)
            shapes = ", ".join(str(None if x is None else x.shape) for x in inputs)
            raise KernelError(
                f"node '{node.name}' ({node.op_type}) failed on {step.device.id} with input shapes "
                f"({shapes}): {type(error).__name__}: {error}"
            ) from error
        if observer is not None:
            observer(step, time.perf_counter() - started)
        for name, array in zip(node.outputs, results):
            if name:
                env[name] = array
        for name in plan.release_after.get(index, ()):
            if name not in keep:
                env.pop(name, None)
    return {name: env[name] for name in wanted}
