"""Per-layer algorithms by measurement (``hetflow tune``) against the cost model's, side by side.

    python benchmarks/tuned_vs_cost_model.py [--models inception_v2,resnet50] [--batches 1,16]
                                             [--repeat 10] [--effort fast] [--json F] [--markdown F]

For every model and batch: every Conv layer's candidates are measured into a fresh tuning cache, in the
thread arrangement the model's run holds (``hetflow.tuning.select.tune_graph``); then two sessions of the
same model run interleaved in this process (``hetflow.bench.timing.side_by_side``): one planned from that
cache, one from the cost model alone (an empty cache). Reports what the tuning table predicted (the sum of
the chosen candidates' times against the cost model's) and the whole runs' min / median and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hetflow  # noqa: E402
from hetflow import zoo  # noqa: E402
from hetflow.bench.timing import side_by_side  # noqa: E402
from hetflow.devices.cpu import CPUDevice  # noqa: E402
from hetflow.options import HOME_ENV  # noqa: E402
from hetflow.passes import bind_batch  # noqa: E402
from hetflow.tuning.measure import EFFORTS  # noqa: E402
from hetflow.tuning.select import Tuner, tune_graph  # noqa: E402


@dataclass
class Row:
    model: str
    batch: int
    layers: int
    changed: int
    table_tuned_ms: float
    table_cost_model_ms: float
    tuned_min_ms: float
    tuned_median_ms: float
    cost_model_min_ms: float
    cost_model_median_ms: float

    @property
    def ratio(self) -> float:
        return self.tuned_min_ms / self.cost_model_min_ms


def _session(path: Path, home: Path, feed: dict[str, np.ndarray], threads: int) -> hetflow.InferenceSession:
    """A session whose plan for ``feed``'s batch is made reading the tuning cache under ``home``."""
    previous = os.environ.get(HOME_ENV)
    os.environ[HOME_ENV] = str(home)
    try:
        session = hetflow.InferenceSession(path, threads=threads)
        session.run(None, feed)  # plans for this batch (the cache is read here)
    finally:
        if previous is None:
            os.environ.pop(HOME_ENV, None)
        else:
            os.environ[HOME_ENV] = previous
    return session


def measure(name: str, batch: int, args: argparse.Namespace, scratch: Path) -> Row:
    path = zoo.model_path(name)
    probe = hetflow.InferenceSession(path, threads=args.threads)
    value = probe.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in value.shape]
    feed = {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    bound = bind_batch(probe.graph, {d: batch for d in value.shape if isinstance(d, str)})
    tuned_home, empty_home = scratch / f"{name}-{batch}", scratch / "empty"
    tuner = Tuner(tune=True, options=EFFORTS[args.effort], path=tuned_home / "tuning" / "records.jsonl")
    layers = tune_graph(bound, CPUDevice(), tuner, threads=args.threads)
    chosen = sum(layer.record.candidates[layer.record.chosen] for layer in layers)
    default = sum(layer.record.candidates.get(layer.heuristic, layer.record.candidates[layer.record.chosen])
                  for layer in layers)
    sessions = {
        "tuned": _session(path, tuned_home, feed, args.threads),
        "cost model": _session(path, empty_home, feed, args.threads),
    }
    timings = side_by_side({label: (lambda s=s: s.run(None, feed)) for label, s in sessions.items()}, args.repeat)
    return Row(
        name, batch, len(layers), sum(layer.record.chosen != layer.heuristic for layer in layers),
        chosen * 1e3, default * 1e3,
        timings["tuned"].min_ms, timings["tuned"].median_ms,
        timings["cost model"].min_ms, timings["cost model"].median_ms,
    )


def markdown(rows: list[Row]) -> str:
    lines = [
        "| model | batch | layers | changed | table: tuned / cost model ms | tuned min / median ms "
        "| cost model min / median ms | tuned / cost model (min) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.batch} | {r.layers} | {r.changed} | {r.table_tuned_ms:.2f} / {r.table_cost_model_ms:.2f} "
            f"| {r.tuned_min_ms:.2f} / {r.tuned_median_ms:.2f} | {r.cost_model_min_ms:.2f} / "
            f"{r.cost_model_median_ms:.2f} | {r.ratio:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="inception_v2,resnet50,googlenet")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--effort", choices=sorted(EFFORTS), default="fast")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hetflow-tuned-") as scratch:
        for name in args.models.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                row = measure(name, batch, args, Path(scratch))
                print(f"{name:14s} b{batch:<3d} changed {row.changed:2d}/{row.layers:<3d} table "
                      f"{row.table_tuned_ms:8.2f} / {row.table_cost_model_ms:8.2f} ms   runs {row.tuned_min_ms:8.2f}"
                      f" / {row.cost_model_min_ms:8.2f} ms   ratio {row.ratio:.3f}", flush=True)
                rows.append(row)
    table = markdown(rows)
    print(table)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) | {"ratio": r.ratio} for r in rows], indent=1))
    if args.markdown:
        args.markdown.write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
