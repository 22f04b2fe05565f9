"""hetflow vs ONNX Runtime, side by side in one process, on every zoo model.

    python benchmarks/compare.py [--models alexnet,resnet50] [--batches 1,16] [--repeat 10]
                                 [--json results.json]

Both runtimes use 2 threads. Timing protocol (see NOTES.md): runtimes are interleaved per repetition;
before each timed call the runtime about to be timed runs untimed for >= 100 ms (or, when one call is
longer than that, the previous runtime's worker threads get 150 ms to stop spinning), so neither pays
for the other's spinning threads. Minimums are the stable statistic; medians are reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

THREADS = 2
# NOTE: must be set before numpy (OpenBLAS) is imported.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, str(THREADS))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hetflow  # noqa: E402
from hetflow import zoo  # noqa: E402
from hetflow.ops.cost import total_macs  # noqa: E402
from hetflow.passes import bind_batch  # noqa: E402


@dataclass
class Row:
    model: str
    batch: int
    gflop: float
    hetflow_min_ms: float
    hetflow_median_ms: float
    ort_min_ms: float
    ort_median_ms: float

    @property
    def ratio_min(self) -> float:
        """hetflow time / ONNX Runtime time (below 1: hetflow is faster)."""
        return self.hetflow_min_ms / self.ort_min_ms


def _ort_session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _warm(run, last_seconds: float) -> None:
    if last_seconds > 0.1:
        time.sleep(0.15)
        return
    deadline = time.perf_counter() + 0.1
    while time.perf_counter() < deadline:
        run()


def measure(name: str, batch: int, repeat: int) -> Row:
    path = zoo.model_path(name)
    session = hetflow.InferenceSession(path)
    ort_session = _ort_session(path)
    input_arg = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in input_arg.shape]
    feed = {input_arg.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    graph = bind_batch(session.graph, {d: batch for d in input_arg.shape if isinstance(d, str)})
    gflop = 2 * total_macs(graph) / 1e9

    runners = {"hetflow": lambda: session.run(None, feed), "ort": lambda: ort_session.run(None, feed)}
    times: dict[str, list[float]] = {key: [] for key in runners}
    last = {key: 0.0 for key in runners}
    for _ in range(repeat):
        for key, run in runners.items():
            _warm(run, last[key])
            started = time.perf_counter()
            run()
            last[key] = time.perf_counter() - started
            times[key].append(last[key])
    ms = {key: np.array(values) * 1e3 for key, values in times.items()}
    return Row(name, batch, gflop, float(ms["hetflow"].min()), float(np.median(ms["hetflow"])),
               float(ms["ort"].min()), float(np.median(ms["ort"])))


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | batch | GFLOP | hetflow min ms | hetflow median ms | ORT min ms | ORT median ms | ratio (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.batch} | {r.gflop:.3f} | {r.hetflow_min_ms:.2f} | {r.hetflow_median_ms:.2f} "
            f"| {r.ort_min_ms:.2f} | {r.ort_median_ms:.2f} | {r.ratio_min:.2f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(e.name for e in zoo.list_models()))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()

    import onnxruntime

    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, numpy {np.__version__}, "
          f"onnxruntime {onnxruntime.__version__}, hetflow {hetflow.__version__}, {THREADS} threads, "
          f"{time.strftime('%Y-%m-%d')}", flush=True)
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            row = measure(name, batch, args.repeat)
            rows.append(row)
            print(f"{name:>14} b{batch:<3} hetflow {row.hetflow_min_ms:9.2f} ms  ORT {row.ort_min_ms:9.2f} ms"
                  f"  ratio {row.ratio_min:5.2f}", flush=True)
    print()
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"ratio_min": r.ratio_min} for r in rows], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
