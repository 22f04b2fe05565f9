"""InferenceSession: ONNX Runtime's surface over hetflow's planner and executor."""

from __future__ import annotations

import functools
import os
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hetflow.devices.base import Device
from hetflow.devices.cpu.caches import last_level_cache_bytes
from hetflow.devices.registry import get_device, resolve_devices
from hetflow.errors import FeedError, InvalidModelError
from hetflow.frontends import ModelSource, load_model
from hetflow.graph import Graph, Value
from hetflow.graph.dtypes import onnx_name
from hetflow.graph.shapes import Dim, format_shape, is_static
from hetflow.passes import bind_batch
from hetflow.passes.manager import CPU_ONLY_PASSES
from hetflow.passes.manager import optimize as optimize_graph
from hetflow.runtime.budget import Residency, WeightStore, fit_plan, transformed_weight_bytes
from hetflow.runtime.executor import (
    ExecutionMode,
    Observer,
    Program,
    SteadyRun,
    check_mode,
    check_threads,
    execute,
    memory_plan,
    steady_run,
)
from hetflow.runtime.held_weights import hold_packed
from hetflow.runtime.memory import MemoryReport
from hetflow.runtime.placement import (
    MIN_GAIN,
    PlacementRules,
    best_single_device,
    measure_costs,
    measure_transfers,
    random_feeds,
    time_plans,
)
from hetflow.runtime.plan import Plan
from hetflow.runtime.planner import make_plan, run_arrangement
from hetflow.runtime.replay import Replay
from hetflow.runtime.sub_batch import (
    batch_symbol,
    candidates,
    check_sub_batch,
    default_images,
    fastest,
    run_in_parts,
    sub_batch_workload,
)
from hetflow.tuning.cache import TuningRecord, kernels_hash, now
from hetflow.tuning.select import Tuner
from hetflow.tuning.space import Workload


@dataclass(frozen=True)
class NodeArg:
    """An input or output as ONNX Runtime describes it: name, shape (ints, symbol names), type."""

    name: str
    shape: list[Dim | None]
    type: str


def _node_arg(value: Value) -> NodeArg:
    shape: list[Dim | None] = list(value.shape) if value.shape is not None else []
    return NodeArg(value.name, shape, onnx_name(value.dtype))


class InferenceSession:
    """Load a model once, run it many times.

    Args:
        model: a path (``.onnx``), ``"zoo:NAME"``, serialized bytes, an ``onnx.ModelProto`` or a Graph.
        device: ``"cpu"``, ``"opencl:N"``, or ``"auto"``: every device that starts here, accelerators
            first, the CPU last; with more than one, whole runs of each device alone and, where profiled
            per-node times promise a gain, of a per-node mix are timed, and the fastest plan is kept
            (once per batch size, on the first ``run`` at that size; ``placement_seconds`` shows them).
        placement: pins by node name or op type, e.g. ``{"conv1": "cpu"}`` or
            ``{"Conv": "cpu", "Gemm": "opencl:0"}`` (RSTensorFlow's "MatMul only"); a device named here is
            started even when ``device`` does not include it.
        optimize: apply the graph optimisation passes (``hetflow.passes.manager``).
        tune: measure the algorithms of layers the tuning cache lacks when a plan is made (once per
            batch size) and record them; by default the cache or the cost model decides, without
            measuring.
        tuning_cache: the tuning cache file (JSON lines) read, and with ``tune`` appended to; None:
            ``$HETFLOW_HOME/tuning/records.jsonl``. A path that does not exist yet reads as an empty cache:
            the cost model decides every layer ``tune`` does not measure.
        threads: BLAS threads during ``run`` (and kernels that split their own work); None: every core
            this process may use.
        execution_mode: ``"sequential"`` runs one op at a time (with ``threads=1``: CNNdroid's sequential
            mode, one thread in all); ``"parallel"`` also runs independent branches at the same time on
            ``threads`` threads.
        memory_budget: bytes (``1_000_000``) or a size (``"512MB"``, ``"1.5GiB"``) the session may hold:
            weights, the activation arena and workspace, Winograd's transformed weights, and the weights
            of the layer being read from disk. When the model does not fit, Winograd layers use im2col
            and weights are streamed from a scratch file, the largest kept resident
            (``hetflow.runtime.budget``); runs are then sequential and one at a time. Raises
            ``BudgetError`` when even streaming cannot fit (checked at batch 1 when the session is made,
            and for each new batch size).
        sub_batch: run a batch as runs of this many images each (depth first: each run's activations stay
            in cache; ``hetflow.runtime.sub_batch``), where the graph computes its images apart; None:
            as the tuning cache's record for the model and batch says (``hetflow tune MODEL --batch B``
            measures it; with ``tune``, the first run at a batch size measures it), else the cost
            model's choice: runs of fewer images where the batch's largest layer outgrows the last-level
            cache and the weights are small (``sub_batch.default_images``), else the whole batch at once.
            A ``sub_batch`` of the batch or more runs it whole.

    Example::

        sess = hetflow.InferenceSession("zoo:googlenet")
        [probs] = sess.run(None, {sess.get_inputs()[0].name: batch})
    """

    def __init__(
        self,
        model: ModelSource | Graph,
        device: str = "cpu",
        *,
        optimize: bool = True,
        tune: bool = False,
        tuning_cache: str | os.PathLike | None = None,
        threads: int | None = None,
        execution_mode: ExecutionMode = "sequential",
        placement: Mapping[str, str] | None = None,
        memory_budget: int | str | None = None,
        sub_batch: int | None = None,
        **options: Any,
    ):
        unknown = sorted(set(options) - _ACCEPTED_OPTIONS)
        if unknown:
            raise TypeError(f"unknown session option(s) {unknown}; accepted: {sorted(_ACCEPTED_OPTIONS)}")
        source_graph = load_model(model)
        requested = resolve_devices(device)
        pinned = {str(target) for target in (placement or {}).values()}
        cpu_only = all(d.kind == "cpu" for d in requested) and pinned <= {"cpu"}
        self._graph = optimize_graph(source_graph, cpu_only=cpu_only) if optimize else source_graph
        # A model read from a file is read again when its source graph is asked for, so the weights
        # the passes replaced (ResNet-50's unfolded Convs and BatchNormalizations: 90 of its 98 MB) are
        # not held beside those a run reads; ONNX Runtime frees them the same way.
        self._model_path = model if isinstance(model, (str, os.PathLike)) else None
        reread = self._model_path is not None and source_graph is not self._graph
        self._source_graph: Graph | None = None if reread else source_graph
        self._rules = PlacementRules.parse(placement, self._graph)
        self._devices = _session_devices(requested, self._rules)
        # NOTE: "auto" times its candidate placements (``_fastest_placement``); a named device is the
        # user's choice (the CPU only takes what it lacks).
        self._measure_placement = device == "auto" and len(self._devices) > 1
        # With "auto", the CPU's own candidate keeps the folds that only its kernels run.
        self._cpu_graph = self._graph
        if self._measure_placement and optimize and not cpu_only and memory_budget is None:
            self._cpu_graph = optimize_graph(self._graph, list(CPU_ONLY_PASSES))
        del source_graph  # NOTE: a graph read again on demand must not be held past here
        if memory_budget is None:
            holders = [self._graph, self._cpu_graph, self._source_graph]
            hold_packed([graph for graph in holders if graph is not None])
        self._placement_seconds: dict[tuple[tuple[str, int], ...], dict[str, float]] = {}
        self._tuner = Tuner(tune=tune, path=None if tuning_cache is None else Path(tuning_cache))
        self._threads = check_threads(threads)
        self._mode = check_mode(execution_mode)
        self._budget = None if memory_budget is None else _parse_budget(memory_budget)
        # The plan for the graph as declared; one more per concrete binding of its symbolic dimensions
        # (the batch), made on first use, so that algorithms are chosen for concrete shapes.
        self._plan = self._make_plan(self._graph)
        self._bound_plans: dict[tuple[tuple[str, int], ...], Plan] = {}
        self._inputs = self._graph.input_values()
        self._outputs = self._graph.output_values()
        self._all_outputs = [v.name for v in self._outputs]
        self._lock = threading.Lock()
        self._store: WeightStore | None = None
        self._residency: dict[int, Residency] = {}
        self._run_lock = threading.Lock()
        # (name, dtype, shape) of every feed of an accepted run -> its plan: a run fed alike skips the
        # checks and the binding (~8 us of LeNet's ~130 at batch 1).
        self._accepted: dict[tuple[tuple[str, np.dtype, tuple[int, ...]], ...], Plan] = {}
        # Later runs of an accepted signature whose runs are whole and sequential (see ``SteadyRun``), by
        # (signature, the outputs asked for).
        self._steady: dict[tuple, SteadyRun] = {}
        self._sub_batch = check_sub_batch(sub_batch)
        self._batch_symbol = batch_symbol(self._graph) if cpu_only and memory_budget is None else None
        if self._sub_batch is not None and self._batch_symbol is None:
            warnings.warn(
                "sub_batch is ignored: the session runs every batch whole (its graph may mix images, or it "
                "runs under a memory budget or beside another device)",
                stacklevel=2,
            )
        #: batch -> images per run (None: the whole batch at once), decided on the first run at that batch.
        self._images_per_run: dict[int, int | None] = {}
        self._images_lock = threading.Lock()
        if self._budget is not None:
            self._start_budget()
        elif _is_concrete(self._graph):
            memory_plan(self._plan, [v.name for v in self._outputs])

    @property
    def graph(self) -> Graph:
        """The graph the session runs (after the optimisation passes)."""
        return self._graph

    @property
    def source_graph(self) -> Graph:
        """The graph as loaded (folded and shape-inferred, before optimisation); a model given as a
        path is read from it again on each access (the session does not hold what it does not run)."""
        if self._source_graph is not None:
            return self._source_graph
        assert self._model_path is not None
        return load_model(self._model_path)

    @property
    def plan(self) -> Plan:
        """The plan for the graph as declared (symbolic batch); see ``plan_for`` for a concrete one."""
        return self._plan

    def plan_for(self, bindings: Mapping[str, int]) -> Plan:
        """The plan for concrete values of the symbolic dimensions (e.g. ``{"N": 16}``), made once."""
        key = tuple(sorted(bindings.items()))
        if not key:
            return self._plan
        with self._lock:
            plan = self._bound_plans.get(key)
            if plan is None:
                try:
                    bound = bind_batch(self._graph, dict(key))
                except InvalidModelError:
                    # NOTE: shapes that do not fit the graph fail in a kernel, with the node's name.
                    plan = self._plan
                else:
                    plan = self._fit(self._make_plan(bound, key))
                    # The memory plan is made with the plan, not on the first run.
                    memory_plan(plan, [v.name for v in self._outputs])
                self._bound_plans[key] = plan
        return plan

    # -- the memory budget -------------------------------------------------------------------------
    def _start_budget(self) -> None:
        """Move weights only the source graph holds to disk, and fit the plan for batch 1 at once."""
        self._store = WeightStore()
        if self._source_graph is not None:
            used = {id(array) for array in self._graph.initializers.values()}
            source = self._source_graph.initializers
            for name, array in list(source.items()):
                if id(array) not in used:
                    # NOTE: never read by a run (e.g. weights before BatchNormalization was folded in).
                    source[name] = self._store.add(f"source/{name}", array).map()
        if _is_concrete(self._graph):
            self._plan = self._fit(self._plan)
            memory_plan(self._plan, [v.name for v in self._outputs])
        else:
            symbols = {d for v in self._inputs for d in (v.shape or ()) if isinstance(d, str)}
            self.plan_for(dict.fromkeys(symbols, 1))

    def _fit(self, plan: Plan) -> Plan:
        """``plan`` made to fit the budget (itself without one); streamed weights leave every graph."""
        if self._budget is None:
            return plan
        assert self._store is not None
        before = set(self._store.entries)
        fitted, residency = fit_plan(plan, self._budget, self._store, [v.name for v in self._outputs])
        self._residency[id(fitted)] = residency
        for name in fitted.streamed:
            mapped = fitted.graph.initializers[name]
            for graph in (self._graph, self._source_graph):
                if graph is not None and name in graph.initializers and not isinstance(graph.initializers[name], np.memmap):
                    graph.initializers[name] = mapped
        if set(self._store.entries) - before:
            # Plans made earlier still hold the newly streamed weights: make them again.
            for key, earlier in list(self._bound_plans.items()):
                if earlier is not plan and earlier is not self._plan:
                    self._bound_plans[key] = self._fit(replace(earlier, graph=earlier.graph))
        return fitted

    def residency(self, batch: int | None = None) -> Residency | None:
        """How the plan at ``batch`` fits the memory budget (None without a budget)."""
        if self._budget is None:
            return None
        symbols = {d for v in self._inputs for d in (v.shape or ()) if isinstance(d, str)}
        return self._residency.get(id(self.plan_for(dict.fromkeys(symbols, batch or 1))))

    def arena_bytes(self, input_feed: Mapping[str, Any]) -> int:
        """Bytes of the arena a run on ``input_feed`` works in (allocated once, reused by later runs): of
        the runs of fewer images a split batch makes (``images_per_run``), of the whole batch else."""
        feeds = self._check_feeds(input_feed)
        images = self._images_for(feeds)
        if images is not None:
            feeds = {name: value[:images] for name, value in feeds.items()}
        plan = self.plan_for(_bindings(self._inputs, feeds))
        memory = memory_plan(plan, [v.name for v in self._outputs])
        return 0 if memory is None else memory.arena_bytes

    def memory_report(self, batch: int | None = None) -> MemoryReport:
        """Weights, planned arena, activation peak and workspace at ``batch`` (for a symbolic batch): those
        of the runs of fewer images it is split into, where it is (``images_per_run``)."""
        symbols = {d for v in self._inputs for d in (v.shape or ()) if isinstance(d, str)}
        images = self.images_per_run(batch) if batch else None
        plan = self.plan_for(dict.fromkeys(symbols, images or batch or 1))
        memory = memory_plan(plan, [v.name for v in self._outputs])
        weights = sum(int(a.nbytes) for a in self._graph.initializers.values())
        mapped = sum(int(a.nbytes) for a in self._graph.initializers.values() if isinstance(a, np.memmap))
        transformed = transformed_weight_bytes(plan)
        if memory is None:
            return MemoryReport(batch if symbols else None, weights, 0, 0, 0, 0, transformed, mapped)
        return MemoryReport(
            batch=(batch or 1) if symbols else None,
            weights_bytes=weights,
            arena_bytes=memory.arena_bytes,
            activation_bytes=memory.activation_bytes,
            workspace_bytes=memory.workspace_bytes,
            naive_bytes=memory.naive_bytes,
            transformed_bytes=transformed,
            mapped_bytes=mapped,
        )

    def _make_plan(self, graph: Graph, key: tuple[tuple[str, int], ...] = ()) -> Plan:
        """The plan for ``graph`` (bound to ``key``, the symbolic dimensions' values)."""
        if self._measure_placement and _is_concrete(graph):
            return self._fastest_placement(graph, key)
        return make_plan(graph, self._devices, self._tuner, self._rules, threads=self._threads)

    def _fastest_placement(self, graph: Graph, key: tuple[tuple[str, int], ...]) -> Plan:
        """``"auto"``'s plan: every device alone (the CPU taking what it lacks) and, where the measured
        per-node costs promise one, a per-node mix, each timed as whole runs; the fastest wins, a mix
        only when faster than the best single device by more than ``MIN_GAIN``."""
        makers = self._placement_candidates(graph, key)
        plans = {label: make() for label, make in makers.items()}
        seconds = time_plans(plans, random_feeds(graph), threads=self._threads)
        self._placement_seconds[key] = seconds
        single = min((label for label in seconds if label != MIXED), key=seconds.__getitem__)
        best = single
        if MIXED in seconds and seconds[MIXED] < seconds[single] * (1 - MIN_GAIN):
            best = MIXED
        # NOTE: made again: a timed plan has been executed and must not be edited (memory planning).
        return makers[best]()

    def _placement_candidates(
        self, graph: Graph, key: tuple[tuple[str, int], ...]
    ) -> dict[str, Callable[[], Plan]]:
        """Label -> a function making that candidate's plan: one per device, and ``MIXED`` when the
        per-node costs sum to clearly less than every single device's (``best_single_device``)."""
        hosts = [d for d in self._devices if d.kind == "cpu"]
        makers: dict[str, Callable[[], Plan]] = {}
        for device in self._devices:
            kept = [device] + [h for h in hosts if h is not device]
            order = kept + [d for d in self._devices if d.id in self._rules.device_ids() and d not in kept]
            own = graph
            if device.kind == "cpu" and self._cpu_graph is not self._graph:
                own = bind_batch(self._cpu_graph, dict(key)) if key else self._cpu_graph
            makers[device.id] = functools.partial(
                make_plan, own, order, self._tuner, self._rules, threads=self._threads
            )
        costs = measure_costs(graph, self._devices)
        transfers = measure_transfers(self._devices)
        if best_single_device(graph, self._devices, costs, transfers) is None:
            makers[MIXED] = functools.partial(
                make_plan, graph, self._devices, self._tuner, self._rules, costs, transfers, threads=self._threads
            )
        return makers

    def placement_seconds(self, batch: int | None = None) -> dict[str, float]:
        """What ``device="auto"`` timed before choosing its plan (at ``batch`` for a model with a
        symbolic batch): candidate -> the fastest whole run's seconds; candidates are device ids and
        ``"mixed"`` (each node where its measured cost was lowest). Empty for a named device."""
        key = () if batch is None else self._batch_key(batch)
        if batch is not None:
            self.plan_for(dict(key))
        return dict(self._placement_seconds.get(key, {}))

    def get_inputs(self) -> list[NodeArg]:
        """The feeds ``run`` expects."""
        return [_node_arg(v) for v in self._inputs]

    def get_outputs(self) -> list[NodeArg]:
        """The outputs ``run`` can return."""
        return [_node_arg(v) for v in self._outputs]

    @property
    def threads(self) -> int:
        """The threads a run of this session uses."""
        return self._threads

    @property
    def devices(self) -> list[Device]:
        """The devices this session may place nodes on, in priority order (the CPU last)."""
        return list(self._devices)

    def tuning_report(self) -> dict[str, dict[str, int]]:
        """Tuning-cache use so far: ``"algorithms"`` (per-layer algorithm choices: hits, misses,
        measured) and, per device that tunes its own kernels (OpenCL GEMM configurations), its counts."""
        report = {"algorithms": dict(self._tuner.stats)}
        for device in self._devices:
            stats = getattr(device, "tuning_stats", None)
            if stats is not None:
                report[device.id] = dict(stats())
        return report

    def get_providers(self) -> list[str]:
        return [d.id for d in self._devices]

    def replay_report(self) -> dict[str, list[str]]:
        """What this session's runs so far replay (``hetflow.runtime.replay``): ``"replayed"``, the nodes a
        captured run runs from compiled code, and ``"called"``, those it still calls from Python, each in
        run order (of the first captured run; empty before any run was captured)."""
        for _, found in self.captured_runs():
            return {"replayed": list(found.replayed_nodes), "called": list(found.called_nodes)}
        return {"replayed": [], "called": []}

    def captured_runs(self) -> list[tuple[Program, Replay]]:
        """The runs captured so far (``hetflow.runtime.replay``), each with the compiled program whose
        slots its values fill: one per plan (batch), arena and thread arrangement."""
        plans = {id(plan): plan for plan in [self._plan, *self._accepted.values()]}
        return [
            (program, found)
            for plan in plans.values()
            for program in plan.programs.values()
            for found in program.captured_runs()
        ]

    def placement(self, batch: int | None = None) -> dict[str, str]:
        """Node name -> device id where it runs (at ``batch`` for a model with a symbolic batch)."""
        if batch is None:
            return self._plan.placement()
        return self.plan_for(dict(self._batch_key(batch))).placement()

    def _batch_key(self, batch: int) -> tuple[tuple[str, int], ...]:
        symbols = {d for v in self._inputs for d in (v.shape or ()) if isinstance(d, str)}
        return tuple(sorted(dict.fromkeys(symbols, batch).items()))

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
        *,
        observer: Observer | None = None,
    ) -> list[np.ndarray]:
        """Compute ``output_names`` (all outputs when None) from ``input_feed``; thread-safe.

        Raises:
            FeedError: a feed is missing, unknown, or has the wrong dtype or shape.
        """
        signature = _signature(input_feed) if observer is None and self._budget is None else None
        if signature is not None:
            key = (signature, None if output_names is None else tuple(output_names))
            steady = self._steady.get(key)
            if steady is not None:
                return steady(input_feed)
        names = self._all_outputs if output_names is None else self._check_output_names(output_names)
        images = self._images_for(input_feed) if observer is None and self._batch_symbol is not None else None
        if images is not None:
            return run_in_parts(lambda part: self._run_whole(names, part, None), input_feed, images)
        results = self._run_whole(names, input_feed, observer)
        if signature is not None:
            self._remember_steady(key, signature, names, input_feed)
        return results

    def _remember_steady(
        self, key: tuple, signature: tuple, names: list[str], input_feed: Mapping[str, Any]
    ) -> None:
        """Keep the run just made on ``input_feed`` as a ``SteadyRun`` for later feeds of its signature."""
        plan = self._accepted.get(signature)
        if plan is None:
            return
        steady = steady_run(plan, input_feed, names, self._threads, self._mode)
        if steady is not None:
            if len(self._steady) >= _MOST_SIGNATURES:
                self._steady.clear()
            self._steady[key] = steady

    def _run_whole(
        self, names: list[str], input_feed: Mapping[str, Any], observer: Observer | None
    ) -> list[np.ndarray]:
        """``run`` of the whole batch in ``input_feed`` at once."""
        signature = _signature(input_feed)
        plan = self._accepted.get(signature) if signature is not None else None
        if plan is not None:
            feeds = input_feed
        else:
            feeds = self._check_feeds(input_feed)
            plan = self.plan_for(_bindings(self._inputs, feeds))
            if signature is not None:
                if len(self._accepted) >= _MOST_SIGNATURES:
                    self._accepted.clear()
                self._accepted[signature] = plan
        if self._budget is not None:
            # NOTE: one arena in all, so the budget holds: runs take turns, sequentially.
            with self._run_lock:
                results = execute(plan, feeds, names, observer, threads=self._threads, mode="sequential", replays=False)
        else:
            results = execute(plan, feeds, names, observer, threads=self._threads, mode=self._mode)
        return [results[name] for name in names]

    # -- sub-batches -------------------------------------------------------------------------------
    def images_per_run(self, batch: int) -> int | None:
        """How many images a run of ``batch`` takes at a time (None: all of them; see ``sub_batch``)."""
        if self._batch_symbol is None or batch < 2:
            return None
        if batch not in self._images_per_run:
            # Its own lock: measuring runs the session, whose plans take ``_lock``.
            with self._images_lock:
                if batch not in self._images_per_run:
                    self._images_per_run[batch] = self._choose_images(batch)
        return self._images_per_run[batch]

    def _images_for(self, input_feed: Mapping[str, Any]) -> int | None:
        """``images_per_run`` for the batch of ``input_feed`` (None where the feeds do not say one)."""
        first = input_feed.get(self._inputs[0].name) if self._inputs else None
        shape = getattr(first, "shape", None)
        if not shape or any(np.ndim(value) < 1 for value in input_feed.values()):
            return None
        return self.images_per_run(int(shape[0]))

    def sub_batch_record(self, batch: int) -> TuningRecord | None:
        """The tuning cache's measurement of runs of ``batch`` images whole and split (seconds per batch
        by images per run), measured now where the session tunes; None where there is none."""
        if self._batch_symbol is None or not candidates(batch) or not (self._tuner.use_cache or self._tuner.tune):
            return None
        device = get_device("cpu")
        cache = self._tuner.cache(device)
        bound = bind_batch(self._graph, {self._batch_symbol: batch})  # type: ignore[dict-item]
        workload = sub_batch_workload(self._graph, batch, run_arrangement(bound, self._threads).label, self._mode)
        version = kernels_hash(device.kernels.all_kernels())
        record = cache.lookup(workload, version) if self._tuner.use_cache else None
        if record is None and self._tuner.tune:
            record = self._measure_images(bound, batch, device, workload, version)
            cache.add(record)
        return record

    def _choose_images(self, batch: int) -> int | None:
        """The ``sub_batch`` option, else the tuning cache's record (measured here with ``tune``), else the
        cost model's choice (``sub_batch.default_images``)."""
        if self._sub_batch is not None:
            return self._sub_batch if self._sub_batch < batch else None
        record = self.sub_batch_record(batch)
        if record is None:
            # The rule weighs the CPU's cache: a session that may place layers elsewhere runs whole.
            on_cpu = all(device.kind == "cpu" for device in self._devices)
            return default_images(self._graph, batch, last_level_cache_bytes()) if on_cpu else None
        images = int(record.chosen)
        return images if images < batch else None

    def _measure_images(
        self, bound: Graph, batch: int, device: Device, workload: Workload, version: str
    ) -> TuningRecord:
        """Whole runs of ``batch`` random images (``bound``: the graph at that batch), at once and in each of
        ``candidates``' sizes."""
        from hetflow import __version__
        from hetflow.bench.timing import side_by_side

        feeds = random_feeds(bound)
        names = self._all_outputs
        runs = {str(batch): lambda: self._run_whole(names, feeds, None)}
        for images in candidates(batch):
            runs[str(images)] = lambda images=images: run_in_parts(
                lambda part: self._run_whole(names, part, None), feeds, images
            )
        times = {int(images): timing.min for images, timing in side_by_side(runs, MEASURED_RUNS).items()}
        chosen = fastest(times)
        self._forget_batches({batch, *candidates(batch)} - {chosen})
        return TuningRecord(
            device.fingerprint(), device.kind, workload, version, {str(k): v for k, v in times.items()},
            str(chosen), protocol={"runs": MEASURED_RUNS}, hetflow=__version__, date=now(),
        )  # fmt: skip

    def _forget_batches(self, batches: set[int]) -> None:
        """Drop the plans (and with them the arenas and captured runs) bound for these batch sizes: those
        a measurement of images per run made and will not use."""
        with self._lock:
            for key in [key for key in self._bound_plans if dict(key).get(self._batch_symbol) in batches]:
                del self._bound_plans[key]
            for signature in [s for s in self._accepted if s and s[0][2] and s[0][2][0] in batches]:
                del self._accepted[signature]
            self._steady.clear()

    # -- validation ----------------------------------------------------------------------------
    def _check_output_names(self, output_names: Sequence[str] | None) -> list[str]:
        available = [v.name for v in self._outputs]
        if output_names is None:
            return available
        unknown = [n for n in output_names if n not in available]
        if unknown:
            raise FeedError(f"unknown output name(s) {unknown}; the model's outputs are {available}")
        return list(output_names)

    def _check_feeds(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        expected = {v.name: v for v in self._inputs}
        unknown = sorted(set(input_feed) - set(expected))
        if unknown:
            raise FeedError(
                f"unknown input name(s) {unknown}; the model's inputs are "
                + ", ".join(f"'{v.name}' ({onnx_name(v.dtype)} {format_shape(v.shape)})" for v in self._inputs)
            )
        missing = [name for name in expected if name not in input_feed]
        if missing:
            raise FeedError(
                "missing input(s): "
                + ", ".join(f"'{n}' ({onnx_name(expected[n].dtype)} {format_shape(expected[n].shape)})" for n in missing)
            )
        bindings: dict[str, int] = {}
        feeds: dict[str, np.ndarray] = {}
        for name, raw in input_feed.items():
            feeds[name] = _check_feed(expected[name], raw, bindings)
        return feeds


#: ``placement_seconds``'s label of the per-node mix.
MIXED = "mixed"
_ACCEPTED_OPTIONS = frozenset({"sess_options", "providers", "provider_options"})
#: Timed rounds (a run of each candidate, interleaved: ``side_by_side``) when a session measures its
#: images per run.
MEASURED_RUNS = 5


def _session_devices(devices: list[Device], rules: PlacementRules) -> list[Device]:
    """The devices a session places nodes on, in priority order: ``devices``, then the CPU (as in ONNX
    Runtime, it runs whatever the chosen devices have no kernel for), then any device only a placement
    rule names (started now; raises if it cannot start). Such a device comes after the CPU, which has a
    kernel for everything, so it takes only the nodes pinned to it."""
    ordered = list(devices)
    if all(d.kind != "cpu" for d in ordered):
        ordered.append(get_device("cpu"))
    known = {d.id for d in ordered}
    ordered += [get_device(device_id) for device_id in sorted(rules.device_ids() - known)]
    return ordered


def _parse_budget(budget: int | str) -> int:
    # NOTE: imported here: hetflow.estimate imports this module.
    from hetflow.estimate.predict import parse_bytes

    return parse_bytes(budget)


#: Feed signatures a session remembers (``_signature``); past this many it forgets them all.
_MOST_SIGNATURES = 64


def _signature(feeds: Mapping[str, Any]) -> tuple[tuple[str, np.dtype, tuple[int, ...]], ...] | None:
    """(name, dtype, shape) of every feed when all are numpy arrays (what the checks read), else None."""
    signature = tuple((name, array.dtype, array.shape) for name, array in feeds.items() if type(array) is np.ndarray)
    return signature if len(signature) == len(feeds) else None


def _is_concrete(graph: Graph) -> bool:
    return all(v.shape is not None and is_static(v.shape) for v in graph.input_values())


def _bindings(inputs: Sequence[Value], feeds: Mapping[str, np.ndarray]) -> dict[str, int]:
    """Symbolic dimension -> size, as the (already checked) feeds set them."""
    bindings: dict[str, int] = {}
    for value in inputs:
        for dim, actual in zip(value.shape or (), feeds[value.name].shape):
            if isinstance(dim, str):
                bindings[dim] = int(actual)
    return bindings


def _check_feed(value: Value, raw: Any, bindings: dict[str, int]) -> np.ndarray:
    array = raw if isinstance(raw, np.ndarray) else np.asarray(raw)
    if array.dtype != value.dtype:
        raise FeedError(
            f"input '{value.name}' has type {onnx_name(array.dtype)}; expected {onnx_name(value.dtype)}"
        )
    if value.shape is None:
        return array
    if array.ndim != len(value.shape):
        raise FeedError(
            f"input '{value.name}' has shape {list(array.shape)} (rank {array.ndim}); expected "
            f"{format_shape(value.shape)} (rank {len(value.shape)})"
        )
    for axis, (dim, actual) in enumerate(zip(value.shape, array.shape)):
        if isinstance(dim, int):
            if dim != actual:
                raise FeedError(
                    f"input '{value.name}' has shape {list(array.shape)}; expected "
                    f"{format_shape(value.shape)} (dimension {axis} must be {dim})"
                )
        elif bindings.setdefault(dim, actual) != actual:
            raise FeedError(
                f"input '{value.name}' dimension {axis} ('{dim}') is {actual}, but another input "
                f"set '{dim}' to {bindings[dim]}"
            )
    return array
