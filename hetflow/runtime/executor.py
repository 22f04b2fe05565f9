"""Run a Plan: call each step's kernel, releasing values after their last reader.

A Plan is compiled once (per set of requested outputs) into a ``Program``: every value gets a slot in a
list, every step its input, output and release slots, and the initializers sit in a template list that a
run copies (a list copy, not a dict rebuild). The per-node cost of the sequential loop is then a list
comprehension, the kernel call and a few list stores.

Activations live in an arena laid out once per compiled program (``hetflow.runtime.memory``): kernels
that declared ``writes_out`` get views into it, so a steady-state run allocates no large arrays. Every
concurrently running call takes its own arena from a pool (two threads never share one), and the values
returned to the caller never live in an arena (they are allocated per run, or copied out when they may
alias it).

Two execution modes:

- ``"sequential"``: the steps run one after the other on the calling thread. BLAS (and the kernels that
  split their own work) use the run's thread count; ``threads=1`` is CNNdroid's fully sequential mode.
- ``"parallel"``: steps whose inputs are ready may run at the same time on ``threads`` threads (the caller
  and helpers), driven by dependency counts; graphs without independent branches run sequentially.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hetflow.devices.cpu.threads import BLAS, available_cores
from hetflow.errors import HetflowError
from hetflow.graph import Node
from hetflow.runtime.memory import MemoryPlan, Order, plan_memory
from hetflow.runtime.plan import Plan, Step, StreamedWeight

ExecutionMode = Literal["sequential", "parallel"]
EXECUTION_MODES: tuple[str, ...] = ("sequential", "parallel")


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


def check_threads(threads: int | None) -> int:
    """``threads`` validated; None means every core this process may use."""
    if threads is None:
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer or None, not {threads!r}")
    return threads


def check_mode(mode: str) -> ExecutionMode:
    if mode not in EXECUTION_MODES:
        raise ValueError(f"execution_mode must be one of {list(EXECUTION_MODES)}, not {mode!r}")
    return mode  # type: ignore[return-value]


def execute(
    plan: Plan,
    feeds: Mapping[str, np.ndarray],
    outputs: Sequence[str] | None = None,
    observer: Observer | None = None,
    *,
    threads: int | None = None,
    mode: ExecutionMode = "sequential",
) -> dict[str, np.ndarray]:
    """Run ``plan`` on ``feeds`` and return the requested outputs (all graph outputs by default).

    Args:
        threads: BLAS threads during the run (and, in parallel mode, concurrent steps); None: all cores.
        mode: ``"sequential"`` or ``"parallel"`` (see the module docstring).

    Every call keeps its values in a local environment, so one Plan may be executed from several threads
    at once. The plan must not be edited after its first execution (its compiled form is cached).
    """
    wanted = tuple(plan.graph.outputs) if outputs is None else tuple(outputs)
    program = compiled(plan, wanted)
    count = available_cores() if threads is None else threads
    previous = BLAS.hold(count)
    try:
        if observer is not None:
            env = program.run_observed(feeds, observer)
        elif mode == "parallel" and count > 1 and program.branches:
            env = program.run_parallel(feeds, count)
        else:
            env = program.run(feeds)
    finally:
        BLAS.restore(previous)
    return {name: env[slot] for name, slot in zip(wanted, program.output_slots)}


def memory_plan(plan: Plan, outputs: Sequence[str] | None = None, order: Order = "sequential") -> MemoryPlan | None:
    """The arena layout ``execute`` uses for ``plan`` (None when no value has arena memory)."""
    wanted = tuple(plan.graph.outputs) if outputs is None else tuple(outputs)
    return compiled(plan, wanted).memory(order)


# -- compilation ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Op:
    """One step with its value names resolved to slots."""

    step: Step
    fn: Callable[..., Sequence[np.ndarray | None]]  # the kernel, or a wrapper mapping streamed weights
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    release: tuple[int, ...]  # in plan order: slots whose last reader this step is (or unread outputs)
    reads: tuple[int, ...]  # distinct releasable slots it reads (parallel reference counts)
    unread: tuple[int, ...]  # releasable outputs no step reads (parallel: released at once)
    consumers: tuple[int, ...]  # indices of the steps that read any of its outputs


#: Slot 0 always holds None: it stands for omitted optional inputs and outputs.
_NONE = 0


class Program:
    """A Plan compiled for one set of requested outputs; runs it sequentially or in parallel."""

    def __init__(self, plan: Plan, wanted: Sequence[str]):
        graph = plan.graph
        self.slots: dict[str, int] = {"": _NONE}
        for name in [*graph.initializers, *graph.inputs, *wanted]:
            self._slot(name)
        for step in plan.steps:
            for name in (*step.node.inputs, *step.node.outputs):
                self._slot(name)
        self.template: list[np.ndarray | None] = [None] * len(self.slots)
        for name, array in graph.initializers.items():
            # NOTE: streamed weights are mapped by the steps that read them, for the step only.
            self.template[self.slots[name]] = None if name in plan.streamed else array
        self.output_slots = tuple(self.slots[name] for name in wanted)
        pinned = {self.slots[name] for name in (*graph.initializers, *wanted)} | {_NONE}
        self.ops = _compile_steps(plan, self.slots, pinned)
        self.reader_counts = _reader_counts(self.ops, len(self.slots))
        self.waiting = tuple(_producer_counts(self.ops))
        self.roots = tuple(i for i, count in enumerate(self.waiting) if count == 0)
        self.branches = _has_branches(self.ops, self.waiting)
        self._plan = plan
        self._wanted = tuple(wanted)
        self._memory: dict[Order, MemoryPlan | None] = {"sequential": self._plan_memory("sequential")}
        self._arenas: dict[Order, list[_Arena]] = {"sequential": [], "parallel": []}
        self._memory_lock = threading.Lock()

    def _plan_memory(self, order: Order) -> MemoryPlan | None:
        memory = plan_memory(self._plan, self._wanted, order=order)
        return memory if memory.placements or memory.workspaces else None

    def memory(self, order: Order) -> MemoryPlan | None:
        """The arena layout for ``order`` (planned on first use)."""
        if order not in self._memory:
            with self._memory_lock:
                if order not in self._memory:
                    self._memory[order] = self._plan_memory(order)
        return self._memory[order]

    def _acquire(self, order: Order) -> _Arena:
        # NOTE: list.pop and list.append are atomic, so concurrent runs each get their own arena;
        # the pool grows to the number of calls that ever ran at once.
        try:
            return self._arenas[order].pop()
        except IndexError:
            return _Arena(self, self.memory(order))

    def _release(self, order: Order, arena: _Arena) -> None:
        self._arenas[order].append(arena)

    def _slot(self, name: str) -> int:
        return self.slots.setdefault(name, len(self.slots))

    def environment(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
        env = self.template.copy()
        slots = self.slots
        for name, array in feeds.items():
            slot = slots.get(name)
            if slot is not None:
                env[slot] = array
        return env

    # -- sequential ------------------------------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
        env = self.environment(feeds)
        arena = self._acquire("sequential")
        node = None
        try:
            for fn, node, inputs, outputs, release, out, workspace in arena.hot:
                if out is None:
                    results = fn(node, [env[slot] for slot in inputs])
                else:
                    results = fn(node, [env[slot] for slot in inputs], out, workspace)
                for slot, array in zip(outputs, results):
                    env[slot] = array
                for slot in release:
                    env[slot] = None
            arena.copy_out(env)
        except HetflowError:
            raise
        except Exception as error:  # noqa: BLE001  (re-raised with the node's context)
            op = next(op for op in self.ops if op.step.node is node)
            raise _kernel_error(op, env, error) from error
        finally:
            self._release("sequential", arena)
        return env

    def run_observed(self, feeds: Mapping[str, np.ndarray], observer: Observer) -> list[np.ndarray | None]:
        """The sequential loop with one observer call per step (profiling)."""
        env = self.environment(feeds)
        arena = self._acquire("sequential")
        try:
            for index, op in enumerate(self.ops):
                started = time.perf_counter()
                _run_op(op, env, arena.buffers[index])
                observer(op.step, time.perf_counter() - started)
                for slot in op.release:
                    env[slot] = None
            arena.copy_out(env)
        finally:
            self._release("sequential", arena)
        return env

    # -- parallel --------------------------------------------------------------------------------
    def run_parallel(self, feeds: Mapping[str, np.ndarray], threads: int) -> list[np.ndarray | None]:
        arena = self._acquire("parallel")
        try:
            run = _ParallelRun(self, self.environment(feeds), arena)
            pool = _branch_pool()
            for _ in range(threads - 1):
                pool.submit(run.work)
            run.work()
            env = run.finish()
            arena.copy_out(env)
        finally:
            # NOTE: finish() waits for every running step, so no helper still writes into the arena.
            self._release("parallel", arena)
        return env


#: Per step: the ``out`` views and the workspace a ``writes_out`` kernel gets (``out`` None: called
#: with the inputs only).
_Buffers = tuple[list[np.ndarray | None] | None, np.ndarray | None]


class _Arena:
    """One arena of a program's memory plan, with every step's views into it made once."""

    def __init__(self, program: Program, memory: MemoryPlan | None):
        self.memory = memory
        self.array = memory.new_arena() if memory is not None else None
        views = memory.views(self.array) if memory is not None else {}
        self.buffers: list[_Buffers] = []
        for index, op in enumerate(program.ops):
            kernel, node = op.step.kernel, op.step.node
            out: list[np.ndarray | None] | None = None
            workspace = None
            if kernel.writes_out and memory is not None:
                workspace = memory.workspace(self.array, index)  # type: ignore[arg-type]
                out = [views.get(name) if name else None for name in node.outputs]
                if any(memory.concat_parts.get(name) in node.outputs for name in node.inputs):
                    # NOTE: inputs placed inside this step's output (Concat): the kernel skips them.
                    out += [views[name] if name in memory.concat_parts else None for name in node.inputs]
                if workspace is None and all(view is None for view in out):
                    out = None
            self.buffers.append((out, workspace))
        # Tuples the hot loop unpacks without attribute lookups.
        self.hot = tuple(
            (op.fn, op.step.node, op.inputs, op.outputs, op.release, out, workspace)
            for op, (out, workspace) in zip(program.ops, self.buffers)
        )
        copy = memory.copy_out if memory is not None else frozenset()
        self.copy_slots = tuple(program.slots[name] for name in copy if name in program.slots)

    def copy_out(self, env: list[np.ndarray | None]) -> None:
        """Replace returned values that may alias the arena by copies (a later run reuses it)."""
        for slot in self.copy_slots:
            value = env[slot]
            if value is not None and np.may_share_memory(value, self.array):
                env[slot] = value.copy()


def _compile_steps(plan: Plan, slots: dict[str, int], pinned: set[int]) -> list[_Op]:
    producer: dict[int, int] = {}
    readers: dict[int, set[int]] = {}
    last_reader: dict[int, int] = {}
    for index, step in enumerate(plan.steps):
        for name in step.node.present_inputs():
            last_reader[slots[name]] = index
            if slots[name] in producer:
                readers.setdefault(producer[slots[name]], set()).add(index)
        for name in step.node.present_outputs():
            producer[slots[name]] = index
            last_reader.setdefault(slots[name], index)  # written but never read: released at once
    release: dict[int, list[int]] = {}
    for slot, index in last_reader.items():
        if slot not in pinned:
            release.setdefault(index, []).append(slot)
    read = {slots[name] for step in plan.steps for name in step.node.present_inputs()}
    ops = []
    for index, step in enumerate(plan.steps):
        node = step.node
        ops.append(
            _Op(
                step,
                fn=_streaming(step.kernel.fn, node, plan.streamed),
                inputs=tuple(slots[name] for name in node.inputs),
                outputs=tuple(slots[name] for name in node.outputs),
                release=tuple(release.get(index, ())),
                reads=tuple(sorted({slots[n] for n in node.present_inputs()} - pinned)),
                unread=tuple(slots[n] for n in node.present_outputs() if slots[n] not in read and slots[n] not in pinned),
                consumers=tuple(sorted(readers.get(index, ()))),
            )
        )
    return ops


def _streaming(
    fn: Callable[..., Sequence[np.ndarray | None]], node: Node, streamed: Mapping[str, StreamedWeight]
) -> Callable[..., Sequence[np.ndarray | None]]:
    """``fn``, or a wrapper that maps the node's streamed weights for the call (unmapped after it)."""
    positions = tuple((i, streamed[name]) for i, name in enumerate(node.inputs) if name in streamed)
    if not positions:
        return fn

    def mapped(node: Node, inputs: Sequence[np.ndarray | None], *rest: object) -> Sequence[np.ndarray | None]:
        arrays = list(inputs)
        for index, weight in positions:
            arrays[index] = weight.map()
        return fn(node, arrays, *rest)

    return mapped


def _reader_counts(ops: Sequence[_Op], size: int) -> list[int]:
    counts = [0] * size
    for op in ops:
        for slot in op.reads:
            counts[slot] += 1
    return counts


def _producer_counts(ops: Sequence[_Op]) -> list[int]:
    """Per step, how many distinct steps produce its inputs."""
    waiting = [0] * len(ops)
    for op in ops:
        for consumer in op.consumers:
            waiting[consumer] += 1
    return waiting


def _has_branches(ops: Sequence[_Op], waiting: Sequence[int]) -> bool:
    """Whether two steps can ever be ready at once (else parallel mode has nothing to overlap)."""
    left = list(waiting)
    ready = [i for i, count in enumerate(left) if count == 0]
    while ready:
        if len(ready) > 1:
            return True
        index = ready.pop()
        for consumer in ops[index].consumers:
            left[consumer] -= 1
            if left[consumer] == 0:
                ready.append(consumer)
    return False


def _run_op(op: _Op, env: list[np.ndarray | None], buffers: _Buffers) -> None:
    node = op.step.node
    inputs = [env[slot] for slot in op.inputs]
    out, workspace = buffers
    try:
        if out is None:
            results = op.fn(node, inputs)
        else:
            results = op.fn(node, inputs, out, workspace)
    except HetflowError:
        raise
    except Exception as error:  # noqa: BLE001  (re-raised with the node's context)
        raise _kernel_error(op, env, error) from error
    for slot, array in zip(op.outputs, results):
        env[slot] = array


def _kernel_error(op: _Op, env: list[np.ndarray | None], error: BaseException) -> KernelError:
    node = op.step.node
    shapes = ", ".join(str(None if env[s] is None else getattr(env[s], "shape", None)) for s in op.inputs)
    return KernelError(
        f"node '{node.name}' ({node.op_type}) failed on {op.step.device.id} with input shapes "
        f"({shapes}): {type(error).__name__}: {error}"
    )


# -- the parallel run ----------------------------------------------------------------------------
class _ParallelRun:
    """One parallel execution: a ready stack fed by dependency counts, shared by the worker threads.

    The ready list is a stack, so a thread that finishes a step usually continues down the same branch
    (depth first keeps fewer values alive than breadth first). Kernels run outside the lock.
    """

    def __init__(self, program: Program, env: list[np.ndarray | None], arena: _Arena):
        self.ops = program.ops
        self.buffers = arena.buffers
        self.env = env
        self.waiting = list(program.waiting)
        self.readers = list(program.reader_counts)
        self.ready = list(reversed(program.roots))
        self.unfinished = len(program.ops)
        self.running = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()

    def work(self) -> None:
        cond = self.cond
        while True:
            with cond:
                while not self.ready and self.unfinished and self.error is None:
                    cond.wait()
                if not self.ready or self.error is not None:
                    return
                index = self.ready.pop()
                op = self.ops[index]
                self.running += 1
            try:
                _run_op(op, self.env, self.buffers[index])
            except BaseException as error:  # noqa: BLE001  (re-raised by finish on the caller's thread)
                with cond:
                    self.error = self.error or error
                    self.running -= 1
                    cond.notify_all()
                return
            with cond:
                self._done(op)

    def _done(self, op: _Op) -> None:
        """Release what ``op`` read last and ready its consumers (called under the lock)."""
        env, readers, waiting = self.env, self.readers, self.waiting
        for slot in op.unread:
            env[slot] = None
        for slot in op.reads:
            readers[slot] -= 1
            if readers[slot] == 0:
                env[slot] = None
        woken = 0
        for consumer in op.consumers:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                self.ready.append(consumer)
                woken += 1
        self.running -= 1
        self.unfinished -= 1
        if self.unfinished == 0:
            self.cond.notify_all()
        elif woken > 1:
            # This thread takes one of them itself.
            self.cond.notify(woken - 1)

    def finish(self) -> list[np.ndarray | None]:
        """Wait for steps still running on helper threads; raise the first error."""
        with self.cond:
            while self.running:
                self.cond.wait()
        if self.error is not None:
            raise self.error
        return self.env


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _branch_pool() -> ThreadPoolExecutor:
    """Helper threads for parallel runs. A run never waits for a helper that has not started, so one
    pool serves every session (a busy pool slows a run down but cannot block it)."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(max(available_cores() - 1, 1), thread_name_prefix="hetflow-branch")
    return _pool


# -- the compiled-plan cache ---------------------------------------------------------------------
def compiled(plan: Plan, wanted: tuple[str, ...]) -> Program:
    """``plan`` compiled for the outputs ``wanted``; cached on the plan, so it lives as long as the plan.

    NOTE: a module-level cache keyed by the plan would keep every plan (and its weights) alive, since a
    Program refers to its plan.
    """
    program = plan.programs.get(wanted)
    if program is None:
        program = Program(plan, wanted)
        plan.programs[wanted] = program
    return program
