"""The memory plan: every activation of a bound plan gets an offset in one arena, laid out by liveness.

Made once per plan with concrete shapes (``InferenceSession.plan_for`` binds the batch), it decides:

* which values live in the arena: the outputs of kernels that declared ``writes_out`` (they are handed
  a view to write into), except the values returned to the caller, which are allocated per run so that
  a later run cannot overwrite them;
* aliasing: a kernel without ``writes_out`` (Reshape, Flatten, Slice ... and any other device's kernels)
  may return views of its inputs, so its outputs keep their inputs' buffers alive; a returned value
  that may alias the arena is copied out at the end of a run (``copy_out``);
* **Concat without copies**: an input of a Concat whose producer writes into ``out`` is placed in its
  slice of the Concat's buffer (a strided view when the batch is > 1 or the axis is not the first
  non-batch one), so the Concat finds its inputs already in place and copies nothing; a Concat that is
  itself the input of a Concat along the same axis nests (DenseNet's chain of growing Concats shares
  the last one's buffer);
* **in place**: a kernel that declared ``inplace`` (the residual Add/Sum, activations, a Conv into its
  folded residual) writes into an input buffer whose last reader it is;
* workspace: each kernel's scratch (``Kernel.workspace``: im2col columns, Winograd tiles, padding) is a
  buffer alive during its step only;
* offsets: greedy by size with best fit (TFLite's arena planner): buffers in decreasing size, each at
  the smallest gap between the already placed buffers it conflicts with, or after them all; offsets
  aligned to 64 bytes.

Two notions of "conflict": ``"sequential"`` (steps run in plan order: two buffers conflict when their
step intervals overlap) and ``"parallel"`` (steps run in any order the data dependencies allow: a
buffer may reuse another's memory only when every access of the first happens before the second is
first written, by the dependency graph).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.devices.host_memory import CACHE_LINE, PAGE, aligned_empty
from hetflow.graph.shapes import is_static
from hetflow.ops.base import TensorInfo, planned_infos
from hetflow.runtime.plan import Plan

#: Byte alignment of every buffer in the arena (a cache line; also AVX-512's vector width).
ALIGNMENT = CACHE_LINE

Order = Literal["sequential", "parallel"]


@dataclass(frozen=True)
class Region:
    """A block of the arena: ``nbytes`` from ``offset``."""

    offset: int
    nbytes: int


@dataclass(frozen=True)
class Placement:
    """Where one value lives in the arena.

    Attributes:
        offset: byte offset of the buffer holding the value (its own, or its Concat's).
        shape: shape of the array at that offset.
        dtype: its element type.
        part: ``(axis, start, stop)`` when the value is that slice of the array (a Concat input).
    """

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype
    part: tuple[int, int, int] | None = None

    def view(self, arena: np.ndarray) -> np.ndarray:
        """The value's array inside ``arena`` (a 1-D uint8 array)."""
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        array = arena[self.offset : self.offset + nbytes].view(self.dtype).reshape(self.shape)
        if self.part is not None:
            axis, start, stop = self.part
            array = array[(slice(None),) * axis + (slice(start, stop),)]
        return array

    def byte_ranges(self) -> list[Region]:
        """The arena bytes the value occupies: one region, or a Concat part's one per outer index."""
        itemsize = self.dtype.itemsize
        if self.part is None:
            return [Region(self.offset, int(np.prod(self.shape, dtype=np.int64)) * itemsize)]
        axis, start, stop = self.part
        outer = int(np.prod(self.shape[:axis], dtype=np.int64))
        inner = int(np.prod(self.shape[axis + 1 :], dtype=np.int64)) * itemsize
        row = self.shape[axis] * inner
        return [Region(self.offset + index * row + start * inner, (stop - start) * inner) for index in range(outer)]


@dataclass
class MemoryPlan:
    """The arena layout of one plan.

    Attributes:
        arena_bytes: size of the arena (activations and workspace, as laid out).
        naive_bytes: every activation buffer and workspace side by side (no reuse).
        activation_bytes: the arena laid out without any workspace.
        workspace_bytes: the largest single step's workspace.
        placements: value name -> where it lives (arena-backed values only).
        workspaces: step index -> its scratch region.
        copy_out: values returned to the caller that may alias the arena (copied after a run).
        inplace: value -> the input whose buffer it overwrote.
        concat_parts: value -> the Concat output it is written into.
        order: the execution order the plan is valid for.
    """

    arena_bytes: int
    naive_bytes: int
    activation_bytes: int
    workspace_bytes: int
    placements: dict[str, Placement] = field(default_factory=dict)
    workspaces: dict[int, Region] = field(default_factory=dict)
    copy_out: frozenset[str] = frozenset()
    inplace: dict[str, str] = field(default_factory=dict)
    concat_parts: dict[str, str] = field(default_factory=dict)
    order: Order = "sequential"

    def placed_inputs(self, inputs: Sequence[str], outputs: Sequence[str]) -> list[bool]:
        """Per input of a step with these ``outputs``: whether the plan placed it inside one of them
        (a Concat's part, which the step then does not copy)."""
        return [self.concat_parts.get(name) in outputs for name in inputs]

    def new_arena(self) -> np.ndarray:
        """A fresh arena for this plan (one per concurrently running call), starting on a page.

        Why: the buffers' ``ALIGNMENT`` is an offset from the arena's start, and numpy starts an array
        on any 16 bytes: sessions of the mentee at batch 1 made in one process had their arenas 0, 16,
        32 or 48 bytes past a cache line and ran 0.262-0.291 ms, each at its own speed for minutes."""
        return aligned_empty((self.arena_bytes,), np.uint8, PAGE)

    def views(self, arena: np.ndarray) -> dict[str, np.ndarray]:
        """Value name -> its array inside ``arena``."""
        return {name: placement.view(arena) for name, placement in self.placements.items()}

    def workspace(self, arena: np.ndarray, step: int) -> np.ndarray | None:
        """Step ``step``'s scratch inside ``arena`` (None when it has none)."""
        region = self.workspaces.get(step)
        if region is None:
            return None
        return arena[region.offset : region.offset + region.nbytes]


@dataclass(frozen=True)
class MemoryReport:
    """What a session needs in memory at one batch size (``hetflow info --memory``).

    Attributes:
        batch: the batch size (None for a model without a symbolic batch).
        weights_bytes: initializers (weights and constants).
        arena_bytes: the planned arena: activations and workspace, laid out by liveness.
        activation_bytes: the activations alone, laid out by liveness (the planned activation peak).
        workspace_bytes: the largest single step's workspace (im2col columns, Winograd tiles).
        naive_bytes: every activation and workspace side by side, as without a plan.
        transformed_bytes: weights rearranged for their kernels (Winograd's transformed, the direct
            kernel's blocked, the GEMMs' packed ones), kept after the first run.
        mapped_bytes: of ``weights_bytes``, those mapped from a file and not held in memory: weights a
            budget streams, and large fully connected ones held only packed (``runtime.held_weights``).
    """

    batch: int | None
    weights_bytes: int
    arena_bytes: int
    activation_bytes: int
    workspace_bytes: int
    naive_bytes: int
    transformed_bytes: int = 0
    mapped_bytes: int = 0


@dataclass
class _Buffer:
    """A block to place: its size and the steps that write it and that touch it at all."""

    nbytes: int
    writes: set[int]
    accesses: set[int]
    workspace: bool = False
    offset: int = -1


def aligned(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-nbytes // alignment) * alignment


def plan_memory(plan: Plan, pinned: Collection[str] | None = None, *, order: Order = "sequential") -> MemoryPlan:
    """Lay out the activations and workspaces of ``plan`` in one arena.

    Args:
        plan: a plan; only values with concrete shapes get arena memory (bind the batch first).
        pinned: values returned to the caller (default: the graph outputs); never placed in the arena.
        order: ``"sequential"`` (steps run in plan order) or ``"parallel"`` (any order the data
            dependencies allow: the executor's parallel mode).
    """
    return _Planner(plan, pinned, order).run()


class _Planner:
    def __init__(self, plan: Plan, pinned: Collection[str] | None, order: Order):
        self.plan = plan
        self.graph = plan.graph
        self.order = order
        outputs = self.graph.outputs if pinned is None else pinned
        self.pinned = {*outputs, *self.graph.initializers, *self.graph.inputs, ""}
        self.outputs = set(outputs)
        self.buffers: list[_Buffer] = []
        self.parent: list[int] = []  # union-find over buffers (in-place merges)
        self.home: dict[str, tuple[int, tuple[int, int, int] | None]] = {}
        self.inplace: dict[str, str] = {}
        self.parts: dict[str, tuple[str, tuple[int, int, int]]] = {}  # value -> (Concat output, slice)
        self.concats: set[str] = set()  # Concat outputs holding parts
        self.concat_axes: dict[str, int] = {}  # Concat output holding parts -> its axis
        self.descendants = _descendants(plan) if order == "parallel" else []

    # -- the whole pass ----------------------------------------------------------------------------
    def run(self) -> MemoryPlan:
        owned = self._owned()
        self._place_concat_inputs(owned)
        for name, step in owned.items():
            if name not in self.parts:
                self.home[name] = (self._new_buffer(self._nbytes(name), step), None)
        for name in self.parts:
            root, part = self._outermost(name)
            buffer = self.home[root][0]
            self.home[name] = (buffer, part)
            self.buffers[buffer].writes.add(owned[name])
            self.buffers[buffer].accesses.add(owned[name])
        roots = self._record_accesses()
        self._merge_inplace(roots)
        activations = [self.buffers[b] for b in range(len(self.buffers)) if self._find(b) == b]
        workspaces = self._workspaces()
        activation_bytes = _layout(activations, self._conflict)
        arena_bytes = _layout(activations + list(workspaces.values()), self._conflict)
        placements = {}
        for name, (buffer, part) in self.home.items():
            value = self.graph.values[name]
            offset = self.buffers[self._find(buffer)].offset
            if part is None:
                placements[name] = Placement(offset, _shape(value.shape), value.dtype)
            else:
                concat = self.graph.values[self._outermost(name)[0]]
                placements[name] = Placement(offset, _shape(concat.shape), value.dtype, part)
        return MemoryPlan(
            arena_bytes=arena_bytes,
            # Without a plan every value (Concat parts and in-place results too) has its own buffer.
            naive_bytes=sum(aligned(self._nbytes(n)) for n in self.home) + sum(b.nbytes for b in workspaces.values()),
            activation_bytes=activation_bytes,
            workspace_bytes=max((b.nbytes for b in workspaces.values()), default=0),
            placements=placements,
            workspaces={step: Region(b.offset, b.nbytes) for step, b in workspaces.items()},
            copy_out=frozenset(name for name in self.outputs if roots.get(name)),
            inplace=dict(self.inplace),
            concat_parts={name: concat for name, (concat, _) in self.parts.items()},
            order=self.order,
        )

    # -- which values get arena memory -----------------------------------------------------------
    def _owned(self) -> dict[str, int]:
        """Value -> producing step, for the outputs of ``writes_out`` kernels with concrete shapes."""
        owned: dict[str, int] = {}
        for index, step in enumerate(self.plan.steps):
            if not step.kernel.writes_out:
                continue
            for name in step.node.present_outputs():
                if name not in self.pinned and self._nbytes(name) > 0:
                    owned[name] = index
        return owned

    def _nbytes(self, name: str) -> int:
        value = self.graph.values.get(name)
        if value is None or value.shape is None or not is_static(value.shape) or value.dtype == object:
            return 0
        return int(np.prod(value.shape, dtype=np.int64)) * value.dtype.itemsize

    def _static_dim(self, name: str, axis: int) -> int | None:
        value = self.graph.values.get(name) if name else None
        if value is None or value.shape is None or len(value.shape) <= axis:
            return None
        dim = value.shape[axis]
        return dim if isinstance(dim, int) else None

    def _new_buffer(self, nbytes: int, step: int, workspace: bool = False) -> int:
        self.buffers.append(_Buffer(aligned(nbytes), {step}, {step}, workspace))
        self.parent.append(len(self.parent))
        return len(self.buffers) - 1

    def _find(self, buffer: int) -> int:
        while self.parent[buffer] != buffer:
            self.parent[buffer] = self.parent[self.parent[buffer]]
            buffer = self.parent[buffer]
        return buffer

    # -- Concat without copies -------------------------------------------------------------------
    def _place_concat_inputs(self, owned: dict[str, int]) -> None:
        """Put each eligible Concat input in its slice of the Concat's output buffer."""
        for step in self.plan.steps:
            node = step.node
            if node.op_type != "Concat" or not step.kernel.writes_out or node.outputs[0] not in owned:
                continue
            out = self.graph.values[node.outputs[0]]
            axis = node.attrs.axis % len(out.shape)
            sizes = [self._static_dim(name, axis) for name in node.inputs]
            if any(size is None for size in sizes):
                continue
            start = 0
            for name, size in zip(node.inputs, sizes):
                assert size is not None
                # NOTE: a value read twice by the same Concat can only sit in one of its slices. A Concat
                # output that holds parts of its own nests (DenseNet's growing Concats then share the
                # last one's buffer) when it joins along the same axis, so its parts' slices compose.
                if (
                    name in owned
                    and name not in self.parts
                    and (name not in self.concats or self.concat_axes[name] == axis)
                    and node.inputs.count(name) == 1
                    and self.graph.values[name].dtype == out.dtype
                ):
                    self.parts[name] = (node.outputs[0], (axis, start, start + size))
                    self.concats.add(node.outputs[0])
                    self.concat_axes[node.outputs[0]] = axis
                start += size

    def _outermost(self, name: str) -> tuple[str, tuple[int, int, int]]:
        """The outermost Concat output whose buffer holds part ``name``, and ``name``'s slice of it."""
        concat, (axis, start, stop) = self.parts[name]
        while concat in self.parts:  # a nested Concat: shift the slice by the Concat's own offset
            concat, (_, offset, _) = self.parts[concat]
            start, stop = start + offset, stop + offset
        return concat, (axis, start, stop)

    # -- lifetimes ---------------------------------------------------------------------------------
    def _record_accesses(self) -> dict[str, set[int]]:
        """Add every reading step to the buffers its inputs may alias; return value -> buffers."""
        roots: dict[str, set[int]] = {name: {buffer} for name, (buffer, _) in self.home.items()}
        for index, step in enumerate(self.plan.steps):
            read: set[int] = set()
            for name in step.node.present_inputs():
                read |= roots.get(name, set())
            for buffer in read:
                self.buffers[buffer].accesses.add(index)
            if not step.kernel.writes_out:
                # NOTE: its outputs may be views of its inputs: they keep those buffers alive.
                for name in step.node.present_outputs():
                    if read:
                        roots[name] = set(read)
        return roots

    def _merge_inplace(self, roots: dict[str, set[int]]) -> None:
        """Let ``inplace`` kernels write into an input buffer whose last access they are."""
        for index, step in enumerate(self.plan.steps):
            node = step.node
            if not step.kernel.inplace or not node.outputs or node.outputs[0] not in self.home:
                continue
            output = node.outputs[0]
            own, part = self.home[output]
            if part is not None:
                continue
            name = self._overwritable_input(index, step.kernel, roots)
            if name is not None:
                self._merge(self._find(own), self._find(self.home[name][0]))
                self.inplace[output] = name

    def _overwritable_input(self, index: int, kernel: Kernel, roots: dict[str, set[int]]) -> str | None:
        """The input of step ``index`` whose buffer its output may take: one the kernel may overwrite, of the
        output's shape and dtype, a whole buffer, dying at this step, and shared by no input the kernel may
        not overwrite (a Conv reads all of X for each output: X cannot be its residual's memory)."""
        node = self.plan.steps[index].node
        value = self.graph.values[node.outputs[0]]
        own = self._find(self.home[node.outputs[0]][0])
        eligible = set(kernel.inplace_inputs(node, planned_infos(node, self.graph.values)))
        kept = {self._find(b) for i, name in enumerate(node.inputs) if i not in eligible for b in roots.get(name, ())}
        for position in sorted(eligible):
            name = node.inputs[position] if position < len(node.inputs) else ""
            home = self.home.get(name)
            if home is None or home[1] is not None:
                continue
            candidate = self.graph.values[name]
            if candidate.shape != value.shape or candidate.dtype != value.dtype:
                continue
            buffer = self._find(home[0])
            if buffer == own or buffer in kept or not self._last_access(buffer, index):
                continue
            return name
        return None

    def _last_access(self, buffer: int, step: int) -> bool:
        """Whether ``step`` touches ``buffer`` after every other access in any valid order."""
        others = self.buffers[buffer].accesses - {step}
        if self.order == "sequential":
            return all(s < step for s in others)
        return all(self.descendants[s] >> step & 1 for s in others)

    def _merge(self, source: int, target: int) -> None:
        self.parent[source] = target
        self.buffers[target].writes |= self.buffers[source].writes
        self.buffers[target].accesses |= self.buffers[source].accesses

    def _workspaces(self) -> dict[int, _Buffer]:
        found: dict[int, _Buffer] = {}
        for index, step in enumerate(self.plan.steps):
            kernel = step.kernel
            if not kernel.writes_out or kernel.workspace is None:
                continue
            infos = self._input_infos(step.node.inputs)
            if infos is None:
                continue
            nbytes = kernel.workspace(step.node, infos)
            if nbytes > 0:
                found[index] = _Buffer(aligned(nbytes), {index}, {index}, workspace=True)
        return found

    def _input_infos(self, names: Sequence[str]) -> list[TensorInfo | None] | None:
        infos: list[TensorInfo | None] = []
        for name in names:
            value = self.graph.values.get(name) if name else None
            if name and (value is None or value.shape is None or not is_static(value.shape)):
                return None
            infos.append(None if value is None else TensorInfo(_shape(value.shape), value.dtype))
        return infos

    # -- conflicts ---------------------------------------------------------------------------------
    def _conflict(self, a: _Buffer, b: _Buffer) -> bool:
        if self.order == "sequential":
            return min(a.accesses) <= max(b.accesses) and min(b.accesses) <= max(a.accesses)
        return not (self._before(a, b) or self._before(b, a))

    def _before(self, a: _Buffer, b: _Buffer) -> bool:
        """Whether every access of ``a`` happens before every write of ``b`` (dependency order)."""
        writes = sum(1 << step for step in b.writes)
        return all(self.descendants[s] & writes == writes for s in a.accesses)


def _layout(buffers: Sequence[_Buffer], conflict: object) -> int:
    """Greedy by size, best fit: set each buffer's offset; return the arena size."""
    placed: list[_Buffer] = []
    end = 0
    for buffer in sorted(buffers, key=lambda b: -b.nbytes):
        best, best_gap, cursor = -1, None, 0
        for other in sorted((p for p in placed if conflict(buffer, p)), key=lambda p: p.offset):  # type: ignore[operator]
            gap = other.offset - cursor
            if gap >= buffer.nbytes and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, other.offset + other.nbytes)
        buffer.offset = best if best >= 0 else cursor
        placed.append(buffer)
        end = max(end, buffer.offset + buffer.nbytes)
    return end


def _descendants(plan: Plan) -> list[int]:
    """Per step, a bit set of the steps that (transitively) depend on its outputs."""
    producer: dict[str, int] = {}
    consumers: list[set[int]] = [set() for _ in plan.steps]
    for index, step in enumerate(plan.steps):
        for name in step.node.present_inputs():
            if name in producer:
                consumers[producer[name]].add(index)
        for name in step.node.present_outputs():
            producer[name] = index
    descendants = [0] * len(plan.steps)
    for index in reversed(range(len(plan.steps))):
        bits = 0
        for consumer in consumers[index]:
            bits |= (1 << consumer) | descendants[consumer]
        descendants[index] = bits
    return descendants


def _shape(shape: object) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)  # type: ignore[attr-defined]
