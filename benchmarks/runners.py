"""One runner per runtime, same interface: a compiled model with its feed bound.

Shared by ``compare.py`` (speed, every runtime in one process) and ``peak_rss.py`` (memory, each runtime
in a process of its own). Each runtime is imported only when its runner is made, so a process that
measures one runtime's memory holds no other's libraries.

hetflow's runners never read the user's tuning cache, so that a table does not depend on what was tuned
on the machine before: ``hetflow`` plans every layer with the cost model (a fresh install), and
``hetflow-tuned`` measures every layer's algorithms when its session is made (``tune=True``, CNNdroid's
tuning on first launch) into a cache of the benchmark process's own, which later models reuse for the
layer shapes they share.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

RUNTIMES = ("hetflow", "ort", "openvino", "hetflow-parallel", "hetflow-tuned", "hetflow-lite")
LABELS = {
    "hetflow": "hetflow", "ort": "ORT", "openvino": "OpenVINO", "hetflow-parallel": "hetflow parallel",
    "hetflow-tuned": "hetflow tuned", "hetflow-lite": "hetflow lite",
}


class Runner(Protocol):
    """A compiled model with its feed bound: ``run()`` computes one batch."""

    def run(self) -> None: ...


@functools.cache
def _tuning_folder() -> Path:
    """This process's tuning caches (removed when it exits)."""
    folder = tempfile.TemporaryDirectory(prefix="hetflow-bench-tuning-")
    atexit.register(folder.cleanup)
    return Path(folder.name)


class HetflowRunner:
    mode = "sequential"
    #: Measure the layers' algorithms when the session is made (else the cost model picks them).
    tune = False

    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import hetflow

        cache = _tuning_folder() / ("tuned.jsonl" if self.tune else "never-written.jsonl")
        self.session = hetflow.InferenceSession(
            path, threads=threads, execution_mode=self.mode, tune=self.tune, tuning_cache=cache
        )
        self.feed = feed

    def run(self) -> None:
        self.session.run(None, self.feed)


class ParallelHetflowRunner(HetflowRunner):
    mode = "parallel"


class TunedHetflowRunner(HetflowRunner):
    tune = True


class OrtRunner:
    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.feed = feed

    def run(self) -> None:
        self.session.run(None, self.feed)


class OpenVinoRunner:
    """OpenVINO on the ONNX file, the batch made static, f32, CPU pinning off (on 2 cores pinning makes
    whole runs take 2x now and then)."""

    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        model.reshape({name: list(array.shape) for name, array in feed.items()})
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "ENABLE_CPU_PINNING": False,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
        }
        self.request = core.compile_model(model, "CPU", config).create_infer_request()
        self.feed = feed

    def run(self) -> None:
        self.request.infer(self.feed, share_inputs=True)


class LiteRunner:
    """A compiled package of the model (``hetflow compile``, made once per model file, batch and thread
    count in a separate process and kept under ~/.cache/hetflow/packages), run by ``hetflow_lite``: this
    process imports neither hetflow nor numba."""

    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        from hetflow_lite import CompiledSession

        self.session = CompiledSession(compiled_package(path, feed, threads), threads=threads)
        self.feed = feed

    def run(self) -> None:
        self.session.run(None, self.feed)


def compiled_package(path: Path, feed: dict[str, np.ndarray], threads: int) -> Path:
    """The package of the model at ``path`` for ``feed``'s batch and ``threads`` (compiled if missing)."""
    import hashlib
    import subprocess
    import sys

    batch = next(iter(feed.values())).shape[0]
    stat = path.stat()
    # The model file and hetflow's sources: a package holds the kernels and plan of the hetflow that made it.
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{_sources_digest()}".encode()).hexdigest()[:12]
    folder = Path.home() / ".cache" / "hetflow" / "packages" / f"{path.stem}-b{batch}-t{threads}-{key}"
    if not _current_package(folder):
        command = [sys.executable, "-m", "hetflow.cli", "compile", str(path), "-o", str(folder), "--batch", str(batch),
                   "--threads", str(threads)]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
    return folder


def _sources_digest() -> str:
    """A digest of every Python source of ``hetflow`` and ``hetflow_lite`` and of numba's version, worked
    out without importing either: the ``hetflow-lite`` runtime's process must not load hetflow (its peak
    memory is what ``peak_rss.py`` reads; importing hetflow for this key added ~90 MiB there)."""
    import hashlib
    import importlib.metadata
    import importlib.util

    digest = hashlib.sha256(importlib.metadata.version("numba").encode())
    for package in ("hetflow", "hetflow_lite"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, f"{package} is not installed as a package"
        root = Path(next(iter(spec.submodule_search_locations))).resolve()
        for source in sorted(path for path in root.rglob("*.py") if "__pycache__" not in path.parts):
            digest.update(source.relative_to(root.parent).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def _current_package(folder: Path) -> bool:
    """Whether ``folder`` holds a package of the format this hetflow_lite reads."""
    from hetflow_lite import package

    try:
        return json.loads((folder / package.MANIFEST).read_text()).get("version") == package.VERSION
    except (OSError, ValueError):
        return False


RUNNER_TYPES: dict[str, Callable[..., Runner]] = {
    "hetflow": HetflowRunner, "ort": OrtRunner, "openvino": OpenVinoRunner, "hetflow-parallel": ParallelHetflowRunner,
    "hetflow-tuned": TunedHetflowRunner, "hetflow-lite": LiteRunner,
}


def parse_arguments(parser: argparse.ArgumentParser, argv: list[str] | None, threads: int) -> argparse.Namespace:
    """``argv`` parsed by ``parser`` with the options every side-by-side script takes added: --runtimes
    (a list in ``args.runtimes``; an unknown one is a usage error), --threads, --json, --markdown."""
    parser.add_argument("--runtimes", default="hetflow,ort,openvino", help=f"any of {','.join(RUNTIMES)}")
    parser.add_argument("--threads", type=int, default=threads)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    parser.add_argument("--markdown", type=Path, help="also write the markdown table (for BENCHMARKS.md) here")
    args = parser.parse_args(argv)
    args.runtimes = [r for r in args.runtimes.split(",") if r]
    unknown = sorted(set(args.runtimes) - set(RUNTIMES))
    if unknown:
        parser.error(f"unknown runtime(s) {unknown}; choose from {list(RUNTIMES)}")
    return args


def table_of_cases(
    cases: Iterable[Any],
    measure: Callable[[Any, Path], dict[str, Any]],
    header: Iterable[str],
    line: Callable[[Any, dict[str, Any]], str],
    json_path: Path | None = None,
) -> list[dict[str, Any]]:
    """``measure(case, folder)`` for every case (``folder`` a temporary one for its model files), each
    row printed as ``line(case, row)`` under the ``header`` lines as it comes; the rows also written to
    ``json_path`` as JSON when given. Returns the rows."""
    for text in header:
        print(text)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in cases:
            row = measure(case, Path(folder))
            rows.append(row)
            print(line(case, row), flush=True)
    if json_path is not None:
        json_path.write_text(json.dumps(rows, indent=1))
    return rows


def timed_session_runs(session: Any, feeds: dict[str, Any], runs: int, warmup: int = 2) -> list[float]:
    """Seconds of ``runs`` calls of ``session.run`` on ``feeds`` after ``warmup`` untimed ones (scripts
    that time one runtime's settings against each other, in one process)."""
    import time

    for _ in range(warmup):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return times


def fastest_seconds(call: Callable[[], object], repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls of ``call``, after one untimed call (BLAS's threads
    start, caches fill)."""
    import time

    call()
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def sgemm_gflops(threads: int, size: int = 1024, repeat: int = 5) -> float:
    """GFLOP/s of numpy's float32 ``size``^3 matmul on ``threads`` BLAS threads: the fastest of ``repeat``
    products (the sgemm roofline, or a reading of the machine's speed now)."""
    import numpy as np

    from hetflow.devices.cpu.threads import BLAS

    a = np.full((size, size), 0.5, dtype=np.float32)
    previous = BLAS.hold(threads)
    try:
        seconds = fastest_seconds(lambda: np.matmul(a, a), repeat)
    finally:
        BLAS.restore(previous)
    return 2 * size**3 / seconds / 1e9
