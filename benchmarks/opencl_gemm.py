"""OpenCL GEMM vs numpy's sgemm: GFLOP/s of square products, kernel alone and end to end.

Usage: python benchmarks/opencl_gemm.py [--sizes 256,512,1024] [--configs "rm=4,rn=3" ...] [--reps 5]
       [--device N]
       python benchmarks/opencl_gemm.py --sizes 1024,2048 --effort fast   (tuned vs default vs numpy)

Kernel alone: operands packed on the device once, the kernel enqueued and the queue finished per
repetition. End to end: ``run_gemm`` from numpy inputs to a numpy result (packing, buffers, map), what a
session pays today. numpy runs interleaved with both, each after an untimed warm-up, and every figure
is the minimum over the repetitions (the machine may be shared). With ``--effort`` each size is first
searched by the GEMM tuner (``hetflow.devices.opencl.tuning.search``, nothing written to the cache) and
its best configuration is timed beside the default.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from hetflow.devices.opencl import OpenCLDevice, get_opencl_device
from hetflow.devices.opencl.kernels.gemm import (
    DEFAULT_CONFIG,
    GemmConfig,
    default_config,
    prepare_gemm,
    run_gemm,
)


def _parse_config(text: str) -> GemmConfig:
    fields = dict(item.split("=") for item in text.split(",") if item)
    return GemmConfig(**{key: int(value) for key, value in fields.items()})


def _timed(fn: Callable[[], object], warm_seconds: float = 0.1) -> float:
    """One timed call of ``fn`` after running it untimed for ``warm_seconds`` (another runtime's worker
    threads may still spin for about 0.1 s after its last call and steal a core)."""
    deadline = time.perf_counter() + warm_seconds
    while time.perf_counter() < deadline:
        fn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _measure(device: OpenCLDevice, a: np.ndarray, b: np.ndarray, config: GemmConfig, reps: int) -> str:
    launch = prepare_gemm(device, a, b, config=config)

    def kernel_only() -> None:
        launch.enqueue()
        device.synchronize()

    contenders = {
        "kernel": kernel_only,
        "end2end": lambda: run_gemm(device, a, b, config=config),
        "numpy": lambda: a[0] @ b[0],
    }
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(reps):  # interleaved: each round times every contender once
        for name, fn in contenders.items():
            best[name] = min(best[name], _timed(fn))
    err = float(np.abs(run_gemm(device, a, b, config=config)[0] - a[0] @ b[0]).max())
    flops = 2.0 * a.shape[1] * a.shape[2] * b.shape[2]
    label = ",".join(f"{k}={v}" for k, v in vars(config).items())
    rates = [flops / best[name] / 1e9 for name in contenders]
    return (
        f"{a.shape[1]:>5} {label:<46} {rates[0]:>8.1f} {rates[1]:>8.1f} {rates[2]:>8.1f} "
        f"{rates[0] / rates[2]:>11.0%}  (max err {err:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="256,512,1024")
    parser.add_argument("--configs", nargs="*", default=[])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--effort", choices=("fast", "full"), help="also time the tuner's best configuration")
    parser.add_argument("--device", type=int, default=0, help="OpenCL device index (0)")
    args = parser.parse_args()
    device = get_opencl_device(args.device)
    named = [_parse_config(c) for c in args.configs]
    print(f"device: {device.name()} ({device.fingerprint()['platform']})")
    print(f"{'n':>5} {'config':<46} {'kernel':>8} {'end2end':>8} {'numpy':>8} {'kernel/numpy':>12}")
    rng = np.random.default_rng(0)
    for n in (int(s) for s in args.sizes.split(",")):
        a = rng.standard_normal((1, n, n)).astype(np.float32)
        b = rng.standard_normal((1, n, n)).astype(np.float32)
        # The CPU default and the device's own for this size (they differ on a GPU), unless named.
        configs = named or list(dict.fromkeys([DEFAULT_CONFIG, default_config(device, n, n)]))
        tuned = []
        if args.effort:
            from hetflow.devices.opencl.tuning import parse_label, search

            record = search(device, n, n, n, 1, args.effort)
            tuned = [parse_label(record.chosen)]
            print(f"{n:>5} tuner tried {len(record.candidates)} configurations", flush=True)
        for config in [*configs, *(c for c in tuned if c not in configs)]:
            print(_measure(device, a, b, config, args.reps), flush=True)


if __name__ == "__main__":
    main()
