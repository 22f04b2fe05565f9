"""One training step of the mentee net (zoo) at batch 128: hetflow vs PyTorch CPU, side by side.

    python benchmarks/train_step.py [--model mentee] [--batch 128] [--repeat 10] [--threads 2] [--settle 0.2]
                                    [--json FILE]

Both frameworks train the same network from the same weights (the zoo's, copied into an equivalent
``torch.nn.Sequential`` built from hetflow's graph) on the same random CIFAR-10-shaped batch, with SGD
(momentum 0.9) and softmax cross-entropy on the logits. Each step is split into forward (with the loss),
backward and update; the frameworks are interleaved step by step after warm-up steps, with the same
thread count, and the table gives min and median per phase and the hetflow / PyTorch ratio of minimums.
PyTorch is a benchmark peer only (``pip install torch``); hetflow never imports it. Run on a quiet
machine: other processes on the cores make both sides slower by different amounts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_THREADS = 2
# NOTE: before numpy / torch are imported, so that OpenBLAS and OpenMP start with the chosen count.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, str(DEFAULT_THREADS))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetflow.bench.torch_peer import torch_train_step  # noqa: E402
from hetflow.train import SGD, Trainer  # noqa: E402

PHASES = ("forward", "backward", "update", "step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mentee", help="zoo model (a plain CNN chain) (mentee)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=10, help="timed steps per framework (10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per framework first (2)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument(
        "--settle", type=float, default=0.2, help="seconds of rest before each timed step (0.2): "
        "a peer's OpenMP or BLAS threads spin for a while after a call, on the cores the next step needs"
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()

    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    trainer = Trainer(f"zoo:{args.model}", optimizer=SGD(0.01, momentum=0.9))
    shape = [args.batch if isinstance(d, str) else d for d in trainer.graph.values[trainer.input_name].shape]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    torch_step = torch_train_step(
        trainer.graph, trainer.training.scores, x, y, lr=0.01, momentum=0.9, threads=args.threads
    )

    def hetflow_step(timings: dict[str, float]) -> float:
        loss, _ = trainer.train_step(x, y, timings)
        return loss

    steps = {"hetflow": hetflow_step, "pytorch": torch_step}
    first = {name: step({}) for name, step in steps.items()}
    print(f"step-0 loss: hetflow {first['hetflow']:.6f}, pytorch {first['pytorch']:.6f} (same weights)")
    for _ in range(args.warmup - 1):
        for step in steps.values():
            step({})
    samples = {name: {phase: [] for phase in PHASES} for name in steps}
    for _ in range(args.repeat):
        for name, step in steps.items():  # interleaved, so both see the same machine state
            timings: dict[str, float] = {}
            time.sleep(args.settle)  # the other framework's worker threads may still be spinning
            step(timings)
            timings["step"] = timings["forward"] + timings["backward"] + timings["update"]
            for phase in PHASES:
                samples[name][phase].append(timings[phase])

    rows = []
    print(f"{args.model} training step, batch {args.batch}, {args.threads} threads, {args.repeat} steps each")
    print(f"{'phase':<9} {'hetflow min':>12} {'median':>9} {'pytorch min':>12} {'median':>9} {'ratio':>7}")
    for phase in PHASES:
        ours, theirs = samples["hetflow"][phase], samples["pytorch"][phase]
        row = {
            "phase": phase,
            "hetflow_min_s": min(ours),
            "hetflow_median_s": float(np.median(ours)),
            "pytorch_min_s": min(theirs),
            "pytorch_median_s": float(np.median(theirs)),
            "ratio_of_minimums": min(ours) / min(theirs),
        }
        rows.append(row)
        print(
            f"{phase:<9} {row['hetflow_min_s'] * 1e3:10.1f}ms {row['hetflow_median_s'] * 1e3:7.1f}ms "
            f"{row['pytorch_min_s'] * 1e3:10.1f}ms {row['pytorch_median_s'] * 1e3:7.1f}ms "
            f"{row['ratio_of_minimums']:7.2f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"model": args.model, "batch": args.batch, "threads": args.threads, "rows": rows}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
