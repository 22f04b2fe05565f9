"""A batch of each zoo model on the spinning pool vs on hetflow's own (Python-pool) threads, in one
process, alternating: what ``executor.BATCHES_SPIN`` does.

Usage: python benchmarks/batch_threads.py [--models squeezenet,shufflenet] [--batch 16] [--alternations 3]
                                          [--runs 4] [--threads 2]

With ``BATCHES_SPIN`` every batch spins, as one example does; without it a batch from
``executor.OWN_THREADS_MIN_CONV_MACS`` Conv multiply-adds splits on hetflow's own threads ("own"; smaller
ones spin either way). Each alternation times ``--runs`` calls of each setting after two warm-up calls;
the script prints each setting's minimum and median and the ratio of minimums (spin / own).
"""

from __future__ import annotations

import argparse

import numpy as np
from runners import timed_session_runs

import hetflow
from hetflow.runtime import executor

MODELS = "squeezenet,shufflenet,mobilenetv2,googlenet,inception_v2,resnet50,densenet121,alexnet,zfnet512,vgg19"
def compare(model: str, batch: int, threads: int, alternations: int, runs: int) -> dict[str, list[float]]:
    """Run times of ``model`` at ``batch`` per setting ("own", "spin"), alternating."""
    session = hetflow.InferenceSession(f"zoo:{model}", threads=threads)
    arg = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in arg.shape]
    feeds = {arg.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    default = executor.BATCHES_SPIN
    times: dict[str, list[float]] = {"own": [], "spin": []}
    try:
        for _ in range(alternations):
            for setting in times:
                executor.BATCHES_SPIN = setting == "spin"
                times[setting] += timed_session_runs(session, feeds, runs)
    finally:
        executor.BATCHES_SPIN = default
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--alternations", type=int, default=3)
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    print(f"batch {args.batch}, {args.threads} threads, {args.alternations} alternations x {args.runs} runs")
    for model in args.models.split(","):
        times = compare(model, args.batch, args.threads, args.alternations, args.runs)
        cells = [f"{name} min {min(v) * 1e3:9.2f} med {np.median(v) * 1e3:9.2f} ms" for name, v in times.items()]
        ratio = min(times["spin"]) / min(times["own"])
        print(f"{model:<14} " + " | ".join(cells) + f" | spin / own {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
