"""hetflow vs ONNX Runtime vs OpenVINO, side by side in one process, on the zoo models.

    python benchmarks/compare.py [--models alexnet,resnet50] [--batches 1,16] [--repeat 10]
                                 [--runtimes hetflow,ort,openvino] [--threads 2] [--calm-wait 120]
                                 [--json rows.json] [--markdown table.md]

Every runtime uses the same thread count (2 by default). OpenVINO compiles the ONNX file directly, with
the batch made static, f32 precision, CPU pinning off (on 2 cores pinning makes whole runs take 2x now
and then). lstm-gesture runs at batch 64 where the others run at 16. The runtime ``hetflow-parallel`` is
hetflow with ``execution_mode="parallel"`` (``hetflow`` is the default, sequential); ``hetflow-tuned`` is
hetflow with ``tune=True``: every layer's algorithm measured when its session is made (untimed), where
``hetflow`` takes the cost model's (``runners.py``: neither reads the user's tuning cache).

The machine's state: the VM's two vCPUs sometimes sit on separate L3 domains for seconds to minutes
(``hetflow.estimate.spells``), where work passing data between the cores slows, hetflow's more than its
peers' (ResNet-50 at batch 1: hetflow 40 -> 53 ms, ONNX Runtime 38 -> 41). Before each model the run
waits up to ``--calm-wait`` seconds for the cores to share their L3 (``CacheProbe``), probes again after
it, and marks a row measured with the L3 split at either end ("split" in the table's L3 column).

Timing protocol (``hetflow.bench.timing.side_by_side``, after NOTES.md): runtimes are interleaved per
repetition; before each timed call the runtime about to be timed runs untimed for >= 100 ms (or, when one
call is longer than that, the previous runtime's worker threads get 150 ms to stop spinning), so none pays
for another's spinning threads. Minimums are the stable statistic; medians are reported too. The effective rate is 2 * MACs / minimum
time, set against the sgemm roofline (numpy float32 2048^3 matmul, best of 5) measured in the same run.
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

DEFAULT_THREADS = 2
# NOTE: must be set before numpy (OpenBLAS) is imported; the session's threads option governs runs.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, str(DEFAULT_THREADS))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runners import LABELS, RUNNER_TYPES, parse_arguments, sgemm_gflops  # noqa: E402

import hetflow  # noqa: E402
from hetflow import zoo  # noqa: E402
from hetflow.bench.timing import side_by_side  # noqa: E402
from hetflow.estimate.spells import CacheProbe  # noqa: E402
from hetflow.ops.cost import total_macs  # noqa: E402
from hetflow.passes import bind_batch  # noqa: E402

#: Side of the float32 matmul whose GFLOP/s is the sgemm roofline the table's rates are read against.
ROOFLINE_SIDE = 2048
#: Models whose large batch is not 16.
LARGE_BATCH = {"lstm-gesture": 64}


# -- measurement -------------------------------------------------------------------------------
@dataclass
class Row:
    model: str
    batch: int
    gflop: float
    min_ms: dict[str, float]
    median_ms: dict[str, float]
    roofline_gflops: float
    #: Whether the cores shared their L3 before and after the model's timings (None: not probed).
    l3_shared: bool | None = None

    def ratio(self, peer: str, own: str = "hetflow") -> float | None:
        """``own``'s minimum / the peer's (below 1: ``own``, a hetflow runtime, is faster)."""
        if own not in self.min_ms or peer not in self.min_ms:
            return None
        return self.min_ms[own] / self.min_ms[peer]

    @property
    def hetflow_gflops(self) -> float | None:
        """Effective rate: 2 * MACs / hetflow's minimum time."""
        ms = self.min_ms.get("hetflow")
        return None if ms is None else self.gflop / (ms / 1e3)


def _feed(path: Path, batch: int) -> tuple[dict[str, np.ndarray], float]:
    """A seeded input of the model's shape at ``batch``, and the model's GFLOP at that batch."""
    session = hetflow.InferenceSession(path)
    value = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in value.shape]
    feed = {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    graph = bind_batch(session.graph, {d: batch for d in value.shape if isinstance(d, str)})
    return feed, 2 * total_macs(graph) / 1e9


def measure(name: str, batch: int, args: argparse.Namespace, roofline: float, probe: CacheProbe) -> Row:
    path = zoo.model_path(name)
    feed, gflop = _feed(path, batch)
    runners = {key: RUNNER_TYPES[key](path, feed, args.threads) for key in args.runtimes}
    for runner in runners.values():
        runner.run()  # plans made (hetflow-tuned measures its layers here), untimed
    shared_before = probe.wait_until_shared(args.calm_wait)  # None without two CPUs
    timings = side_by_side({key: runner.run for key, runner in runners.items()}, args.repeat)
    shared = None if shared_before is None else bool(shared_before and probe.shared())
    return Row(name, batch, gflop, {k: t.min_ms for k, t in timings.items()},
               {k: t.median_ms for k, t in timings.items()}, roofline, shared)


def _l3(row: Row) -> str:
    return "—" if row.l3_shared is None else ("shared" if row.l3_shared else "split")


# -- reporting ---------------------------------------------------------------------------------
def _number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio_pairs(runtimes: list[str]) -> list[tuple[str, str]]:
    """(hetflow runtime, peer) for every ratio column: each hetflow runtime against every other runtime,
    or, with ``hetflow`` and a peer runtime both there, each hetflow runtime against the peers only."""
    own = [r for r in runtimes if r.startswith("hetflow")]
    peers = [r for r in runtimes if not r.startswith("hetflow")]
    if not peers:
        return [("hetflow", r) for r in own if r != "hetflow" and "hetflow" in own]
    return [(o, p) for o in own for p in peers]


def markdown(rows: list[Row], runtimes: list[str]) -> str:
    pairs = _ratio_pairs(runtimes)
    header = ["model", "batch", "GFLOP"]
    for key in runtimes:
        header += [f"{LABELS[key]} min ms", f"{LABELS[key]} median ms"]
    header += [f"{LABELS[o]} / {LABELS[p]} (min)" for o, p in pairs]
    if "hetflow" in runtimes:
        header += ["hetflow GFLOP/s", "% of sgemm"]
    header.append("L3")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.model, str(row.batch), f"{row.gflop:.3f}"]
        for key in runtimes:
            cells += [_number(row.min_ms.get(key)), _number(row.median_ms.get(key))]
        cells += [_number(row.ratio(p, o)) for o, p in pairs]
        if "hetflow" in runtimes:
            rate = row.hetflow_gflops
            cells += [_number(rate, 1), _number(None if rate is None else 100 * rate / row.roofline_gflops, 0)]
        cells.append(_l3(row))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _progress_line(row: Row) -> str:
    parts = [f"{row.model:>14} b{row.batch:<3}"]
    parts += [f"{LABELS[k]} {v:9.2f} ms" for k, v in row.min_ms.items()]
    parts += [f"{LABELS[o]}/{LABELS[p]} {row.ratio(p, o):5.2f}" for o, p in _ratio_pairs(list(row.min_ms))]
    if row.hetflow_gflops is not None:
        parts.append(f"{row.hetflow_gflops:7.1f} GFLOP/s")
    parts.append(f"L3 {_l3(row)}")
    return "  ".join(parts)


def _environment(args: argparse.Namespace) -> str:
    versions = [f"numpy {np.__version__}", f"hetflow {hetflow.__version__}"]
    if "ort" in args.runtimes:
        import onnxruntime

        versions.append(f"onnxruntime {onnxruntime.__version__}")
    if "openvino" in args.runtimes:
        import openvino

        versions.append(f"openvino {openvino.__version__}")
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cpus, {', '.join(versions)}, "
            f"{args.threads} threads, {time.strftime('%Y-%m-%d')}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(e.name for e in zoo.list_models()))
    parser.add_argument("--batches", default="1,16", help="lstm-gesture's 16 becomes 64")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--calm-wait", type=float, default=120.0,
                        help="seconds to wait before each model for the cores to share their L3 (0: none)")
    return parse_arguments(parser, argv, DEFAULT_THREADS)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    environment = _environment(args)
    print(f"# {environment}", flush=True)
    roofline = sgemm_gflops(args.threads, ROOFLINE_SIDE)
    print(f"# sgemm roofline at start: {roofline:.1f} GFLOP/s", flush=True)
    rows = []
    probe = CacheProbe()
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            row = measure(name, LARGE_BATCH.get(name, batch) if batch == 16 else batch, args, roofline, probe)
            rows.append(row)
            print(_progress_line(row), flush=True)
    roofline_end = sgemm_gflops(args.threads, ROOFLINE_SIDE)
    best_roofline = max(roofline, roofline_end)
    for row in rows:
        row.roofline_gflops = best_roofline
    table = markdown(rows, args.runtimes)
    summary = (f"{environment}; sgemm roofline {best_roofline:.1f} GFLOP/s (start {roofline:.1f}, "
               f"end {roofline_end:.1f}); {args.repeat} interleaved repetitions")
    print(f"\n{summary}\n\n{table}")
    if args.markdown:
        args.markdown.write_text(f"{summary}\n\n{table}\n")
    if args.json:
        records = [asdict(r) | {"hetflow_gflops": r.hetflow_gflops} for r in rows]
        args.json.write_text(json.dumps({"environment": summary, "rows": records}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
