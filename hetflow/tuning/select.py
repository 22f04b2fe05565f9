"""The one place that decides a tunable node's kernel: measured, else cost model, else default.

Order of precedence for a node whose shapes are concrete and whose device has several candidates:

1. a record for (machine fingerprint, workload, kernel sources) in the tuning cache: its fastest
   candidate among those that still exist;
2. only when the session asked for it (``tune=True``): measure now (``measure.py``), append the record,
   use its fastest — never implicitly, a plain session creation measures nothing;
3. the op's cost-model heuristic (for Conv: ``hetflow.ops.conv.heuristic_conv_algorithm``);
4. the device's first candidate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetflow.devices.base import Device, Kernel
from hetflow.graph import Graph, Node
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import ALGORITHM_FALLBACK, conv_window, fused_epilogue, heuristic_conv_algorithm
from hetflow.tuning.cache import TuningCache, TuningRecord, cache_path, kernels_hash, now
from hetflow.tuning.measure import MeasureOptions, measure
from hetflow.tuning.space import Workload, tunable_kernels, workload_of

if TYPE_CHECKING:
    from hetflow.runtime.executor import ThreadArrangement


def _conv_heuristic(node: Node, inputs: Sequence[TensorInfo | None]) -> str:
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    spec = conv_window(node.attrs, w.shape)
    return heuristic_conv_algorithm(spec, [int(d) for d in x.shape], int(w.shape[0]), node.attrs.group, x.dtype,
                                    *fused_epilogue(node))


#: Op type -> the algorithm its cost model prefers for concrete inputs.
HEURISTICS: dict[str, Callable[[Node, Sequence[TensorInfo | None]], str]] = {"Conv": _conv_heuristic}


@dataclass(frozen=True)
class Choice:
    """A node's kernel and where the decision came from (``tuned``, ``measured``, ``heuristic``,
    ``default``); ``record`` is the measurement behind a tuned or measured choice."""

    kernel: Kernel
    source: str
    record: TuningRecord | None = None


@dataclass
class Tuner:
    """Tuning settings of one session or command, and the caches it has opened.

    Attributes:
        tune: measure workloads the cache lacks (the session's ``tune=True``; ``hetflow tune``).
        use_cache: read the cache at all (False: cost model only, no disk access).
        options: the measurement protocol's effort.
        path: the cache file; ``$HETFLOW_HOME/tuning/records.jsonl`` when None.
    """

    tune: bool = False
    use_cache: bool = True
    options: MeasureOptions = field(default_factory=MeasureOptions)
    path: Path | None = None
    #: Tuning cache lookups of per-layer algorithm choices: ``hits``, ``misses``, ``measured``.
    stats: dict[str, int] = field(default_factory=lambda: {"hits": 0, "misses": 0, "measured": 0})
    _caches: dict[str, TuningCache] = field(default_factory=dict, repr=False)

    def cache(self, device: Device) -> TuningCache:
        """The device's cache, read on first use."""
        found = self._caches.get(device.id)
        if found is None:
            found = TuningCache(self.path or cache_path(), device.fingerprint())
            self._caches[device.id] = found
        return found

    def choose(
        self,
        device: Device,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        arrangement: ThreadArrangement | None = None,
    ) -> Choice | None:
        """The kernel for ``node`` on ``device``; None when the node has nothing to choose from.

        ``arrangement``: the threads the run will hold; a CPU kernel's record is looked up, and measured,
        in it (``in_arrangement``).

        A device with tunable kernel *parameters* (OpenCL's GEMM configurations) gets the node first
        through its ``prepare_node(node, inputs, tuner)``: with ``tune`` it searches what its cache
        lacks, so the algorithms below are then measured with tuned kernels.
        """
        prepare = getattr(device, "prepare_node", None)
        if prepare is not None:
            prepare(node, inputs, self)
        workload = in_arrangement(workload_of(node, inputs), device, arrangement)
        if workload is None:
            return None
        candidates = tunable_kernels(device, node, inputs)
        if not candidates:
            return None
        if len(candidates) == 1:
            return Choice(candidates[0], "default")
        by_algorithm = {k.algorithm: k for k in candidates}
        if self.use_cache or self.tune:
            version = kernels_hash(candidates)
            record = self.cache(device).lookup(workload, version) if self.use_cache else None
            self.stats["hits" if record is not None else "misses"] += 1
            if record is None and self.tune:
                record = self.measure(device, node, inputs, candidates, workload, arrangement)
                self.stats["measured"] += 1
                return Choice(by_algorithm[record.chosen], "measured", record)
            if record is not None:
                timed = {a: t for a, t in record.candidates.items() if a in by_algorithm}
                if timed:
                    return Choice(by_algorithm[min(timed, key=timed.__getitem__)], "tuned", record)
        return untuned_choice(node, inputs, candidates)

    def measure(
        self,
        device: Device,
        node: Node,
        inputs: Sequence[TensorInfo | None],
        candidates: Sequence[Kernel] | None = None,
        workload: Workload | None = None,
        arrangement: ThreadArrangement | None = None,
    ) -> TuningRecord:
        """Measure every candidate of ``node`` now, append the record to the cache and return it.

        A CPU device's candidates are timed holding ``arrangement`` (the threads the run holds): a
        batch's im2col multiplies on hetflow's tile GEMM there, on BLAS's threads outside.

        Raises:
            ValueError: the node is not tunable or no candidate ran correctly.
        """
        from hetflow import __version__

        workload = workload or in_arrangement(workload_of(node, inputs), device, arrangement)
        candidates = list(candidates) if candidates is not None else tunable_kernels(device, node, inputs)
        if workload is None or not candidates:
            raise ValueError(f"node '{node.name}' ({node.op_type}) has no tunable workload")
        with holding(device, arrangement):
            results = measure(candidates, node, inputs, self.options, device)
        times = {r.algorithm: r.seconds for r in results if r.seconds is not None}
        if not times:
            raise ValueError(f"no candidate ran correctly on node '{node.name}': {results}")
        record = TuningRecord(
            fingerprint=device.fingerprint(),
            device=device.kind,
            workload=workload,
            kernels=kernels_hash(candidates),
            candidates=times,
            chosen=min(times, key=times.__getitem__),
            errors={r.algorithm: r.error for r in results if r.error is not None},
            protocol={**dataclasses.asdict(self.options), "python": platform.python_version()},
            hetflow=__version__,
            date=now(),
        )
        self.cache(device).add(record)
        return record


def in_arrangement(
    workload: Workload | None, device: Device, arrangement: ThreadArrangement | None
) -> Workload | None:
    """``workload`` as timed on ``device`` in ``arrangement``: a CPU's carries the arrangement's label
    (``threads``), so a record timed in one arrangement never decides a run that holds another."""
    arrangement = _on_cpu(device, arrangement)
    if workload is None or arrangement is None:
        return workload
    return Workload(workload.op, {**workload.params, "threads": arrangement.label})


def holding(device: Device, arrangement: ThreadArrangement | None) -> contextlib.AbstractContextManager:
    """Holds ``arrangement`` while ``device``'s candidates are timed (nothing off the CPU, or without one)."""
    arrangement = _on_cpu(device, arrangement)
    return arrangement.hold() if arrangement is not None else contextlib.nullcontext()


def _on_cpu(device: Device, arrangement: ThreadArrangement | None) -> ThreadArrangement | None:
    """``arrangement`` where it applies: only a CPU's kernels run on the host's thread arrangement."""
    return arrangement if device.kind == "cpu" else None


def untuned_choice(node: Node, inputs: Sequence[TensorInfo | None], candidates: Sequence[Kernel]) -> Choice:
    """Among ``candidates`` (a device's tunable kernels for ``node``), what is run without a measurement:
    the cost model's algorithm (or its stand-in on a device without it), else the first."""
    by_algorithm = {k.algorithm: k for k in candidates}
    heuristic = HEURISTICS.get(node.op_type)
    preferred = heuristic(node, inputs) if heuristic else None
    if preferred not in by_algorithm:
        preferred = ALGORITHM_FALLBACK.get(preferred)
    if preferred in by_algorithm:
        return Choice(by_algorithm[preferred], "heuristic")
    return Choice(candidates[0], "default")


def choose_kernel(
    device: Device, node: Node, inputs: Sequence[TensorInfo | None], tuner: Tuner | None = None
) -> Kernel | None:
    """The kernel for ``node`` (cost model only when ``tuner`` is None); None when nothing to choose."""
    choice = (tuner or Tuner(use_cache=False)).choose(device, node, inputs)
    return None if choice is None else choice.kernel


@dataclass(frozen=True)
class LayerTuning:
    """One tunable layer of a model after ``tune_graph``: its measurement and what the device runs
    without one (``heuristic``: the cost model's algorithm, or its stand-in there)."""

    node: Node
    workload: Workload
    record: TuningRecord
    heuristic: str


def tune_graph(
    graph: Graph,
    device: Device,
    tuner: Tuner,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    threads: int | None = None,
) -> list[LayerTuning]:
    """Measure every distinct tunable workload of ``graph`` (shapes must be concrete) and record it.

    Layers with a single candidate are measured too: their record holds the layer's time. On the CPU
    they are measured holding the threads a run of ``graph`` at ``threads`` holds
    (``planner.run_arrangement``), and recorded as such.

    Args:
        graph: a graph with bound shapes (``passes.bind_batch``).
        device: where to measure.
        tuner: its options set the effort; its cache receives the records.
        progress: wraps the iteration over distinct workloads (e.g. ``tqdm``).
        threads: the session's thread count (None: every core).

    Returns:
        one entry per tunable layer, in graph order (layers sharing a workload share its record).
    """
    from hetflow.runtime.planner import input_infos, run_arrangement

    arrangement = run_arrangement(graph, threads)
    # Each tunable layer with what its device runs untuned (from the candidates found here).
    layers: list[tuple[Node, list[TensorInfo | None], Workload, str]] = []
    for node in graph.nodes:
        inputs = input_infos(graph, node)
        workload = in_arrangement(workload_of(node, inputs), device, arrangement)
        candidates = tunable_kernels(device, node, inputs) if inputs is not None and workload is not None else []
        if candidates:
            untuned = untuned_choice(node, inputs, candidates).kernel.algorithm
            layers.append((node, inputs, workload, untuned))
    distinct: dict[Workload, tuple[Node, list[TensorInfo | None]]] = {}
    for node, inputs, workload, _ in layers:
        distinct.setdefault(workload, (node, inputs))
    records: dict[Workload, TuningRecord] = {}
    items = list(distinct.items())
    # NOTE: held once around every measurement (the workloads already carry its label): a spinning
    # arrangement's pool starts once, and arrangements do not nest.
    with holding(device, arrangement):
        for workload, (node, inputs) in progress(items) if progress else items:
            records[workload] = tuner.measure(device, node, inputs, workload=workload)
    return [LayerTuning(node, workload, records[workload], untuned) for node, _, workload, untuned in layers]
