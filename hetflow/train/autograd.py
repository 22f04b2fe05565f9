"""Reverse-mode differentiation over a Graph: a forward pass that keeps what the ops' backward rules
read, then the rules in reverse topological order.

The tape never derives a gradient itself: it asks each node's backward rule, passing which inputs need
one, so frozen weights and inputs that lead to no parameter cost nothing. Where each node runs comes
from ``hetflow.train.device``: the inference planner's placement over the trainer's devices (the CPU
alone by default), forward values by that device's kernels (on the CPU, ``hetflow.train.kernels``'
faster whole-batch Conv), and the gradient by that device's backward rule for the op, else by the op's
numpy rule (``OpDef.backward`` in ``hetflow.ops``).

Memory, planned by liveness like inference: an activation is kept for the backward pass only when a
rule declares it reads it (``OpDef.backward_reads``; the others get zero-memory stand-ins), it is freed
after the last rule that reads it has run, and gradients are freed once passed on. Under a budget,
``plan_recompute`` picks cheap activations (outputs of elementwise and view ops) to drop after the
forward pass and recompute from their inputs when the backward pass reaches them (checkpointing).
``Tape.peak_bytes`` is the measured peak of activations plus gradients of the last step; ``simulate``
predicts it exactly from value sizes and, given each node's scratch (kernel workspace,
``OpDef.backward_workspace``), bounds every byte a step allocates (checked with tracemalloc).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from hetflow.errors import HetflowError, UnsupportedOpsError
from hetflow.graph import Graph, Node
from hetflow.ops import registry
from hetflow.ops.base import shape_only
from hetflow.train.device import BackwardFn, TrainingDevices, cpu_devices
from hetflow.train.kernels import ForwardFn

#: Traits of ops whose outputs are cheap enough to recompute instead of keeping (checkpointing).
CHEAP_TRAITS = frozenset({"elementwise", "view"})


class TrainingError(HetflowError):
    """The graph cannot be trained as asked (an op without a backward rule, a missing kernel...)."""


@dataclass
class ForwardPass:
    """The values of one forward pass, as the backward pass needs them.

    Attributes:
        values: value name -> array (feeds, initializers and kept activations).
        shapes: value name -> (shape, dtype) of every value the pass produced (for stand-ins).
        live_bytes: bytes of activations held when the forward pass ended.
    """

    values: dict[str, np.ndarray]
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = field(default_factory=dict)
    live_bytes: int = 0
    requested: frozenset[str] = frozenset()


@dataclass
class StepMemory:
    """Live bytes of one training step: the peak, and how it splits into kept activations and gradients."""

    peak: int = 0
    activations_at_peak: int = 0
    gradients_at_peak: int = 0
    scratch_at_peak: int = 0
    _activations: int = 0
    _gradients: int = 0

    def add_activations(self, delta: int) -> None:
        self._activations += delta
        self._note(0)

    def add_gradients(self, delta: int) -> None:
        self._gradients += delta
        self._note(0)

    def note_scratch(self, scratch: int) -> None:
        """A kernel's or rule's temporary bytes, live only while that node runs."""
        self._note(scratch)

    def _note(self, scratch: int) -> None:
        if self._activations + self._gradients + scratch > self.peak:
            self.peak = self._activations + self._gradients + scratch
            self.activations_at_peak, self.gradients_at_peak = self._activations, self._gradients
            self.scratch_at_peak = scratch


class Tape:
    """Differentiates ``graph``'s outputs with respect to the initializers named in ``parameters``.

    Args:
        graph: a shape-inferred Graph (training form: see ``hetflow.train.graph``).
        parameters: initializer names to compute gradients for (the trainable ones).
        recompute: activations to drop after the forward pass and recompute in the backward pass
            (see ``plan_recompute``); each must be produced by a node with a CHEAP_TRAITS trait.
        devices: where the nodes run (``hetflow.train.device``); the CPU alone by default.

    Attributes:
        placement: node name -> (device id of its forward kernel, device id of its backward rule:
            ``"cpu"`` where the op's numpy rule runs).
        peak_bytes: activations and gradients held at the last step's peak.

    Raises:
        TrainingError: a node on the gradient path has no backward rule, or a node has no forward
            kernel on any of the devices; every such node is listed.
    """

    def __init__(
        self,
        graph: Graph,
        parameters: Iterable[str],
        recompute: Iterable[str] = (),
        devices: TrainingDevices | None = None,
    ):
        self.graph = graph
        self.parameters = set(parameters)
        self.devices = devices or cpu_devices()
        try:
            placed = self.devices.place(graph)
        except UnsupportedOpsError as error:
            names = ", ".join(f"'{n.name}' ({n.op_type})" for n in error.nodes)
            on = ", ".join(d.id for d in self.devices.devices)
            raise TrainingError(f"no kernel on {on} for node(s) {names}") from None
        self._kernels: list[ForwardFn] = [p.forward for p in placed]
        self._rules: list[BackwardFn | None] = [p.backward for p in placed]
        self.placement = {
            p.node.name: (p.device.id, p.device.id if p.backward is not None else "cpu") for p in placed
        }
        self._producer = {name: i for i, node in enumerate(graph.nodes) for name in node.present_outputs()}
        self._wanted = self._plan_gradients()
        self._reads = {index: self._read_names(graph.nodes[index]) for index in self._wanted}
        # Planned once: every step walks the same graph (only ``recompute`` may change between steps).
        self._kept = frozenset(name for names in self._reads.values() for name in names) - set(
            graph.initializers
        )
        self._last_reads = self._last_forward_reads()
        self.recompute = set(recompute)
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
            mask = [
                bool(name) and name in requires and i in differentiable for i, name in enumerate(node.inputs)
            ]
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

    def _read_names(self, node: Node) -> list[str]:
        read_inputs, read_outputs = registry.get(node.op_type, node.domain).backward_reads(node)
        names = [n for i, n in enumerate(node.inputs) if n and (read_inputs is None or i in read_inputs)]
        names += [n for i, n in enumerate(node.outputs) if n and (read_outputs is None or i in read_outputs)]
        return names

    def kept_values(self) -> set[str]:
        """Activations the backward pass reads (initializers are always at hand and not counted)."""
        return set(self._kept)

    def recompute_candidates(self) -> list[str]:
        """Kept activations a cheap node produces from values that stay available: checkpointing's
        candidates, in graph order."""
        kept = self.kept_values()
        candidates = []
        for name in sorted(kept, key=lambda n: self._producer.get(n, -1)):
            index = self._producer.get(name)
            if index is None:
                continue  # a feed
            node = self.graph.nodes[index]
            opdef = registry.get(node.op_type, node.domain)
            inputs_available = all(
                not i or i in self.graph.initializers or i not in self._producer or i in kept
                for i in node.inputs
            )
            if opdef.traits & CHEAP_TRAITS and inputs_available:
                candidates.append(name)
        return candidates

    # -- passes --------------------------------------------------------------------------------
    def forward(self, feeds: Mapping[str, np.ndarray], outputs: Iterable[str] = ()) -> ForwardPass:
        """Run every node; keep what the backward pass reads plus ``outputs`` (and the graph outputs)."""
        values: dict[str, np.ndarray] = dict(self.graph.initializers)
        values.update(feeds)
        requested = frozenset(outputs) | frozenset(self.graph.outputs)
        keep = (self._kept - self.recompute) | requested
        last_read = self._last_reads
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            name: (array.shape, array.dtype) for name, array in feeds.items()
        }
        live = sum(array.nbytes for name, array in feeds.items() if name in keep)
        peak = live
        for index, (node, kernel) in enumerate(zip(self.graph.nodes, self._kernels)):
            arguments = [values[name] if name else None for name in node.inputs]
            results = kernel(node, arguments)
            for name, array in zip(node.outputs, results):
                if name and array is not None:
                    values[name] = array
                    shapes[name] = (array.shape, array.dtype)
                    live += array.nbytes
            peak = max(peak, live)
            # Activations neither the backward pass nor a later node reads are dropped at once.
            for name in last_read.get(index, ()):
                if name not in keep and name in values and name not in self.graph.initializers:
                    live -= values.pop(name).nbytes
        self.peak_bytes = peak
        return ForwardPass(values, shapes, live, requested)

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

    def _release_plan(self, requested: frozenset[str]) -> dict[int, list[str]]:
        """Node index -> activations whose last backward reader is that node (the earliest reader, since
        the backward pass runs in reverse)."""
        first_reader: dict[str, int] = {}
        for index in sorted(self._reads):
            for name in self._reads[index]:
                first_reader.setdefault(name, index)
        plan: dict[int, list[str]] = {}
        for name, index in first_reader.items():
            if name not in self.graph.initializers and name not in requested:
                plan.setdefault(index, []).append(name)
        return plan

    def _materialise(self, name: str, values: dict[str, np.ndarray]) -> np.ndarray:
        """Recompute a dropped activation from its producer's inputs (checkpointing)."""
        index = self._producer[name]
        node = self.graph.nodes[index]
        arguments = [values[i] if i else None for i in node.inputs]
        results = self._kernels[index](node, arguments)
        return results[node.outputs.index(name)]

    def backward(self, forward: ForwardPass, seeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Gradients of the parameters from the gradients ``seeds`` of some values (the loss's inputs).

        Activations are released as soon as the last rule reading them has run; recomputed ones are
        rebuilt just before the first rule (in reverse order) that reads them.
        """
        values = forward.values
        release = self._release_plan(forward.requested)
        grads: dict[str, np.ndarray] = {name: np.asarray(g) for name, g in seeds.items()}
        live = forward.live_bytes + sum(g.nbytes for g in grads.values())
        peak = max(self.peak_bytes, live)
        for index in sorted(self._wanted, reverse=True):
            node = self.graph.nodes[index]
            for name in self._reads[index]:
                if name not in values:
                    values[name] = self._materialise(name, values)
                    live += values[name].nbytes
            peak = max(peak, live)
            grad_outputs = [grads.pop(name, None) if name else None for name in node.outputs]
            if any(g is not None for g in grad_outputs):
                inputs = [self._given(name, values, forward) for name in node.inputs]
                outputs = [self._given(name, values, forward) for name in node.outputs]
                rule = self._rules[index] or registry.get(node.op_type, node.domain).backward
                input_grads = rule(node, inputs, outputs, grad_outputs, self._wanted[index])
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
            for name in release.get(index, ()):
                array = values.pop(name, None)
                if array is not None:
                    live -= array.nbytes
        self.peak_bytes = peak
        return {name: grads[name] for name in self.parameters if name in grads}

    @staticmethod
    def _given(name: str, values: Mapping[str, np.ndarray], forward: ForwardPass) -> np.ndarray | None:
        if not name:
            return None
        found = values.get(name)
        if found is not None:
            return found
        shape, dtype = forward.shapes[name]
        return shape_only(shape, dtype)

    # -- memory planning -----------------------------------------------------------------------
    def simulate_peak(
        self,
        sizes: Mapping[str, int],
        requested: Iterable[str] = (),
        recompute: Iterable[str] | None = None,
        scratch: Mapping[str, tuple[int, int]] | None = None,
    ) -> int:
        """The peak ``forward`` + ``backward`` would measure, from value sizes in bytes (same rules).

        Gradients are assumed to have their value's size; ``recompute`` defaults to the tape's own.
        ``scratch`` (node name -> forward and backward temporary bytes) adds each node's workspace while
        it runs: the bound a memory budget is checked against.
        """
        return self.simulate(sizes, requested, recompute, scratch).peak

    def simulate(
        self,
        sizes: Mapping[str, int],
        requested: Iterable[str] = (),
        recompute: Iterable[str] | None = None,
        scratch: Mapping[str, tuple[int, int]] | None = None,
    ) -> StepMemory:
        """``simulate_peak`` with the split of the peak into activations and gradients."""
        recomputed = self.recompute if recompute is None else set(recompute)
        requested_set = frozenset(requested) | frozenset(self.graph.outputs)
        keep = (self.kept_values() - recomputed) | requested_set
        present = {name for name in self.graph.inputs if name not in self.graph.initializers}
        usage = StepMemory()
        usage.add_activations(sum(sizes[name] for name in present if name in keep))
        last_read = self._last_forward_reads()
        workspace = scratch or {}
        for index, node in enumerate(self.graph.nodes):
            for name in node.present_outputs():
                present.add(name)
                usage.add_activations(sizes[name])
            usage.note_scratch(workspace.get(node.name, (0, 0))[0])
            for name in last_read.get(index, ()):
                if name not in keep and name in present and name not in self.graph.initializers:
                    present.discard(name)
                    usage.add_activations(-sizes[name])
        release = self._release_plan(requested_set)
        grads: set[str] = set(self.graph.outputs)
        usage.add_gradients(sum(sizes[name] for name in grads))
        for index in sorted(self._wanted, reverse=True):
            node = self.graph.nodes[index]
            for name in self._reads[index]:
                if name not in present and name not in self.graph.initializers:
                    present.add(name)
                    usage.add_activations(sizes[name])
            outgoing = [name for name in node.outputs if name in grads]
            if outgoing:
                for name, want in zip(node.inputs, self._wanted[index]):
                    if want and name not in grads:
                        grads.add(name)
                        usage.add_gradients(sizes[name])
                usage.note_scratch(workspace.get(node.name, (0, 0))[1])
            for name in outgoing:
                grads.discard(name)
                usage.add_gradients(-sizes[name])
            for name in release.get(index, ()):
                if name in present:
                    present.discard(name)
                    usage.add_activations(-sizes[name])
        return usage

    def plan_recompute(
        self,
        sizes: Mapping[str, int],
        budget: int,
        requested: Iterable[str] = (),
        scratch: Mapping[str, tuple[int, int]] | None = None,
    ) -> int:
        """Choose the activations to recompute so that the simulated peak fits ``budget``: the largest
        candidates first, stopping as soon as it fits. Sets ``self.recompute``; returns the peak.

        Raises:
            BudgetError: even recomputing every candidate does not fit.
        """
        from hetflow.errors import BudgetError

        chosen: set[str] = set()
        peak = self.simulate_peak(sizes, requested, chosen, scratch)
        for name in sorted(self.recompute_candidates(), key=lambda n: -sizes[n]):
            if peak <= budget:
                break
            # NOTE: a recomputed value is rebuilt from kept inputs only: never chain two recomputations.
            sources = set(self.graph.nodes[self._producer[name]].present_inputs())
            if sources & chosen or any(name in self.graph.nodes[self._producer[c]].inputs for c in chosen):
                continue
            trial = chosen | {name}
            trial_peak = self.simulate_peak(sizes, requested, trial, scratch)
            if trial_peak < peak:
                chosen, peak = trial, trial_peak
        if peak > budget:
            raise BudgetError(
                f"a training step needs at least {peak} bytes of activations, gradients and scratch "
                f"(recomputing {len(chosen)} cheap activations); the budget leaves {budget}: use a smaller batch"
            )
        self.recompute = chosen
        return peak


def value_sizes(graph: Graph, bytes_of: Mapping[str, tuple[Sequence[int], np.dtype]]) -> dict[str, int]:
    """Bytes of each value from known shapes (e.g. a bound graph's ``values``)."""
    return {
        name: int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        for name, (shape, dtype) in bytes_of.items()
    }
