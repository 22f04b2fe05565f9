"""Two versions of hetflow on one model, in alternating processes: what a change did, on a noisy machine.

    git worktree add /tmp/before <commit>
    python benchmarks/ab.py /tmp/before . --model lstm-gesture --batch 64 [--rounds 2] [--runs 10]

Each round runs every tree once, in turn, each in a fresh process (its own imports, compiled-kernel
cache, BLAS threads), timing ``--runs`` calls of ``session.run`` after three warm-up calls. Rounds
alternate the trees so that a slow spell of the VM falls on both. Reports each tree's minimum and median
over all its runs and the ratio of minimums (NOTES.md: on this VM minimums move ~3.5% between runs,
medians up to 44%).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

#: Run in the child: time ``runs`` calls of one model and print their seconds as JSON.
CHILD = """
import json, sys, time
tree, model, batch, runs, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, tree)  # ahead of the working directory and of an editable install
import numpy as np
import hetflow
assert hetflow.__file__.startswith(tree), f"imported {hetflow.__file__}, not the tree {tree}"
session = hetflow.InferenceSession(f"zoo:{model}", threads=threads)
feed = session.get_inputs()[0]
shape = [batch if isinstance(d, str) else d for d in feed.shape]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
for _ in range(3):
    session.run(None, {feed.name: x})
times = []
for _ in range(runs):
    start = time.perf_counter()
    session.run(None, {feed.name: x})
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def time_tree(tree: Path, model: str, batch: int, runs: int, threads: int) -> list[float]:
    """Seconds of ``runs`` calls of ``model`` with hetflow imported from ``tree``, in a fresh process."""
    args = [sys.executable, "-c", CHILD, str(tree), model, str(batch), str(runs), str(threads)]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the run from {tree} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="source tree of the first version (a git worktree)")
    parser.add_argument("after", type=Path, help="source tree of the second version")
    parser.add_argument("--model", default="lstm-gesture", help="zoo model (lstm-gesture)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="alternations of the two trees (2)")
    parser.add_argument("--runs", type=int, default=10, help="timed calls per process (10)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    samples: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            samples[name].extend(time_tree(tree, args.model, args.batch, args.runs, args.threads))
    print(f"{args.model} batch {args.batch}, {args.threads} threads, {args.rounds} rounds x {args.runs} runs")
    for name, times in samples.items():
        ordered = sorted(times)
        print(f"  {name:<7} {trees[name]}  min {ordered[0] * 1e3:9.2f} ms  median {ordered[len(ordered) // 2] * 1e3:9.2f} ms")
    print(f"  after / before (min): {min(samples['after']) / min(samples['before']):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
