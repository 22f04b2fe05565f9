"""Is the machine in a slow spell? hetflow and ONNX Runtime on one model, round after round, beside
numpy's sgemm on one thread and on every core.

A shared VM's second vCPU is sometimes slower for seconds to minutes at a time: on the Zen 4 VM
(2026-12-05) numpy's two-thread sgemm dropped from ~210 to 171-184 GFLOP/s while its one-thread rate
held at ~104, and a network whose every layer splits over both cores (ShuffleNet at batch 1) ran twice
as long on hetflow and on ONNX Runtime alike. Each round here prints both runtimes' fastest run over
``--seconds`` and the two sgemm readings, so a spell shows as all of them moving together, and a
runtime's own regression as one moving alone. The last column is the spell gauge calibration reads (a
small spinning 1x1 Conv, ``hetflow.estimate.spells``): 230-265 us calm, 630-730 in the spells of
2026-12-06.

Usage::

    python benchmarks/slow_spells.py                          # shufflenet at batch 1, 12 rounds
    python benchmarks/slow_spells.py --model squeezenet --batch 16 --rounds 20
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runners import HetflowRunner, OrtRunner, Runner, sgemm_gflops  # noqa: E402

from hetflow import InferenceSession, zoo  # noqa: E402
from hetflow.devices.cpu.threads import available_cores  # noqa: E402
from hetflow.estimate.spells import SpellGauge  # noqa: E402
from hetflow.estimate.validate import random_feeds  # noqa: E402

#: Side of the sgemm that reads the machine's speed.
SGEMM_SIDE = 1024
#: Seconds a runtime rests between rounds, so that neither times the other's spinning workers.
SETTLE_SECONDS = 0.15


def fastest_run(runner: Runner, seconds: float) -> float:
    """Milliseconds of the fastest of the runs made in about ``seconds`` (at least three), after one."""
    runner.run()
    best, spent, runs = float("inf"), 0.0, 0
    while spent < seconds or runs < 3:
        started = time.perf_counter()
        runner.run()
        elapsed = time.perf_counter() - started
        best, spent, runs = min(best, elapsed), spent + elapsed, runs + 1
    return best * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="shufflenet", help="a zoo model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=0.3, help="time each runtime runs a round")
    args = parser.parse_args()

    threads = available_cores()
    path = zoo.model_path(args.model)
    feed = random_feeds(InferenceSession(path), args.batch)
    runners = {"hetflow": HetflowRunner(path, feed, threads), "ORT": OrtRunner(path, feed, threads)}
    gauge = SpellGauge(threads)
    print(f"{args.model} at batch {args.batch}, {threads} threads each; fastest run per round (ms), "
          f"sgemm {SGEMM_SIDE}^3 (GFLOP/s), the spell gauge's layer (us; hetflow.estimate.spells)")
    print(f"{'round':>5} {'hetflow':>9} {'ORT':>9} {'ratio':>6} {'sgemm 1t':>9} {f'sgemm {threads}t':>9} {'gauge':>7}")
    for index in range(1, args.rounds + 1):
        times = {}
        for name, runner in runners.items():
            times[name] = fastest_run(runner, args.seconds)
            time.sleep(SETTLE_SECONDS)
        one, every = sgemm_gflops(1, SGEMM_SIDE), sgemm_gflops(threads, SGEMM_SIDE)
        time.sleep(SETTLE_SECONDS)  # OpenBLAS's workers would read as a spell
        layer = gauge.read()
        print(f"{index:>5} {times['hetflow']:>9.2f} {times['ORT']:>9.2f} {times['hetflow'] / times['ORT']:>6.2f} "
              f"{one:>9.0f} {every:>9.0f} {layer * 1e6:>7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
