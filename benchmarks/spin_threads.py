"""Spinning runs (one example through a small convolutional network) with their threads capped at
``executor.SPIN_MAX_THREADS`` vs uncapped, at several session thread counts, in one process.

Usage: python benchmarks/spin_threads.py [--threads 16,8] [--cap 4] [--alternations 10]

A diagnostic for many-core machines (the 2-core VM cannot show it): each case is timed in alternations of
the two settings (3 warm-up runs, then the minimum of 5), and the script prints the minimum and the median
of those minimums. The H100 session's 16-core host found single 1x1 layers at batch 1 running 16-24 ms a
run uncapped at 16 threads (``benchmarks/results/2026-11-24-h100/spin_cap.txt``).
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from runners import timed_session_runs

import hetflow
from hetflow.runtime import executor

UNCAPPED = 1 << 10


def pointwise_layer(channels: int, size: int, kernels: int) -> onnx.ModelProto:
    """One 1x1 Conv on a ``[1, channels, size, size]`` input, seeded weights."""
    w = np.random.default_rng(0).standard_normal((kernels, channels, 1, 1)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])], "pointwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


CASES: dict[str, str | onnx.ModelProto] = {
    "lenet": "zoo:lenet",
    "cifar10-quick": "zoo:cifar10-quick",
    "mentee": "zoo:mentee",
    "832x6x6->256 1x1": pointwise_layer(832, 6, 256),
    "528x13x13->256 1x1": pointwise_layer(528, 13, 256),
}


def fastest_of(session: hetflow.InferenceSession, feeds: dict[str, np.ndarray], runs: int = 5) -> float:
    return min(timed_session_runs(session, feeds, runs, warmup=3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="16,8", help="session thread counts (16,8)")
    parser.add_argument("--cap", type=int, default=executor.SPIN_MAX_THREADS, help="the capped setting")
    parser.add_argument("--alternations", type=int, default=10)
    args = parser.parse_args()
    for label, source in CASES.items():
        for threads in (int(t) for t in args.threads.split(",")):
            session = hetflow.InferenceSession(source, threads=threads)
            arg = session.get_inputs()[0]
            shape = [1 if isinstance(d, str) else d for d in arg.shape]
            feeds = {arg.name: np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
            best: dict[int, list[float]] = {UNCAPPED: [], args.cap: []}
            for _ in range(args.alternations):
                for cap in best:
                    executor.SPIN_MAX_THREADS = cap
                    best[cap].append(fastest_of(session, feeds))
            cells = [f"{name} min {min(v) * 1e3:.3f} med {np.median(v) * 1e3:.3f} ms"
                     for name, v in (("uncapped", best[UNCAPPED]), (f"cap {args.cap}", best[args.cap]))]  # fmt: skip
            print(f"{label:<20} threads={threads:>2}: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
