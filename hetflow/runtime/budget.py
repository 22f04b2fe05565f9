"""Weight residency under a memory budget (CNNdroid's ``allocated_ram``).

A session with ``memory_budget`` promises that what it holds — resident weights, the activation arena
(workspace included), Winograd's transformed, the direct kernel's blocked and the lane GEMM's packed
weights — plus the weights of the one layer being streamed never exceed the budget. ``fit_plan`` makes
a bound plan fit, degrading speed step by step:

1. nothing to do when everything fits;
2. Winograd and direct layers go back to im2col (Winograd's transformed weights are 1.8-4x the raw 3x3
   weights and its tile buffers are larger than im2col's columns; the direct kernel keeps a blocked
   copy of its weights), and no Conv keeps a packed copy for the lane GEMM (``ConvAttrs.packed_weights``)
   nor a fully connected layer one for the dense kernel (``GemmAttrs.packed_weights``) nor an LSTM one
   of W and R for one column's steps (``LSTMAttrs.packed_weights``);
3. weights are streamed: written once to a raw scratch file under the hetflow home, they are mapped
   (``np.memmap``) when their layer runs and unmapped after it, so they do not stay resident. As many
   as fit stay resident, the largest first (CNNdroid's order);
4. when even streaming every weight leaves the arena plus the largest layer's weights over the budget,
   ``BudgetError`` says by how much.
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hetflow.devices.cpu.kernels.dense import panel_bytes
from hetflow.devices.cpu.kernels.direct import blocked_weight_bytes
from hetflow.devices.cpu.kernels.own_gemm import lane_weight_bytes
from hetflow.devices.cpu.kernels.rnn import gate_panel_bytes
from hetflow.devices.cpu.kernels.winograd import transformed_weight_bytes as winograd_weight_bytes
from hetflow.errors import BudgetError
from hetflow.ops.base import planned_infos
from hetflow.ops.conv import DIRECT_FMA, IM2COL, POINTWISE, WINOGRAD_TILE
from hetflow.options import home_dir
from hetflow.runtime.memory import plan_memory
from hetflow.runtime.plan import Plan, Step, StreamedWeight

#: Streamed weights start at multiples of this in the scratch file (a page: cheap, aligned mappings).
PAGE = 4096
#: What a run allocates besides its outputs: per-step argument lists, views into the arena, small
#: per-channel temporaries (measured at about 60 KiB on the zoo models; reserved with room to spare).
RUN_RESERVE_BYTES = 256 * 1024


def format_bytes(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


@dataclass(frozen=True)
class Residency:
    """How a plan fits its budget.

    Attributes:
        budget: the promise, in bytes.
        resident_bytes: weights kept in memory.
        streamed_bytes: weights read from the scratch file when their layer runs.
        stream_peak_bytes: the most streamed weight bytes one step maps at once.
        arena_bytes: activations and workspace.
        run_bytes: what each run allocates: the returned outputs and ``RUN_RESERVE_BYTES``.
        transformed_bytes: Winograd's transformed and the direct kernel's blocked weights (kept across runs).
        winograd_off: whether the Winograd and direct layers were switched to im2col to fit.
    """

    budget: int
    resident_bytes: int
    streamed_bytes: int
    stream_peak_bytes: int
    arena_bytes: int
    run_bytes: int
    transformed_bytes: int
    winograd_off: bool

    @property
    def planned_bytes(self) -> int:
        """The most the session holds at any point of a run."""
        held = self.resident_bytes + self.arena_bytes + self.transformed_bytes
        return held + self.run_bytes + self.stream_peak_bytes


class WeightStore:
    """The raw scratch file streamed weights are mapped from; written once, deleted with the store."""

    _counter = itertools.count()

    def __init__(self, directory: os.PathLike[str] | str | None = None):
        root = home_dir() / "weights" if directory is None else directory
        os.makedirs(root, exist_ok=True)
        self.path = os.path.join(root, f"{os.getpid()}-{next(self._counter)}-{uuid.uuid4().hex[:8]}.bin")
        self.entries: dict[str, StreamedWeight] = {}
        self._size = 0
        self._lock = threading.Lock()
        weakref.finalize(self, _remove, self.path)

    def add(self, name: str, array: np.ndarray) -> StreamedWeight:
        """Write ``array`` (once per name) and return where it lies."""
        with self._lock:
            found = self.entries.get(name)
            if found is not None:
                return found
            offset = -(-self._size // PAGE) * PAGE
            contiguous = np.ascontiguousarray(array)
            with open(self.path, "ab") as file:
                file.write(b"\0" * (offset - self._size))
                file.write(contiguous.tobytes())
            self._size = offset + contiguous.nbytes
            entry = StreamedWeight(self.path, offset, tuple(array.shape), array.dtype)
            self.entries[name] = entry
            return entry


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def transformed_weight_bytes(plan: Plan) -> int:
    """Bytes of the rearranged weights the plan's Conv layers keep: Winograd's transformed ones,
    ``(m+2)^2 * K * C`` each, the direct kernel's blocked ones (``direct.blocked_weight_bytes``), and the
    packed copies of the lane GEMM, of the CPU's dense kernel (``dense.panel_bytes``) and of one column's
    LSTM steps (``rnn.gate_panel_bytes``)."""
    total = 0
    for step in plan.steps:
        if step.node.op_type == "Gemm" and step.device.id == "cpu":
            total += panel_bytes(step.node, planned_infos(step.node, plan.graph.values, plan.graph.initializers))
            continue
        if step.node.op_type == "LSTM" and step.device.id == "cpu":
            infos = planned_infos(step.node, plan.graph.values, plan.graph.initializers)
            total += gate_panel_bytes(step.node, infos) if infos is not None else 0
            continue
        if step.node.op_type != "Conv":
            continue
        x, w = plan.graph.values[step.node.inputs[0]], plan.graph.values[step.node.inputs[1]]
        tile = WINOGRAD_TILE.get(step.kernel.algorithm)
        if tile is not None:
            total += winograd_weight_bytes(w.shape, w.dtype, tile)  # type: ignore[arg-type]
        elif step.kernel.algorithm == DIRECT_FMA:
            total += blocked_weight_bytes(step.node, x.shape, w.shape)  # type: ignore[arg-type]
        elif step.kernel.algorithm in (POINTWISE, IM2COL) and step.node.attrs.packed_weights:
            total += lane_weight_bytes(step.node, x.shape, w.shape)  # type: ignore[arg-type]
    return total


def without_winograd(plan: Plan) -> Plan:
    """``plan`` with every Conv that keeps rearranged weights (Winograd, direct) run by im2col instead
    (no kept copies of weights; Winograd's workspace is also larger), and no Conv or Gemm packing its
    weights for the lane GEMM or the dense kernel, and no LSTM its W and R for one column's steps (its
    node's ``packed_weights`` cleared)."""
    steps: list[Step] = []
    for step in plan.steps:
        keeps_weights = step.kernel.algorithm in WINOGRAD_TILE or step.kernel.algorithm == DIRECT_FMA
        if step.node.op_type in ("Conv", "Gemm", "LSTM"):
            step.node.attrs = replace(step.node.attrs, packed_weights=False)
        if step.node.op_type == "Conv" and keeps_weights:
            im2col = next(k for k in step.device.kernels.kernels["Conv"] if k.algorithm == IM2COL)
            step = Step(step.node, im2col, step.device)
        steps.append(step)
    return replace(plan, steps=steps)


def choose_streamed(
    weights: Mapping[str, int], step_inputs: Iterable[Sequence[str]], fixed_bytes: int, budget: int,
    already: Iterable[str] = (),
) -> frozenset[str]:
    """The weights to stream so that resident + ``fixed_bytes`` + one step's streamed ones fit.

    Starts with everything streamed and keeps weights resident, largest first, while the promise
    holds (CNNdroid's order: the largest layers are the costliest to read again).

    Raises:
        BudgetError: even with every weight streamed, ``fixed_bytes`` plus the largest step's weights
            exceed ``budget``.
    """
    layers = [[name for name in names if name in weights] for names in step_inputs]
    streamed = set(weights)

    def peak() -> int:
        return max((sum(weights[n] for n in set(names) if n in streamed) for names in layers), default=0)

    floor = fixed_bytes + peak()
    if floor > budget:
        raise BudgetError(
            f"the memory budget of {format_bytes(budget)} cannot be met: activations, workspace and outputs need "
            f"{format_bytes(fixed_bytes)} and the largest layer's weights {format_bytes(peak())} even when "
            f"every weight is streamed from disk ({format_bytes(floor)} in all); raise the budget or "
            f"lower the batch size"
        )
    resident = 0
    for name in sorted(set(weights) - set(already), key=lambda n: -weights[n]):
        streamed.discard(name)
        if resident + weights[name] + fixed_bytes + peak() <= budget:
            resident += weights[name]
        else:
            streamed.add(name)
    return frozenset(streamed)


def fit_plan(plan: Plan, budget: int, store: WeightStore, outputs: Sequence[str]) -> tuple[Plan, Residency]:
    """``plan`` made to fit ``budget`` (see the module docstring); weights it streams are written to
    ``store`` and replaced in ``plan.graph`` by mappings of the scratch file.

    Raises:
        BudgetError: it cannot fit even with every weight streamed.
    """
    graph = plan.graph
    weights = {name: int(array.nbytes) for name, array in graph.initializers.items()}
    already = {name for name in weights if name in store.entries}
    run = RUN_RESERVE_BYTES + sum(_nbytes(graph.values.get(name)) for name in outputs)
    arena = plan_memory(plan, outputs).arena_bytes
    transformed = transformed_weight_bytes(plan)
    total = sum(weights.values())
    if not already and total + arena + run + transformed <= budget:
        return plan, Residency(budget, total, 0, 0, arena, run, transformed, False)
    fitted = without_winograd(plan)
    arena = plan_memory(fitted, outputs).arena_bytes
    layers = (s.node.present_inputs() for s in fitted.steps)
    streamed = choose_streamed(weights, layers, arena + run, budget, already)
    entries = {}
    for name in sorted(streamed):
        entries[name] = store.add(name, graph.initializers[name])
        graph.initializers[name] = entries[name].map()
    stream_peak = max(
        (sum(weights[n] for n in set(s.node.present_inputs()) if n in streamed) for s in fitted.steps), default=0
    )
    streamed_bytes = sum(weights[n] for n in streamed)
    residency = Residency(budget, total - streamed_bytes, streamed_bytes, stream_peak, arena, run, 0, True)
    return replace(fitted, streamed=entries), residency


def _nbytes(value: object) -> int:
    shape = getattr(value, "shape", None)
    if shape is None or not all(isinstance(d, int) for d in shape):
        return 0
    return int(np.prod(shape, dtype=np.int64)) * value.dtype.itemsize  # type: ignore[attr-defined]
