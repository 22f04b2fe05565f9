"""Run a Plan: call each step's kernel, releasing values after their last reader.

A Plan is compiled once (per set of requested outputs) into a ``Program``: every value gets a slot in a
list, every step its input, output and release slots, and the initializers sit in a template list that a
run copies (a list copy, not a dict rebuild). The per-node cost of the sequential loop is then a list
comprehension, the kernel call and a few list stores.

Activations live in an arena laid out once per compiled program (``hetflow.runtime.memory``): kernels
that declared ``writes_out`` get views into it, so a steady-state run allocates no large arrays. Each
arena binds every step's kernel to those views and to the node's planned shapes once (``Kernel.bind``),
so a kernel that prepares does its per-call bookkeeping there rather than on every run. Every
concurrently running call takes its own arena from a pool (two threads never share one), and the values
returned to the caller never live in an arena (they are allocated per run, or copied out when they may
alias it).

Two execution modes:

- ``"sequential"``: the steps run one after the other on the calling thread. BLAS (and the kernels that
  split their own work) use the run's thread count; ``threads=1`` is CNNdroid's fully sequential mode.
- ``"parallel"``: steps whose inputs are ready may run at the same time on ``threads`` threads (the caller
  and helpers), driven by dependency counts; graphs without independent branches run sequentially.

A sequential run on the spinning pool (or on one thread) is captured once per arena and replayed after
(``hetflow.runtime.replay``): the steps whose kernels are compiled jobs run from one compiled call with no
Python between them, the others are called as above.

Values on devices (``_Residency``): a step on a device that keeps values resident (an OpenCL device:
it answers ``device_inputs``) gets device buffers for the inputs its kernel declares, and its kernel
returns device buffers. A value crosses to the host once, when a host step first reads it or when it is
returned; a host value crosses to a device once per device, when a step there first reads it. Weights
never cross here: kernels keep initializers resident themselves. A device buffer goes back to its
device's pool after the last step that reads it or any view of it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hetflow.devices.base import BoundCall, Device
from hetflow.devices.cpu.kernels import jit_gemm, jit_lstm
from hetflow.devices.cpu.kernels.rnn import spinning_lstm_batch
from hetflow.devices.cpu.threads import (
    NUMBA_POOL,
    arrangement_key,
    available_cores,
    blas_threads,
    hold_deferred_blas,
    own_threads,
    replay_key,
    spin_pool,
    spinning,
)
from hetflow.devices.opencl import DeviceArray
from hetflow.errors import HetflowError
from hetflow.graph import Graph, Node, Value
from hetflow.ops.base import planned_infos
from hetflow.ops.conv import DIRECT_FMA
from hetflow.runtime.memory import MemoryPlan, Order, plan_memory
from hetflow.runtime.plan import Plan, Step, StreamedWeight
from hetflow.runtime.replay import VIEW_OPS, DirectReplay, Replay, StepFailed, capture

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
    replays: bool = True,
) -> dict[str, np.ndarray]:
    """Run ``plan`` on ``feeds`` and return the requested outputs (all graph outputs by default).

    Args:
        threads: BLAS threads during the run (and, in parallel mode, concurrent steps); None: all cores.
        mode: ``"sequential"`` or ``"parallel"`` (see the module docstring).
        replays: a sequential run may be captured and replayed (``hetflow.runtime.replay``); off where
            memory is budgeted (a replay keeps the feeds' copies and some kernels' outputs).

    Every call keeps its values in a local environment, so one Plan may be executed from several threads
    at once. The plan must not be edited after its first execution (its compiled form is cached).
    """
    wanted = tuple(plan.graph.outputs) if outputs is None else tuple(outputs)
    program = compiled(plan, wanted)
    count = available_cores() if threads is None else threads
    parallel = mode == "parallel" and count > 1 and program.branches
    with program.arrangement(holds_batch(feeds), count).hold(deferred=observer is None and not parallel):
        if observer is not None:
            env = program.run_observed(feeds, observer)
        elif parallel:
            env = program.run_parallel(feeds, count)
        else:
            env = program.run(feeds, replays and REPLAYS)
    return {name: env[slot] for name, slot in zip(wanted, program.output_slots)}


class SteadyRun:
    """``execute``'s sequential run of one plan for fixed outputs, threads and feed signature, with what
    depends on those alone worked out once: what an ``InferenceSession`` calls for its later runs of
    that signature.

    Why: ``execute`` works the program and the thread arrangement out again on every call, some sixty
    Python calls in all, and after a large network's run their code and objects have left the caches:
    MobileNet v2 at batch 1 spent ~60 us before its replayed jobs and ~60 after them (a LeNet-sized run,
    whose jobs leave the caches warm, ~14 in all).
    """

    def __init__(self, program: Program, arrangement: ThreadArrangement):
        self.program = program
        self.arrangement = arrangement
        #: The run replayed directly once one was captured (``Program.direct_replay``), or None.
        self._direct: DirectReplay | None = None
        self._direct_tries = 0
        self._direct_busy = threading.Lock()  # one direct run at a time: a concurrent run takes the usual way

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The outputs, in order, of a run on ``feeds`` (of the signature this was made for)."""
        direct = self._direct
        if direct is not None and self._direct_busy.acquire(blocking=False):
            try:
                return direct.run(feeds)
            finally:
                self._direct_busy.release()
        program = self.program
        with self.arrangement.hold(deferred=True):
            env = program.run(feeds, REPLAYS)
        if self._direct is None and self._direct_tries < _DIRECT_TRIES and REPLAYS:
            self._direct_tries += 1
            self._direct = program.direct_replay(self.arrangement)
        return [env[slot] for slot in program.output_slots]  # type: ignore[misc]


def steady_run(
    plan: Plan, feeds: Mapping[str, np.ndarray], outputs: Sequence[str], threads: int | None, mode: ExecutionMode
) -> SteadyRun | None:
    """``execute(plan, feeds, outputs, threads=threads, mode=mode)`` as a ``SteadyRun`` for later feeds
    of the same signature; None where that run would not be sequential (parallel mode over branches)."""
    program = compiled(plan, tuple(outputs))
    count = available_cores() if threads is None else threads
    if mode == "parallel" and count > 1 and program.branches:
        return None
    return SteadyRun(program, program.arrangement(holds_batch(feeds), count))


#: Runs after which a ``SteadyRun`` stops looking for a direct replay (its runs are not replayed whole).
_DIRECT_TRIES = 2

#: Whether sequential runs are captured and replayed (``hetflow.runtime.replay``); ``HETFLOW_REPLAY=0``
#: turns it off (to compare).
REPLAYS = os.environ.get("HETFLOW_REPLAY", "1") != "0"


def splits_gemms(conv_macs: int, batched: bool, threads: int | None = None, direct_macs: int = 0) -> bool:
    """Whether a run holds BLAS at one thread and splits its GEMMs over its own ``threads``
    (``own_threads``), given its convolution multiply-adds, how many of them the direct kernel runs,
    and whether it holds a batch.

    Every batch spins instead where there is a spinning pool (``spins``, ``BATCHES_SPIN``). Without one
    (no ``jit_gemm``), a batch of a large convolutional network does (from OWN_THREADS_MIN_CONV_MACS), so
    that OpenBLAS's spinning workers never take the cores the compiled kernels' splits need, and so does
    a smaller batch where the direct kernel runs OWN_THREADS_MIN_DIRECT_SHARE of its multiply-adds. With
    HETFLOW_NUMBA_POOL=1, every run of a convolutional network does, in numba's pool (jit_gemm).
    Recurrent networks keep OpenBLAS's threads for their many small products (lstm-gesture ran 1.4-2.9x
    slower on one BLAS thread).
    """
    count = available_cores() if threads is None else threads
    if count <= 1 or conv_macs <= 0:
        return False
    if NUMBA_POOL and jit_gemm.available():
        return True
    if not batched or spins(conv_macs, batched, count):
        return False
    return conv_macs >= OWN_THREADS_MIN_CONV_MACS or direct_macs >= OWN_THREADS_MIN_DIRECT_SHARE * conv_macs


@dataclass(frozen=True)
class ThreadArrangement:
    """The threads a run holds: ``"own"`` (BLAS at one thread, products split by hetflow),
    ``"spin"`` (hetflow's spinning pool; BLAS held at one thread when ``hold_blas``) or ``"blas"``
    (BLAS's own threads). A kernel's time depends on it, so tuning records name it (``label``)."""

    kind: Literal["own", "spin", "blas"]
    threads: int
    hold_blas: bool = False

    @property
    def label(self) -> str:
        """Short text form, e.g. ``own:2``, ``spin:2+blas1``, ``blas:2``."""
        return f"{self.kind}:{self.threads}" + ("+blas1" if self.hold_blas else "")

    def hold(self, deferred: bool = False) -> blas_threads:
        """The context manager that holds this arrangement; ``deferred``: BLAS's count is set only when
        the run calls ``hold_deferred_blas`` (``Program.run``: before any step called from Python)."""
        if self.kind == "own":
            return own_threads(self.threads, NUMBA_POOL and jit_gemm.available(), deferred=deferred)
        if self.kind == "spin":
            return own_threads(self.threads, spin=True, hold_blas=self.hold_blas, deferred=deferred)
        return blas_threads(self.threads, deferred)


def thread_arrangement(
    conv_macs: int, batched: bool, threads: int | None = None, direct_macs: int = 0, recurrent_batch: int = 0
) -> ThreadArrangement:
    """The arrangement of a run with these convolution multiply-adds (``direct_macs`` of them on the
    direct kernel), holding a batch or not, at ``threads`` (None: every core), whose largest LSTM that
    can run on a spinning pool has ``recurrent_batch`` columns (``plan_recurrent_batch``)."""
    count = available_cores() if threads is None else threads
    if splits_gemms(conv_macs, batched, count, direct_macs):
        return ThreadArrangement("own", count)
    if spins(conv_macs, batched, count):
        return ThreadArrangement("spin", spin_threads(count), hold_blas=conv_macs >= SPIN_BLAS_MAX_CONV_MACS)
    if spins_recurrent(recurrent_batch, count):
        return ThreadArrangement("spin", spin_threads(count), hold_blas=True)
    return ThreadArrangement("blas", count)


def run_threads(
    conv_macs: int, batched: bool, threads: int | None = None, direct_macs: int = 0, recurrent_batch: int = 0
) -> blas_threads:
    """The thread arrangement a run holds (``thread_arrangement``), as a context manager."""
    return thread_arrangement(conv_macs, batched, threads, direct_macs, recurrent_batch).hold()


def spins_recurrent(recurrent_batch: int, threads: int | None = None) -> bool:
    """Whether a run spins for its LSTM (``jit_lstm.spins_at``): from ``jit_lstm.SPIN_MIN_BATCH`` columns,
    and at one, each time step is one job of the spinning pool (its recurrent product on the tile GEMM,
    or a GEMV), BLAS held at one thread. lstm-gesture (hidden 512, 100 steps), 2 threads, the LSTM alone,
    BLAS's threads -> spinning: batch 64 64.6 -> 30.4 ms, 32 36.4 -> 16.3, 16 20.8 -> 18.9; at 8 it lost
    (13.6 -> 23.5)."""
    count = available_cores() if threads is None else threads
    return count > 1 and jit_lstm.spins_at(recurrent_batch)


def spin_threads(count: int) -> int:
    """The threads a spinning run of a ``count``-thread session uses (``SPIN_MAX_THREADS`` at most)."""
    return min(count, SPIN_MAX_THREADS)


#: Whether every batch of a convolutional network spins (``spins``); else only those under
#: OWN_THREADS_MIN_CONV_MACS multiply-adds, the larger ones splitting on hetflow's own threads
#: (``splits_gemms``). A spinning run is captured and replayed (``hetflow.runtime.replay``), which its
#: pointwise and depthwise Convs, pools and BatchNormalizations gain most from. Batch 16, 2 threads,
#: spinning / own threads, one process alternating (``benchmarks/batch_threads.py``, minimums, 2026-12-02,
#: with replays): shufflenet 0.73, mobilenetv2 0.85, squeezenet 0.86, zfnet512 0.90, resnet50 0.94,
#: inception_v2 0.95, densenet121 0.96, googlenet 0.98, vgg19 0.98, alexnet 1.03 (before replays: 0.83
#: to 0.99). The estimator prices such runs from batch probes timed spinning (``@spin-batch`` keys).
BATCHES_SPIN = True


def spins(conv_macs: int, batched: bool, threads: int | None = None) -> bool:
    """Whether a run splits on spinning threads (``own_threads(spin=True)``): one example through a
    convolutional network, or a batch (``BATCHES_SPIN``; else one under OWN_THREADS_MIN_CONV_MACS). A small
    network's layers take microseconds, too few for a sleeping thread to wake; a large one's products
    split on the spinning pool as hetflow's own GEMM (``kernels.own_gemm``) and as single-threaded CBLAS
    parts (``jit_gemm``), and its direct Convs by kernel blocks (a batch's by images), where beside
    OpenBLAS's threads the compiled kernels could not split at all (its workers spin on the cores after
    every product). Measured at batch 1, 2 threads, one process alternating arrangements (minimums of
    30 runs, 3 rounds), BLAS's threads -> spinning: squeezenet 6.06 -> 4.86 ms, inception_v2 31.0 ->
    27.1, googlenet 23.4 -> 20.6, shufflenet 4.63 -> 4.10, mobilenetv2 7.89 -> 7.19, densenet121 45.0 ->
    42.9, resnet50 51.3 -> 49.9. At batch 16, hetflow's Python pool -> spinning (one process, minimums of
    30 runs): lenet 1.21 -> 0.86 ms, cifar10-quick 2.70 -> 2.10, mentee 6.13 -> 5.08."""
    count = available_cores() if threads is None else threads
    small = not batched or BATCHES_SPIN or conv_macs < OWN_THREADS_MIN_CONV_MACS
    return count > 1 and small and conv_macs > 0 and jit_gemm.available()


#: Convolution multiply-adds per run below which a spinning run leaves BLAS its thread count (from it,
#: BLAS is held at one thread). Measured at batch 1, 2 threads, A/B in alternating processes: lenet
#: (1.9 M) 0.79x and cifar10-quick (12 M) 0.78x the time spinning beside BLAS's count; mentee (29 M)
#: first lost 11% (its im2col GEMMs and fully connected layers split into chunks that each called
#: OpenBLAS at the session's thread count, whose own workers then contended with the spinning ones),
#: then, its Convs direct and the spinning pool's GEMVs compiled loops, gained 18% (0.82x); setting
#: OpenBLAS to one thread and back around each run cost LeNet ~20 us a run. The large networks ran
#: 1.3-2.2x slower spinning beside BLAS's two threads than beside one (googlenet 21.6 -> 43.2 ms,
#: resnet50 53.9 -> 111.3): each part of a split product woke OpenBLAS's own workers.
SPIN_BLAS_MAX_CONV_MACS = 40_000_000
#: The most threads such a run spins on (BLAS keeps the same count there, below
#: ``SPIN_BLAS_MAX_CONV_MACS``). Each spinning thread's part
#: of a product is one CBLAS call that OpenBLAS may split again over its own workers: with every core
#: spinning those wait for the scheduler's tick. On a 16-core host (the H100 machine) one 832x6x6 -> 256
#: 1x1 Conv at batch 1 took 24 ms a run at 16 threads, 0.2-12 ms at 8, and 0.2 ms at 4 and at 2.
SPIN_MAX_THREADS = 4


#: Without ``jit_gemm`` (the products then split on hetflow's Python pool): convolution multiply-adds
#: per run from which a batch runs on hetflow's own threads (``own_threads``).
#: Measured at batch 16, 2 threads (``benchmarks/compare.py``): the convolutional zoo models from
#: shufflenet's 2 GMAC up gain 8-28%; lenet, cifar10-quick and mentee (under 0.5 GMAC, many small
#: products) lost up to 2.4x, and lstm-gesture (no Conv, per-step GEMMs) lost 1.3x.
OWN_THREADS_MIN_CONV_MACS = 1_000_000_000
#: The share of a batch's convolution multiply-adds run by the direct kernel (``direct_fma``, split over
#: images on hetflow's Python pool) from which it runs on hetflow's own threads below
#: OWN_THREADS_MIN_CONV_MACS too. With BLAS at two threads, OpenBLAS's worker spun a whole core after
#: every product (1.08 s of CPU in a 1.09 s loop of cifar10-quick at batch 16) and the pool's thread
#: waited for it. Measured at batch 16, 2 threads, 3 s of runs a process, BLAS threads -> own threads
#: (median): cifar10-quick (all direct) 3.38 -> 2.26 ms, mentee (52%) 9.5 -> 7.5, lenet 1.15 -> 1.06;
#: but shufflenet at batch 4 (no direct Conv) 17.2 -> 19.7 and mobilenetv2 at batch 2 15.2 -> 18.9 lost.
OWN_THREADS_MIN_DIRECT_SHARE = 0.5


def plan_conv_macs(plan: Plan, algorithm: str | None = None) -> int:
    """Multiply-adds of the plan's Conv nodes whose shapes are concrete (0 when none are), of those
    whose kernel runs ``algorithm`` when given: what ``splits_gemms`` reads."""
    values = plan.graph.values
    return sum(
        node_conv_macs(step.node, values)
        for step in plan.steps
        if algorithm is None or step.kernel.algorithm == algorithm
    )


def node_conv_macs(node: Node, values: Mapping[str, Value]) -> int:
    """Multiply-adds of ``node`` when it is a Conv with concrete weight and output shapes, else 0."""
    if node.op_type != "Conv" or len(node.inputs) < 2:
        return 0
    weights, output = values.get(node.inputs[1]), values.get(node.outputs[0])
    shapes = (weights.shape if weights else None, output.shape if output else None)
    if any(shape is None or not all(isinstance(d, int) for d in shape) for shape in shapes):
        return 0
    return math.prod(shapes[1]) * math.prod(shapes[0][1:])  # each output sums C/group * taps terms


def plan_recurrent_batch(plan: Plan) -> int:
    """``graph_recurrent_batch`` of the plan's graph: what ``spins_recurrent`` reads."""
    return graph_recurrent_batch(plan.graph)


def graph_recurrent_batch(graph: Graph) -> int:
    """The most columns (batch) of the graph's LSTMs that run on a spinning pool when the run holds one
    (``rnn.spinning_lstm_batch``, on concrete shapes); 0 when there is none."""
    batches = [0]
    for node in graph.nodes:
        infos = planned_infos(node, graph.values) if node.op_type == "LSTM" else None
        if infos:
            batches.append(spinning_lstm_batch(node, infos))
    return max(batches)


def plan_conv_work(plan: Plan) -> tuple[int, int]:
    """(Conv multiply-adds, those the direct kernel runs) of ``plan``: what ``splits_gemms`` and
    ``run_threads`` read, for the executor, the estimator and ``--validate`` alike."""
    return plan_conv_macs(plan), plan_conv_macs(plan, DIRECT_FMA)


def holds_batch(feeds: Mapping[str, np.ndarray]) -> bool:
    """Whether the run's first input holds more than one example (its leading dimension)."""
    first = next(iter(feeds.values()), None)
    return first is not None and getattr(first, "ndim", 0) > 0 and first.shape[0] > 1


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
    device: Device | None = None  # the step's device when it keeps values resident, else None (host)
    moves: tuple[tuple[int, int, Device | None], ...] = ()  # (position, slot, target; None: the host)


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
        self.output_slots = tuple(self.slots[name] for name in wanted)
        self.input_slots = tuple(self.slots[name] for name in graph.inputs)
        #: Slots whose values stay put from run to run (what a captured run may read by address).
        self.stable_slots = frozenset(self.slots[name] for name in graph.initializers if name not in plan.streamed) | {_NONE}
        pinned = {self.slots[name] for name in (*graph.initializers, *wanted)} | {_NONE}
        self.ops = _compile_steps(plan, self.slots, pinned, {self.slots[n] for n in graph.initializers})
        self.resident_devices = tuple({id(op.device): op.device for op in self.ops if op.device}.values())
        self.template: list[np.ndarray | None] = [None] * len(self.slots)
        for name, array in graph.initializers.items():
            # NOTE: streamed weights are mapped by the steps that read them, for the step only.
            if name not in plan.streamed:
                self.template[self.slots[name]] = _constant(array) if self.resident_devices else array
        self.reader_counts = _reader_counts(self.ops, len(self.slots))
        self.waiting = tuple(_producer_counts(self.ops))
        self.roots = tuple(i for i, count in enumerate(self.waiting) if count == 0)
        self.branches = _has_branches(self.ops, self.waiting)
        self.conv_macs, self.direct_macs = plan_conv_work(plan)
        self.recurrent_batch = plan_recurrent_batch(plan)
        self.values = graph.values
        # NOTE: streamed weights are mapped anew for every call: not the same array twice.
        self.weights = frozenset(graph.initializers).difference(plan.streamed)
        self._plan = plan
        self._wanted = tuple(wanted)
        self._memory: dict[Order, MemoryPlan | None] = {"sequential": self._plan_memory("sequential")}
        self._arenas: dict[Order, list[_Arena]] = {"sequential": [], "parallel": []}
        self._direct_arenas: list[_Arena] = []  # arenas that direct replays (``direct_replay``) hold
        self._memory_lock = threading.Lock()

    def replayed_steps(self) -> tuple[bool, ...]:
        """Per step, whether a captured run replays it from compiled code (its bound call captures, or it
        is a view step; ``hetflow.runtime.replay``), where the estimator charges no dispatch. Binds an
        arena (kept for later runs)."""
        if self.resident_devices:
            return (False,) * len(self.ops)
        arena = self._acquire("sequential")
        try:
            return tuple(hasattr(call, "capture") or node.op_type in VIEW_OPS for call, node, *_ in arena.hot)
        finally:
            self._release("sequential", arena)

    def direct_replay(self, arrangement: ThreadArrangement) -> DirectReplay | None:
        """A ``DirectReplay`` of a captured run of this program in ``arrangement``, its arena taken out of
        the program's pool for good; None where runs there are not replayed whole from compiled code (no
        spinning pool, steps still called from Python, resident devices, replays turned off)."""
        if not REPLAYS or self.resident_devices or arrangement.kind != "spin" or arrangement.threads < 2:
            return None
        pool = spin_pool(arrangement.threads)
        arena = self._acquire("sequential")
        found = arena.replays.get(arrangement_key(pool, arrangement.threads))
        # NOTE: as ``own_threads`` holds BLAS: at one thread beside the spinning pool where ``hold_blas``.
        blas_count = 1 if arrangement.hold_blas else None
        direct = DirectReplay.of(found, pool, self.slots, self.output_slots, blas_count) if found is not None else None
        if direct is None:
            self._release("sequential", arena)
        else:
            self._direct_arenas.append(arena)
        return direct

    def captured_runs(self) -> list[Replay]:
        """The captured runs its arenas hold (``hetflow.runtime.replay``), one per arena and thread
        arrangement that captured something."""
        return [found for arena in self.sequential_arenas() for found in arena.replays.values() if found is not None]

    def sequential_arenas(self) -> list[_Arena]:
        """The arenas its sequential runs have made, those direct replays hold included."""
        return [*self._direct_arenas, *self._arenas["sequential"]]

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

    def arrangement(self, batched: bool, threads: int) -> ThreadArrangement:
        """The threads a run of this program holds at ``threads``, on a batch or not (``thread_arrangement``)."""
        return thread_arrangement(self.conv_macs, batched, threads, self.direct_macs, self.recurrent_batch)

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
    def run(self, feeds: Mapping[str, np.ndarray], replays: bool = True) -> list[np.ndarray | None]:
        """The steps one after the other; with ``replays``, as a captured run where the thread arrangement
        allows one (``hetflow.runtime.replay``): the arena's first such run captures, later ones replay."""
        if self.resident_devices:
            hold_deferred_blas()
            return self.run_resident(feeds)
        env = self.environment(feeds)
        arena = self._acquire("sequential")
        node = None
        key = replay_key() if replays else None
        found = arena.replays.get(key) if key is not None else None
        if found is None or found.calls_blas:
            hold_deferred_blas()
        try:
            if key is not None and key not in arena.replays:
                found = arena.replays[key] = capture(arena.hot, env, self.input_slots, self.stable_slots, spinning())
            elif found is not None:
                found.run(env, spinning())
            else:
                for call, node, inputs, outputs, release in arena.hot:  # noqa: B007  (node: for the error)
                    results = call([env[slot] for slot in inputs])
                    for slot, array in zip(outputs, results):
                        env[slot] = array
                    for slot in release:
                        env[slot] = None
            if found is not None:
                _copy_held(env, self.output_slots, found.held)
            arena.copy_out(env)
        except HetflowError:
            raise
        except StepFailed as failed:
            op = next(op for op in self.ops if op.step.node is failed.node)
            raise _kernel_error(op, env, failed.__cause__) from failed.__cause__  # type: ignore[arg-type]
        except Exception as error:  # noqa: BLE001  (re-raised with the node's context)
            op = next(op for op in self.ops if op.step.node is node)
            raise _kernel_error(op, env, error) from error
        finally:
            self._release("sequential", arena)
        return env

    def run_resident(
        self, feeds: Mapping[str, np.ndarray], observer: Observer | None = None
    ) -> list[np.ndarray | None]:
        """The sequential loop for plans with steps on resident devices (see ``_Residency``).

        With ``observer`` (profiling), each device step is waited for before its time is taken, and a
        returned value is brought to the host right after the step that makes it, so that the step is
        charged with its own transfers.
        """
        env = self.environment(feeds)
        arena = self._acquire("sequential")
        residency = _Residency(self)
        try:
            for index, op in enumerate(self.ops):
                started = time.perf_counter()
                residency.run(op, env, arena.calls[index])
                if observer is not None:
                    residency.settle(op, env)
                    observer(op.step, time.perf_counter() - started)
                for slot in op.release:
                    residency.release(slot, env)
            residency.finish(env)
            arena.copy_out(env)
        finally:
            residency.close()
            self._release("sequential", arena)
        return env

    def run_observed(self, feeds: Mapping[str, np.ndarray], observer: Observer) -> list[np.ndarray | None]:
        """The sequential loop with one observer call per step (profiling)."""
        if self.resident_devices:
            return self.run_resident(feeds, observer)
        env = self.environment(feeds)
        arena = self._acquire("sequential")
        try:
            for index, op in enumerate(self.ops):
                started = time.perf_counter()
                _run_op(op, env, arena.calls[index])
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
        residency = _Residency(self) if self.resident_devices else None
        try:
            run = _ParallelRun(self, self.environment(feeds), arena, residency)
            pool = _branch_pool()
            for _ in range(threads - 1):
                pool.submit(run.work)
            run.work()
            env = run.finish()
            if residency is not None:
                residency.finish(env)
            arena.copy_out(env)
        finally:
            # NOTE: finish() waits for every running step, so no helper still writes into the arena.
            if residency is not None:
                residency.close()
            self._release("parallel", arena)
        return env


#: Per step: the ``out`` views and the workspace a ``writes_out`` kernel gets (``out`` None: called
#: with the inputs only).
_Buffers = tuple[list[np.ndarray | None] | None, np.ndarray | None]


class _Arena:
    """One arena of a program's memory plan, with every step's views into it made once, and every
    step's kernel bound to them (``Kernel.bind``: a prepared call where the kernel has one)."""

    def __init__(self, program: Program, memory: MemoryPlan | None):
        self.memory = memory
        self.array = memory.new_arena() if memory is not None else None
        views = memory.views(self.array) if memory is not None else {}
        buffers: list[_Buffers] = []
        for index, op in enumerate(program.ops):
            kernel, node = op.step.kernel, op.step.node
            out: list[np.ndarray | None] | None = None
            workspace = None
            if kernel.writes_out and memory is not None:
                workspace = memory.workspace(self.array, index)  # type: ignore[arg-type]
                out = [views.get(name) if name else None for name in node.outputs]
                placed = memory.placed_inputs(node.inputs, node.outputs)
                if any(placed):
                    # NOTE: inputs placed inside this step's output (Concat): the kernel skips them.
                    out += [views[name] if inside else None for name, inside in zip(node.inputs, placed)]
                if workspace is None and all(view is None for view in out):
                    out = None
            buffers.append((out, workspace))
        self.calls: list[BoundCall] = [
            _bind(op, program.values, program.weights, out, workspace)
            for op, (out, workspace) in zip(program.ops, buffers)
        ]
        # Tuples the hot loop unpacks without attribute lookups.
        self.hot = tuple(
            (call, op.step.node, op.inputs, op.outputs, op.release) for op, call in zip(program.ops, self.calls)
        )
        #: Captured runs by thread arrangement (``replay_key``); None: that arrangement captured nothing.
        self.replays: dict[Hashable, Replay | None] = {}
        copy = memory.copy_out if memory is not None else frozenset()
        self.copy_slots = tuple(program.slots[name] for name in copy if name in program.slots)

    def copy_out(self, env: list[np.ndarray | None]) -> None:
        """Replace returned values that may alias the arena by copies (a later run reuses it)."""
        for slot in self.copy_slots:
            value = env[slot]
            if value is not None and np.may_share_memory(value, self.array):
                env[slot] = value.copy()


def _copy_held(env: list[np.ndarray | None], slots: Sequence[int], held: frozenset[int]) -> None:
    """Replace the returned values a captured run owns by copies (the next run writes them again)."""
    for slot in slots:
        value = env[slot]
        if slot in held and value is not None:
            env[slot] = value.copy()


def _compile_steps(plan: Plan, slots: dict[str, int], pinned: set[int], weights: set[int]) -> list[_Op]:
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
                device=_resident_device(step),
                moves=_moves(step, slots, weights),
            )
        )
    return ops


def _constant(array: np.ndarray) -> np.ndarray:
    """``array`` as a read-only view, made once per compiled program.

    NOTE: devices keep read-only arrays resident (uploaded once, keyed by the array); weights made by
    the graph passes (folded BatchNormalization) are writable and would be uploaded on every run. The
    view marks them as the constants they are for the plan's lifetime without touching the graph's own
    arrays (a trainer may still update those).
    """
    if not isinstance(array, np.ndarray) or not array.flags.writeable:
        return array
    view = array.view()
    view.flags.writeable = False
    return view


def _resident_device(step: Step) -> Device | None:
    """The step's device when it keeps values resident (it answers ``device_inputs``), else None."""
    return step.device if callable(getattr(step.device, "device_inputs", None)) else None


def _moves(step: Step, slots: Mapping[str, int], weights: set[int]) -> tuple[tuple[int, int, Device | None], ...]:
    """Per input that may have to cross before the step runs: (position, slot, where it must be).

    Inputs a resident device's kernel declares go to that device; every other input must be on the host.
    Weights are left alone: kernels keep initializers resident themselves, uploaded once per session.
    """
    device = _resident_device(step)
    wanted = set(device.device_inputs(step.kernel, step.node)) if device is not None else set()  # type: ignore[attr-defined]
    moves = []
    for position, name in enumerate(step.node.inputs):
        slot = slots[name]
        if slot == _NONE or slot in weights:
            continue
        moves.append((position, slot, device if position in wanted else None))
    return tuple(moves)


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


def _bind(
    op: _Op, values: Mapping[str, Value], weights: frozenset[str], out: list[np.ndarray | None] | None,
    workspace: np.ndarray | None,
) -> BoundCall:  # fmt: skip
    """The step's call as ``call(inputs)``: its kernel bound to the node's planned input shapes (the
    ``weights``, resident initializers, as ``WeightInfo``) and its buffers. Steps on resident devices
    (their inputs are device buffers) and steps that map streamed weights call their function as it is."""
    node, kernel, fn = op.step.node, op.step.kernel, op.fn
    if op.device is None and fn is kernel.fn:
        return kernel.bind(node, planned_infos(node, values, weights), out, workspace)
    if out is None:
        return lambda inputs: fn(node, inputs)
    return lambda inputs: fn(node, inputs, out, workspace)


def _run_op(op: _Op, env: list[np.ndarray | None], call: BoundCall) -> None:
    inputs = [env[slot] for slot in op.inputs]
    try:
        results = call(inputs)
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


# -- values on devices ---------------------------------------------------------------------------
class _Residency:
    """One run's bookkeeping of values on devices: the copies made for readers elsewhere, and how many
    slots hold each pooled device buffer (a buffer goes back to its pool when none does).

    Every value has one home, where its producer left it (``env``); ``mirrors`` holds its copies on
    other devices or the host, made when a step there first reads it and dropped with the value, so a
    value crosses to each place at most once per run.
    """

    def __init__(self, program: Program):
        self.program = program
        self.mirrors: dict[int, dict[int, object]] = {}  # slot -> id(target device) or 0 (host) -> copy
        self.holders: dict[int, int] = {}  # id(allocation) -> slots (and mirrors) holding it
        self.pending: set[int] = set()  # ids of resident devices with kernels queued since the last wait
        self.outputs = frozenset(program.output_slots)
        self.lock = threading.Lock()

    # -- one step --------------------------------------------------------------------------------
    def run(self, op: _Op, env: list, call: BoundCall) -> None:
        """Move the step's inputs where it reads them, run it, and record what it left on a device."""
        if op.device is None:
            self._wait_for_devices()
        inputs = [env[slot] for slot in op.inputs]
        for position, slot, target in op.moves:
            inputs[position] = self._where(slot, inputs[position], target)
        try:
            results = call(inputs)
        except HetflowError:
            raise
        except Exception as error:  # noqa: BLE001  (re-raised with the node's context)
            raise _kernel_error(op, env, error) from error
        with self.lock:
            for slot, value in zip(op.outputs, results):
                env[slot] = value
                self._hold(value)
            if op.device is not None:
                self.pending.add(id(op.device))

    def settle(self, op: _Op, env: list) -> None:
        """Profiling: wait for the step's device, and bring the step's returned outputs to the host now
        (so the step is charged with its own time and transfers)."""
        if op.device is not None:
            op.device.synchronize()
        for slot in op.outputs:
            if slot in self.outputs and isinstance(env[slot], DeviceArray):
                self._where(slot, env[slot], None)

    def _wait_for_devices(self) -> None:
        """Before a host step: wait for devices that may still read host memory it could overwrite.

        NOTE: on unified memory an uploaded value is the host memory itself (the arena's, wrapped), and
        a kernel queued to read it may not have run yet; the host step may be the next writer there.
        Copying devices took their copy when the buffer was made, so they need no wait.
        """
        with self.lock:
            pending, self.pending = self.pending, set()
        for device in self.program.resident_devices:
            if id(device) in pending and getattr(device, "unified_memory", False):
                device.synchronize()

    # -- crossings -------------------------------------------------------------------------------
    def _where(self, slot: int, value: object, target: Device | None) -> object:
        """``value`` (the home of ``slot``) where ``target`` reads it (None: the host), moved at most once."""
        if value is None:
            return None
        if target is None and not isinstance(value, DeviceArray):
            return value
        if isinstance(value, DeviceArray) and value.device is target:
            return value
        key = 0 if target is None else id(target)
        with self.lock:
            copies = self.mirrors.setdefault(slot, {})
            found = copies.get(key)
            if found is None:
                found = self._move(slot, value, target)
                copies[key] = found
                self._hold(found)
        return found

    def _move(self, slot: int, value: object, target: Device | None) -> object:
        host = value
        if isinstance(value, DeviceArray):
            copies = self.mirrors.get(slot, {})
            host = copies[0] if 0 in copies else value.device.to_host(value)  # type: ignore[union-attr]
            if target is None:
                return host
            copies.setdefault(0, host)
        return target.to_device(np.ascontiguousarray(host))  # type: ignore[union-attr]

    # -- lifetimes -------------------------------------------------------------------------------
    def _hold(self, value: object) -> None:
        allocation = value.allocation if isinstance(value, DeviceArray) else None
        if allocation is not None:
            self.holders[id(allocation)] = self.holders.get(id(allocation), 0) + 1

    def _drop(self, value: object) -> None:
        """One holder of ``value`` is gone; its buffer goes back to the pool when it was the last one."""
        if not isinstance(value, DeviceArray):
            return
        device = value.device
        assert device is not None
        allocation = value.allocation
        if allocation is None:
            device.park(value)  # an upload: kernels queued with it may not have run yet
            return
        left = self.holders[id(allocation)] - 1
        if left:
            self.holders[id(allocation)] = left
        else:
            del self.holders[id(allocation)]
            device.release(value)

    def release(self, slot: int, env: list) -> None:
        """``slot``'s last reader has run: drop its value and the copies made of it."""
        with self.lock:
            self._drop(env[slot])
            env[slot] = None
            for copy in self.mirrors.pop(slot, {}).values():
                self._drop(copy)

    def finish(self, env: list) -> None:
        """Bring returned values to the host (once each) and drop the copies still held (of feeds)."""
        for slot in self.program.output_slots:
            value = env[slot]
            if isinstance(value, DeviceArray):
                host = self._where(slot, value, None)
                with self.lock:
                    self._drop(value)
                env[slot] = host
        with self.lock:
            for copies in self.mirrors.values():
                for copy in copies.values():
                    self._drop(copy)
            self.mirrors.clear()

    def close(self) -> None:
        """Wait for every device the run used (also after an error: queued kernels may still read
        buffers this run is about to drop)."""
        for device in self.program.resident_devices:
            device.synchronize()


# -- the parallel run ----------------------------------------------------------------------------
class _ParallelRun:
    """One parallel execution: a ready stack fed by dependency counts, shared by the worker threads.

    The ready list is a stack, so a thread that finishes a step usually continues down the same branch
    (depth first keeps fewer values alive than breadth first). Kernels run outside the lock.
    """

    def __init__(self, program: Program, env: list[np.ndarray | None], arena: _Arena, residency: _Residency | None):
        self.residency = residency
        self.ops = program.ops
        self.calls = arena.calls
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
                if self.residency is not None:
                    self.residency.run(op, self.env, self.calls[index])
                else:
                    _run_op(op, self.env, self.calls[index])
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
        residency = self.residency
        for slot in op.unread:
            if residency is not None:
                residency.release(slot, env)
            env[slot] = None
        for slot in op.reads:
            readers[slot] -= 1
            if readers[slot] == 0:
                if residency is not None:
                    residency.release(slot, env)
                env[slot] = None
        woken = 0
        for consumer in op.consumers:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                self.ready.append(consumer)
                woken += 1
        self.running -= 1
        self.unfinished -= 1
        if self.unfinished == 0 or (self.error is not None and self.running == 0):
            # The run is over, or has failed and ``finish`` waits for the last step still running.
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
