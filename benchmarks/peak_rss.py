"""Peak resident memory of hetflow, ONNX Runtime and OpenVINO on the zoo models, each in a process of its own.

    python benchmarks/peak_rss.py [--models resnet50,densenet121] [--batches 1,16] [--runs 5]
                                  [--runtimes hetflow,ort,openvino] [--threads 2]
                                  [--json rows.json] [--markdown table.md]

Issue 3 asks that a run's peak RSS be no higher than ONNX Runtime's for the same model. Every (model,
batch, runtime) gets a fresh Python process that imports numpy and that runtime only (not hetflow, for a
peer), makes a session on the zoo model's file, runs it ``--runs`` times on a seeded input and reports
its peak RSS (VmHWM) three times: after the imports, after the session is made, and after the runs (the peak of
the whole process). The runtimes' order alternates from one model to the next. lstm-gesture's large batch
is 64 where the others' is 16, as in ``compare.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from runners import LABELS, RUNNER_TYPES, parse_arguments

DEFAULT_THREADS = 2
LARGE_BATCH = {"lstm-gesture": 64}
PEERS = ("ort", "openvino")
#: The module each runtime imports, loaded before the first reading.
MODULES = {
    "hetflow": "hetflow", "hetflow-parallel": "hetflow", "hetflow-tuned": "hetflow", "ort": "onnxruntime",
    "openvino": "openvino", "hetflow-lite": "hetflow_lite",
}


def _peak_mib() -> float:
    """This process's peak resident set so far: VmHWM, in KiB. (Not ``ru_maxrss``: Linux carries it over
    an exec, so a child started from this script would report at least the parent's size.)"""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def child(runtime: str, path: str, spec: list[object], runs: int, threads: int) -> dict[str, float]:
    """In the measured process: import, make the session, run; the peak RSS after each step."""
    import importlib

    import numpy as np

    importlib.import_module(MODULES[runtime])
    feed_name, dims = spec[0], spec[1:]
    feed = {str(feed_name): np.random.default_rng(0).standard_normal(dims).astype(np.float32)}
    imported = _peak_mib()
    runner = RUNNER_TYPES[runtime](Path(path), feed, threads)
    loaded = _peak_mib()
    for _ in range(runs):
        runner.run()
    return {"import_mib": imported, "session_mib": loaded, "peak_mib": _peak_mib()}


@dataclass
class Row:
    model: str
    batch: int
    import_mib: dict[str, float]
    session_mib: dict[str, float]
    peak_mib: dict[str, float]

    def ratio(self, peer: str, ours: str = "hetflow") -> float | None:
        """``ours``' peak / the peer's (at most 1: the target met)."""
        if ours not in self.peak_mib or peer not in self.peak_mib:
            return None
        return self.peak_mib[ours] / self.peak_mib[peer]


def _feed_spec(path: Path, batch: int) -> list[object]:
    """[input name, *dims] of the model's first graph input with its symbolic batch set to ``batch``."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    value = next(v for v in model.graph.input if v.name not in initializers)
    dims = [d.dim_value if d.HasField("dim_value") else batch for d in value.type.tensor_type.shape.dim]
    return [value.name, *dims]


def measure_one(runtime: str, path: Path, spec: list[object], args: argparse.Namespace) -> dict[str, float]:
    """Run ``child`` in a fresh interpreter and read back its JSON line."""
    environment = os.environ | {v: str(args.threads) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    command = [sys.executable, __file__, "--child", runtime, str(path), json.dumps(spec), str(args.runs),
               str(args.threads)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=environment, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{runtime} on {path.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(name: str, batch: int, order: list[str], args: argparse.Namespace) -> Row:
    from hetflow import zoo

    path = zoo.model_path(name)
    spec = _feed_spec(path, batch)
    results = {}
    for runtime in order:
        try:
            results[runtime] = measure_one(runtime, path, spec, args)
        except RuntimeError as error:  # one runtime that cannot run the model leaves its cells empty
            print(f"  {LABELS[runtime]} on {name} b{batch}: {str(error).strip().splitlines()[-1]}", flush=True)
    runtimes = [r for r in args.runtimes if r in results]
    return Row(name, batch, *({r: results[r][key] for r in runtimes} for key in ("import_mib", "session_mib", "peak_mib")))


def markdown(rows: list[Row], runtimes: list[str]) -> str:
    peers = [p for p in runtimes if p in PEERS]
    ours = [r for r in runtimes if r not in PEERS]
    header = ["model", "batch"]
    header += [f"{LABELS[r]} peak MiB (import, session)" for r in runtimes]
    header += [f"{LABELS[o]} / {LABELS[p]}" for o in ours for p in peers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.model, str(row.batch)]
        cells += [f"{row.peak_mib[r]:.0f} ({row.import_mib[r]:.0f}, {row.session_mib[r]:.0f})"
                  if r in row.peak_mib else "-" for r in runtimes]  # fmt: skip
        cells += [f"{row.ratio(p, o):.2f}" if row.ratio(p, o) else "-" for o in ours for p in peers]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="squeezenet,mobilenetv2,shufflenet,googlenet,inception_v2,resnet50,"
                        "densenet121,alexnet,zfnet512,vgg19")  # fmt: skip
    parser.add_argument("--batches", default="1")
    parser.add_argument("--runs", type=int, default=5)
    return parse_arguments(parser, argv, DEFAULT_THREADS)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    summary = (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cpus, {args.threads} threads, "
               f"{args.runs} runs per process, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"# {summary}", flush=True)
    rows = []
    for index, name in enumerate(args.models.split(",")):
        # Alternate which runtime goes first, so none always meets a colder page cache.
        order = args.runtimes if index % 2 == 0 else args.runtimes[::-1]
        for batch in (int(b) for b in args.batches.split(",")):
            row = measure(name, LARGE_BATCH.get(name, batch) if batch == 16 else batch, order, args)
            rows.append(row)
            ratios = "  ".join(f"{LABELS[o]}/{LABELS[p]} {row.ratio(p, o):.2f}" for o in args.runtimes for p in PEERS
                               if o not in PEERS and row.ratio(p, o))  # fmt: skip
            peaks = "  ".join(f"{LABELS[r]} {v:7.1f}" for r, v in row.peak_mib.items())
            print(f"{name:>14} b{row.batch:<3} peak MiB  {peaks}  {ratios}", flush=True)
    table = markdown(rows, args.runtimes)
    print(f"\n{summary}\n\n{table}")
    if args.markdown:
        args.markdown.write_text(f"{summary}\n\n{table}\n")
    if args.json:
        args.json.write_text(json.dumps({"environment": summary, "rows": [asdict(r) for r in rows]}, indent=2))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        runtime, path, spec, runs, threads = sys.argv[2:7]
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        print(json.dumps(child(runtime, path, json.loads(spec), int(runs), int(threads))))
        sys.exit(0)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
