"""GEMM auto-tuning on an OpenCL device: configurations per (device fingerprint, kernel source, shape
class), searched within a time budget and kept in the tuning cache.

The GEMM's knobs and the values worth trying are declared beside its source (``kernels/gemm.py``:
``GEMM_SPACE``). A *shape class* groups the products one configuration serves: M, N and K rounded up to
powers of two (so a 61 x 3025 x 363 product and a 64 x 4096 x 512 one share a class), and whether a launch
multiplies several matrices. Records go into the shared JSON-lines cache (``hetflow.tuning.cache``) as
``TuningRecord``s whose workload op is ``"opencl.gemm"``, whose candidates are configuration labels
(``"rm=4,rn=3,vw=8,kt=16,wgm=1,wgn=1,local=0"``) with their measured seconds, and whose ``kernels`` field
is a hash of gemm.cl: together with the device fingerprint (platform and its version, device, vendor,
driver version) a changed driver or kernel never reuses a stale entry.

Effort (``hetflow tune --effort``, a session's ``tune=True``):

* ``none``: no measurement; cached configurations are used, the default elsewhere;
* ``fast``: a short hand-picked list, always whole (the default, 16- and 8-wide register blocks, the
  K-sliced walk, eight local-memory tilings: 19 variants, the device's default first; a few seconds per
  class once built);
* ``full``: the fast list, then random points of the whole space until the class's time budget
  (60 s) is spent.

Measurement (the Augur protocol): operands packed on the device once, then per candidate one untimed
launch (the build and first touch), then rounds of ``launch + finish``; the minimum is kept. Each
candidate's result is checked against numpy before it is timed; a wrong one is recorded as an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from hetflow.devices.opencl.kernels.gemm import (
    DEFAULT_CONFIG,
    GEMM_SPACE,
    GPU_DEFAULT_CONFIG,
    GPU_SMALL_CONFIGS,
    SOURCE,
    GemmConfig,
    default_config,
    gemm_configs,
    prepare_gemm,
)
from hetflow.tuning.cache import TuningCache, TuningRecord, cache_path, now
from hetflow.tuning.space import Workload

if TYPE_CHECKING:
    from hetflow.devices.opencl import OpenCLDevice
    from hetflow.graph import Graph, Node
    from hetflow.ops.base import TensorInfo

#: The workload op of GEMM configuration records.
GEMM_OP = "opencl.gemm"
#: Hash of the kernel source the records were measured with.
GEMM_SOURCE_HASH = hashlib.sha256(SOURCE.encode("utf-8")).hexdigest()[:16]
EFFORT_LEVELS = ("none", "fast", "full")


@dataclass(frozen=True)
class Effort:
    """How hard to search one shape class: a time budget, timed rounds per candidate, and whether to
    go past the hand-picked list."""

    budget_seconds: float
    rounds: int
    explore: bool


EFFORTS = {
    "fast": Effort(budget_seconds=0.0, rounds=3, explore=False),
    "full": Effort(budget_seconds=60.0, rounds=5, explore=True),
}

#: The ``fast`` list: the CPU default first, then variants of its register block, vector width and K
#: depth, and local-memory tilings (the shapes a GPU driver prefers). A search puts the device's own
#: default first (``candidates``).
FAST_CONFIGS: tuple[GemmConfig, ...] = (
    DEFAULT_CONFIG,
    # 16-wide vectors (AVX-512 CPUs, where PoCL prefers float16): 12-16 accumulators of 32 registers.
    GemmConfig(rm=6, rn=2, vw=16),
    GemmConfig(rm=8, rn=2, vw=16),
    GemmConfig(rm=4, rn=1, vw=16),
    # The same blocks walking MB row blocks per K slice (B's micro-panel slice stays in L1).
    GemmConfig(rm=6, rn=2, vw=16, mb=16, kc=256),
    GemmConfig(rm=8, rn=2, vw=16, mb=16, kc=256),
    GemmConfig(rm=6, rn=2, vw=16, mb=16, kc=512),
    GemmConfig(rm=6, rn=2, vw=16, mb=64, kc=256),
    # 8-wide vectors (AVX2): 12 float8 accumulators of 16 registers.
    GemmConfig(rm=4, rn=3, vw=8, mb=16, kc=256),
    GemmConfig(rm=6, rn=2, vw=8),
    GemmConfig(rm=8, rn=1, vw=8),
    # Local-memory tilings, the shapes a GPU driver prefers: 32x64 and 64x64 tiles in groups of 64 to
    # 256 work-items (smaller groups and tiles leave more groups for a small product).
    GemmConfig(rm=4, rn=2, vw=4, kt=16, wgm=4, wgn=4, local=1),
    GPU_DEFAULT_CONFIG,
    GemmConfig(rm=4, rn=1, vw=4, kt=16, wgm=8, wgn=16, local=1),
    GemmConfig(rm=2, rn=1, vw=4, kt=16, wgm=16, wgn=16, local=1),
    GemmConfig(rm=8, rn=1, vw=8, kt=16, wgm=8, wgn=8, local=1),
    GemmConfig(rm=4, rn=1, vw=4, kt=32, wgm=16, wgn=16, local=1),
    *GPU_SMALL_CONFIGS,
)


def config_label(config: GemmConfig) -> str:
    """``"rm=4,rn=3,..."``: a configuration as a cache candidate name."""
    return ",".join(f"{name}={value}" for name, value in dataclasses.asdict(config).items())


def parse_label(label: str) -> GemmConfig:
    """The configuration named by ``config_label``; raises ValueError on anything else."""
    names = {f.name for f in dataclasses.fields(GemmConfig)}
    values: dict[str, int] = {}
    for item in label.split(","):
        name, _, text = item.partition("=")
        if name not in names or not text.lstrip("-").isdigit():
            raise ValueError(f"not a GEMM configuration label: {label!r}")
        values[name] = int(text)
    return GemmConfig(**values)


def _bucket(size: int) -> int:
    return 1 << max(int(size) - 1, 0).bit_length()


def shape_class(m: int, n: int, k: int, batch: int = 1) -> dict[str, int]:
    """The shape class of a product: sizes rounded up to powers of two, batched or not."""
    return {"m": _bucket(m), "n": _bucket(n), "k": _bucket(k), "batched": int(batch > 1)}


def gemm_workload(m: int, n: int, k: int, batch: int = 1) -> Workload:
    return Workload(GEMM_OP, shape_class(m, n, k, batch))


@dataclass
class TuningStats:
    """What the device's GEMM tuning did: shape classes found in the cache (hits), not found (misses),
    and searched now (tuned)."""

    hits: int = 0
    misses: int = 0
    tuned: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass
class GemmTuning:
    """One device's GEMM configurations by shape class.

    Attributes:
        device: the device.
        path: the cache file; ``$HETFLOW_HOME/tuning/records.jsonl`` when None (read on first use).
        stats: cache hits and misses, counted once per shape class per process.
    """

    device: OpenCLDevice
    path: Any = None
    stats: TuningStats = field(default_factory=TuningStats)
    _cache: TuningCache | None = field(default=None, repr=False)
    _chosen: dict[Workload, GemmConfig] = field(default_factory=dict, repr=False)
    # Every run asks once per product; building its Workload serialises a key (~15 us), so the answer
    # is kept by the exact sizes too.
    _by_shape: dict[tuple[int, int, int, int], GemmConfig] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def cache(self) -> TuningCache:
        with self._lock:
            if self._cache is None:
                self._cache = TuningCache(self.path or cache_path(), self.device.fingerprint())
            return self._cache

    def reset(self, path: Any = None) -> None:
        """Forget what was read and chosen (tests point ``path`` at a private file)."""
        with self._lock:
            self.path = path
            self._cache = None
            self._chosen.clear()
            self._by_shape.clear()
            self.stats = TuningStats()

    def cached(self, workload: Workload) -> GemmConfig | None:
        """The cached best configuration of ``workload`` (None when absent or unreadable)."""
        record = self.cache().lookup(workload, GEMM_SOURCE_HASH)
        if record is None:
            return None
        try:
            return parse_label(record.chosen)
        except ValueError:
            return None

    def config(self, m: int, n: int, k: int, batch: int = 1) -> GemmConfig:
        """The configuration for a product: tuned for its class when cached, else the default."""
        found = self._by_shape.get((m, n, k, batch))
        if found is not None:
            return found
        found = self._config_of_class(m, n, k, batch)
        self._by_shape[(m, n, k, batch)] = found
        return found

    def _config_of_class(self, m: int, n: int, k: int, batch: int) -> GemmConfig:
        workload = gemm_workload(m, n, k, batch)
        found = self._chosen.get(workload)
        if found is not None:
            return found
        with self._lock:
            found = self._chosen.get(workload)
            if found is None:
                found = self.cached(workload)
                if found is None:
                    self.stats.misses += 1
                    found = default_config(self.device, m, n, batch)
                else:
                    self.stats.hits += 1
                self._chosen[workload] = found
            return found

    def ensure(self, m: int, n: int, k: int, batch: int, effort: str) -> GemmConfig:
        """The configuration for a product, searching its class now when the cache lacks it and
        ``effort`` is not ``"none"``."""
        workload = gemm_workload(m, n, k, batch)
        with self._lock:
            if workload in self._chosen and self.cached(workload) is not None:
                return self._chosen[workload]
            found = self.cached(workload)
            if found is not None:
                self.stats.hits += 1
            elif effort == "none":
                self.stats.misses += 1
                found = default_config(self.device, m, n, batch)
            else:
                self.stats.misses += 1
                record = search(self.device, m, n, k, batch, effort)
                self.cache().add(record)
                self.stats.tuned += 1
                found = parse_label(record.chosen)
            self._chosen[workload] = found
            self._by_shape.clear()  # products of this class looked up before now get the new choice
            return found


def _random_operands(m: int, n: int, k: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, k, n)).astype(np.float32)
    return a, b


def candidates(
    effort: str, max_work_group: int, seed: int = 0, first: GemmConfig = DEFAULT_CONFIG
) -> list[GemmConfig]:
    """The configurations ``effort`` tries, in order: ``first`` (the device's default), the rest of
    the fast list, then (``full``) the rest of the space in a seeded random order."""
    ordered = [first, *(c for c in FAST_CONFIGS if c != first)]
    fitting = [c for c in ordered if c.wgm * c.wgn <= max_work_group]
    if not EFFORTS[effort].explore:
        return fitting
    rest = [c for c in gemm_configs(GEMM_SPACE, max_work_group) if c not in fitting]
    # NOTE: more than 16 float accumulators per vector lane spill on every target seen so far.
    rest = [c for c in rest if c.rm * c.rn * c.vw <= 16 * 16 and (c.local or c.wgm * c.wgn == 1)]
    random.Random(seed).shuffle(rest)
    return fitting + rest


def time_config(
    device: OpenCLDevice, a: np.ndarray, b: np.ndarray, config: GemmConfig, rounds: int
) -> float:
    """Minimum seconds of one launch of ``config`` on ``a @ b`` (kernel only), after one untimed one.

    Raises:
        ValueError: the result differs from numpy's.
    """
    launch = prepare_gemm(device, a, b, config=config)
    launch.enqueue()
    got = launch.result()
    expected = np.matmul(a, b)
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    if not np.allclose(got, expected, rtol=1e-3, atol=1e-4 * scale * a.shape[2] ** 0.5):
        raise ValueError("wrong_result: differs from numpy")
    best = float("inf")
    for _ in range(max(rounds, 1)):
        start = time.perf_counter()
        launch.enqueue()
        device.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def search(
    device: OpenCLDevice,
    m: int,
    n: int,
    k: int,
    batch: int,
    effort: str,
    budget_seconds: float | None = None,
    configs: Sequence[GemmConfig] | None = None,
) -> TuningRecord:
    """Measure configurations for one product within ``effort``'s budget; the record of all of them.

    ``configs`` replaces ``effort``'s candidate list (tests, benchmarks).

    Raises:
        ValueError: no configuration ran correctly.
    """
    from hetflow import __version__

    plan = EFFORTS[effort]
    budget = plan.budget_seconds if budget_seconds is None else budget_seconds
    a, b = _random_operands(m, n, k, batch)
    max_group = int(device.device.max_work_group_size)
    times: dict[str, float] = {}
    errors: dict[str, str] = {}
    started = time.perf_counter()
    first = default_config(device, m, n, batch)
    fast = set(candidates("fast", max_group, first=first))
    for config in candidates(effort, max_group, first=first) if configs is None else configs:
        # The hand-picked list always runs whole (builds dominate a first run); the budget bounds the
        # exploration past it.
        if config not in fast and times and time.perf_counter() - started > budget:
            break
        label = config_label(config)
        try:
            times[label] = time_config(device, a, b, config, plan.rounds)
        except Exception as error:  # noqa: BLE001  (a failing candidate is data, not a crash)
            errors[label] = f"{type(error).__name__}: {error}"
    if not times:
        raise ValueError(f"no GEMM configuration ran correctly for {m}x{n}x{k}: {errors}")
    return TuningRecord(
        fingerprint=device.fingerprint(),
        device=device.kind,
        workload=gemm_workload(m, n, k, batch),
        kernels=GEMM_SOURCE_HASH,
        candidates=times,
        chosen=min(times, key=times.__getitem__),
        errors=errors,
        protocol={
            "effort": effort, "budget_seconds": budget, "rounds": plan.rounds,
            "shape": [m, n, k, batch], "python": platform.python_version(),
        },  # fmt: skip
        hetflow=__version__,
        date=now(),
    )


# -- which products a node runs ---------------------------------------------------------------------
def node_gemms(node: Node, inputs: Sequence[TensorInfo | None]) -> list[tuple[int, int, int, int]]:
    """The ``(M, N, K, batch)`` products the OpenCL kernels run for ``node`` (empty for other ops)."""
    from hetflow.devices.opencl.kernels import conv, gemm, lstm

    finder: dict[str, Callable[[Node, Sequence[TensorInfo | None]], list[tuple[int, int, int, int]]]] = {
        "Gemm": gemm.gemm_products,
        "MatMul": gemm.gemm_products,
        "Conv": conv.conv_products,
        "LSTM": lstm.lstm_products,
    }
    found = finder.get(node.op_type)
    if found is None or any(i is not None and not all(isinstance(d, int) for d in i.shape) for i in inputs):
        return []
    try:
        return found(node, inputs)
    except (ValueError, AssertionError, IndexError):
        return []


@dataclass(frozen=True)
class GemmTuningRow:
    """One product of a model after ``tune_gemms``: its class, where its configuration came from."""

    shape: tuple[int, int, int, int]
    workload: Workload
    config: GemmConfig
    source: str  # "cache", "tuned" or "default"
    record: TuningRecord | None


def tune_gemms(
    graph: Graph,
    device: OpenCLDevice,
    effort: str,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
) -> list[GemmTuningRow]:
    """Give every GEMM shape class of ``graph`` (shapes bound) a configuration, searching the ones the
    cache lacks unless ``effort`` is ``"none"``; one row per distinct class."""
    from hetflow.runtime.planner import input_infos

    if effort not in EFFORT_LEVELS:
        raise ValueError(f"effort must be one of {list(EFFORT_LEVELS)}, not {effort!r}")
    products: dict[Workload, tuple[int, int, int, int]] = {}
    for node in graph.nodes:
        inputs = input_infos(graph, node)
        if inputs is None or device.kernels.lookup(node, inputs) is None:
            continue
        for shape in node_gemms(node, inputs):
            products.setdefault(gemm_workload(*shape), shape)
    tuning = device.gemm_tuning
    rows = []
    items = list(products.items())
    for workload, shape in progress(items) if progress else items:
        before = tuning.stats.tuned
        was_cached = tuning.cached(workload) is not None
        config = tuning.ensure(*shape, effort=effort)
        source = "cache" if was_cached else ("tuned" if tuning.stats.tuned > before else "default")
        record = tuning.cache().lookup(workload, GEMM_SOURCE_HASH)
        rows.append(GemmTuningRow(shape, workload, config, source, record))
    return rows


def effort_of(tuner: Any) -> str:
    """The GEMM search effort matching a ``Tuner``'s measurement options (``full`` for the full
    protocol, else ``fast``)."""
    from hetflow.tuning.measure import EFFORTS as MEASURE_EFFORTS

    return "full" if getattr(tuner, "options", None) == MEASURE_EFFORTS["full"] else "fast"


def tune_node(device: OpenCLDevice, node: Node, inputs: Sequence[TensorInfo | None], effort: str) -> None:
    """Make sure every GEMM class ``node`` runs has a configuration (a session's ``tune=True``)."""
    for shape in node_gemms(node, inputs):
        try:
            device.gemm_tuning.ensure(*shape, effort=effort)
        except ValueError as error:
            warnings.warn(f"GEMM tuning of node '{node.name}' failed ({error}); default kept", stacklevel=2)


def report_gemm_tuning(
    graph: Graph,
    device: OpenCLDevice,
    effort: str,
    progress: Callable[[Iterable[Any]], Iterable[Any]] | None = None,
    out: Callable[[str], None] = print,
) -> list[GemmTuningRow]:
    """``tune_gemms`` and a table of its rows: each GEMM class, where its configuration came from, and
    (where the record has them) the tuned and default configurations' GFLOP/s on the measured shape."""
    rows = tune_gemms(graph, device, effort, progress)
    out(f"GEMM configurations on {device.id} ({device.name()}), effort {effort}: {len(rows)} shape class(es)")
    if not rows:
        return rows
    out(f"{'M x N x K (batch)':<26} {'source':<8} {'tuned GFLOP/s':>13} {'default GFLOP/s':>15} {'gain':>6}  config")
    for row in rows:
        m, n, k, batch = row.shape
        shape = f"{m} x {n} x {k} ({batch})"
        default = config_label(default_config(device, m, n, batch))
        tuned = default_rate = "-"
        gain = ""
        if row.record is not None:
            measured = row.record.protocol.get("shape", [m, n, k, batch])
            flops = 2.0 * float(np.prod(measured, dtype=np.float64))
            best = row.record.candidates[row.record.chosen]
            tuned = f"{flops / best / 1e9:.1f}"
            if default in row.record.candidates:
                base = row.record.candidates[default]
                default_rate = f"{flops / base / 1e9:.1f}"
                gain = f"{base / best:.2f}x"
        out(f"{shape:<26} {row.source:<8} {tuned:>13} {default_rate:>15} {gain:>6}  {config_label(row.config)}")
    stats = device.tuning_stats()
    out(f"cache: {stats['hits']} hit(s), {stats['misses']} miss(es), {stats['tuned']} searched now")
    return rows
