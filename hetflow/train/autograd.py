"""Reverse-mode differentiation over a Graph: a forward pass that keeps what the ops' backward rules
read, then the rules in reverse topological order.

The tape never derives a gradient itself: it asks each node's ``OpDef.backward`` (``hetflow.ops``),
passing which inputs need one, so frozen weights and inputs that lead to no parameter cost nothing.
Forward values are computed by the CPU device's kernels, the same ones inference runs.

Memory: activations are kept only while some backward rule still needs them (liveness over the
reverse order), and the peak of kept bytes is recorded per step (``Tape.peak_bytes``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.devices.cpu.table import CPU_KERNELS
from hetflow.errors import HetflowError
from hetflow.graph import Graph
from hetflow.ops import registry


class TrainingError(HetflowError):
    """The graph cannot be trained as asked (an op without a backward rule, a missing kernel...)."""


@dataclass
class ForwardPass:
    """The values of one forward pass, as the backward pass needs them.

    Attributes:
        values: value name -> array (feeds, initializers and kept activations).
        release_after: node index -> value names no backward rule reads after that node's.
        live_bytes: bytes of activations held when the forward pass ended.
    """

    values: dict[str, np.ndarray]
    release_after: dict[int, list[str]] = field(default_factory=dict)
    live_bytes: int = 0


class Tape:
    """Differentiates ``graph``'s outputs with respect to the initializers named in ``parameters``.

    Args:
        graph: a shape-inferred Graph (training form: see ``hetflow.train.graph``).
        parameters: initializer names to compute gradients for (the trainable ones).

    Raises:
        TrainingError: a node on the gradient path has no backward rule or no CPU kernel; every such
            node is listed.
    """

    def __init__(self, graph: Graph, parameters: Iterable[str]):
        self.graph = graph
        self.parameters = set(parameters)
        self._kernels: list[Kernel] = []
        missing_kernels: list[str] = []
        for node in graph.nodes:
            kernel = CPU_KERNELS.lookup(node)
            if kernel is None:
                missing_kernels.append(f"'{node.name}' ({node.op_type})")
            else:
                self._kernels.append(kernel)
        if missing_kernels:
            raise TrainingError(f"no CPU kernel for node(s) {', '.join(missing_kernels)}")
        self._wanted = self._plan_gradients()
        self.peak_bytes = 0

    # -- planning ------------------------------------------------------------------------------
    def _plan_gradients(self) -> dict[int, list[bool]]:
        """Per node on the gradient path, which inputs need a gradient (a parameter lies behind them)."""
        requires: set[str] = set(self.parameters)
        wanted: dict[int, list[bool]] = {}
        missing: list[str] = []
        for index, node in enumerate(self.graph.nodes):
            opdef = registry.get(node.op_type, node.domain)
            differentiable = set(opdef.differentiable_inputs(node))
            mask = [bool(name) and name in requires and i in differentiable for i, name in enumerate(node.inputs)]
            if not any(mask):
                continue
            if not opdef.has_backward:
                missing.append(f"'{node.name}' ({node.op_type})")
                continue
            wanted[index] = mask
            requires.update(node.present_outputs())
        if missing:
            raise TrainingError(
                f"no backward rule for node(s) {', '.join(missing)}; freeze the parameters before them "
                "or train a model without these ops"
            )
        return wanted

    def kept_values(self) -> set[str]:
        """Names of the values the backward pass reads (inputs and outputs of nodes on the path)."""
        kept: set[str] = set()
        for index in self._wanted:
            node = self.graph.nodes[index]
            kept.update(node.present_inputs())
            kept.update(node.present_outputs())
        return kept

    # -- passes --------------------------------------------------------------------------------
    def forward(self, feeds: Mapping[str, np.ndarray], outputs: Iterable[str] = ()) -> ForwardPass:
        """Run every node; keep what the backward pass reads plus ``outputs`` (and the graph outputs)."""
        values: dict[str, np.ndarray] = dict(self.graph.initializers)
        values.update(feeds)
        keep = self.kept_values() | set(outputs) | set(self.graph.outputs)
        last_read = self._last_forward_reads()
        live = 0
        peak = 0
        for index, (node, kernel) in enumerate(zip(self.graph.nodes, self._kernels)):
            arguments = [values[name] if name else None for name in node.inputs]
            results = kernel.fn(node, arguments)
            for name, array in zip(node.outputs, results):
                if name and array is not None:
                    values[name] = array
                    live += array.nbytes
            peak = max(peak, live)
            # Activations neither the backward pass nor a later node reads are dropped at once.
            for name in last_read.get(index, ()):
                if name not in keep and name in values and name not in self.graph.initializers:
                    live -= values.pop(name).nbytes
        self.peak_bytes = peak
        requested = set(outputs) | set(self.graph.outputs)
        release = {index: [name for name in names if name not in requested]
                   for index, names in self._release_plan().items()}
        return ForwardPass(values, release, live)

    def _last_forward_reads(self) -> dict[int, list[str]]:
        last: dict[str, int] = {}
        for index, node in enumerate(self.graph.nodes):
            for name in node.present_inputs():
                last[name] = index
            for name in node.present_outputs():
                last.setdefault(name, index)
        plan: dict[int, list[str]] = {}
        for name, index in last.items():
            plan.setdefault(index, []).append(name)
        return plan

    def _release_plan(self) -> dict[int, list[str]]:
        """Node index -> values whose last backward reader is that node (reverse order: the earliest)."""
        first_reader: dict[str, int] = {}
        for index in self._wanted:  # ascending: the first index seen is the earliest node
            node = self.graph.nodes[index]
            for name in (*node.present_inputs(), *node.present_outputs()):
                first_reader.setdefault(name, index)
        plan: dict[int, list[str]] = {}
        for name, index in first_reader.items():
            if name not in self.graph.initializers:
                plan.setdefault(index, []).append(name)
        return plan

    def backward(self, forward: ForwardPass, seeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Gradients of the parameters from the gradients ``seeds`` of some values (the loss's inputs).

        Activations are released as soon as the last rule reading them has run.
        """
        values = forward.values
        grads: dict[str, np.ndarray] = {name: np.asarray(g) for name, g in seeds.items()}
        live = forward.live_bytes + sum(g.nbytes for g in grads.values())
        peak = max(self.peak_bytes, live)
        for index in sorted(self._wanted, reverse=True):
            node = self.graph.nodes[index]
            grad_outputs = [grads.pop(name, None) if name else None for name in node.outputs]
            if any(g is not None for g in grad_outputs):
                opdef = registry.get(node.op_type, node.domain)
                inputs = [values.get(name) if name else None for name in node.inputs]
                outputs = [values.get(name) if name else None for name in node.outputs]
                input_grads = opdef.backward(node, inputs, outputs, grad_outputs, self._wanted[index])
                for name, grad, want in zip(node.inputs, input_grads, self._wanted[index]):
                    if not want or grad is None:
                        continue
                    if name in grads:
                        grads[name] = grads[name] + grad
                    else:
                        grads[name] = grad
                        live += grad.nbytes
                peak = max(peak, live)
            live -= sum(g.nbytes for g in grad_outputs if g is not None)
            for name in forward.release_after.get(index, ()):
                array = values.pop(name, None)
                if array is not None:
                    live -= array.nbytes
        self.peak_bytes = peak
        return {name: grads[name] for name in self.parameters if name in grads}
