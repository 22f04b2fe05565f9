"""hetflow and ONNX Runtime on one model with the VM's two cores sharing their L3 and with it split.

    python benchmarks/core_states.py [--model resnet50] [--batch 1] [--seconds 120] [--runs 4]

The VM's two vCPUs sometimes sit on separate L3 domains for seconds to minutes (``hetflow.estimate.spells``):
then a core reads what the other wrote at memory speed, and work that passes data between the cores slows.
This runs hetflow and ONNX Runtime with two threads and with one, in alternating blocks of ``--runs``
runs for ``--seconds``, probes the cores (``CacheProbe``) before and after each round of blocks, and
reports each runtime's minimum and median block in either state (rounds whose two probes disagree are
dropped). One thread's times show the cores themselves run alike in both states.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "2")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runners import fastest_seconds  # noqa: E402

import hetflow  # noqa: E402
from hetflow import zoo  # noqa: E402
from hetflow.estimate.spells import CacheProbe  # noqa: E402


def _runners(model: str, batch: int) -> dict[str, Callable[[], object]]:
    """hetflow and ONNX Runtime at two threads and one, each a call that runs the model once."""
    import onnxruntime as ort

    path = zoo.model_path(model)
    value = hetflow.InferenceSession(path).get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in value.shape]
    feed = {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    runners: dict[str, Callable[[], object]] = {}
    for threads in (2, 1):
        session = hetflow.InferenceSession(path, threads=threads)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        runners[f"hetflow {threads}T"] = lambda s=session: s.run(None, feed)
        runners[f"ORT {threads}T"] = lambda s=peer: s.run(None, feed)
    return runners


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args(argv)
    probe = CacheProbe()
    if not probe.available:
        print("needs two CPUs")
        return 1
    runners = _runners(args.model, args.batch)
    for call in runners.values():
        fastest_seconds(call, 2)
    blocks: dict[str, dict[str, list[float]]] = {"shared": defaultdict(list), "split": defaultdict(list)}
    deadline = time.time() + args.seconds
    while time.time() < deadline:
        before = probe.shared()
        times = {label: fastest_seconds(call, args.runs) for label, call in runners.items()}
        if probe.shared() == before:
            for label, seconds in times.items():
                blocks["shared" if before else "split"][label].append(seconds)
    print(f"{args.model} at batch {args.batch}, blocks of {args.runs} runs, {time.strftime('%Y-%m-%d')}")
    for state, by_label in blocks.items():
        if not by_label:
            print(f"  L3 {state}: no round")
            continue
        count = len(next(iter(by_label.values())))
        cells = [f"{label} {min(v) * 1e3:.2f} / {statistics.median(v) * 1e3:.2f}" for label, v in by_label.items()]
        print(f"  L3 {state:6s} ({count:3d} rounds), min / median ms: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
