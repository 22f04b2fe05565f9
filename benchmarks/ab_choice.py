"""One cost-model rule on and off, on one model, in one process: what a choice of algorithms is worth in
whole runs.

    python benchmarks/ab_choice.py --model squeezenet --off _direct_pointwise [--batch 1] [--runs 400]

``--off NAME`` names a predicate of ``hetflow.ops.conv`` (``_direct_pointwise``,
``_direct_takes_strided``): session A is planned with it returning False, session B as the code stands.
The two sessions then run in alternating blocks of ``BLOCK`` runs (each block after one untimed run, so
that neither session's first run after the other's pays for the caches the other took), and each
block keeps its fastest run. Reports both sessions' minimum and median block and the median ratio of
neighbouring blocks, which a slow spell of the VM moves far less than it moves either session's
times (``benchmarks/ab.py`` compares two trees in alternating processes instead).

The tuning cache is not read (a fresh ``HETFLOW_HOME``), so both plans are the cost model's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from runners import timed_session_runs

#: Runs per block; a block's fastest run stands for it.
BLOCK = 10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a zoo model name")
    parser.add_argument("--off", required=True, help="a predicate of hetflow.ops.conv that session A runs without")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=400, help="timed runs per session")
    args = parser.parse_args()
    os.environ["HETFLOW_HOME"] = tempfile.mkdtemp(prefix="hetflow-ab-")

    import hetflow.ops.conv as conv
    from hetflow import InferenceSession
    from hetflow.estimate.validate import random_feeds

    rule = getattr(conv, args.off, None)
    if not callable(rule):
        parser.error(f"hetflow.ops.conv has no predicate {args.off!r}")

    def planned(enabled: bool) -> tuple[InferenceSession, dict]:
        setattr(conv, args.off, rule if enabled else lambda *_, **__: False)
        try:
            session = InferenceSession(f"zoo:{args.model}")
            feeds = random_feeds(session, args.batch)
            session.run(None, feeds)  # plans with the rule as set, builds, captures
        finally:
            setattr(conv, args.off, rule)
        return session, feeds

    without, with_rule = planned(False), planned(True)
    blocks: dict[bool, list[float]] = {False: [], True: []}
    for index in range(max(args.runs // BLOCK, 1)):
        for enabled in (False, True) if index % 2 == 0 else (True, False):
            session, feeds = with_rule if enabled else without
            blocks[enabled].append(min(timed_session_runs(session, feeds, BLOCK, warmup=1)) * 1e3)
    off, on = np.array(blocks[False]), np.array(blocks[True])
    print(f"{args.model} batch {args.batch}, {len(off)} blocks of {BLOCK} runs each")
    print(f"  {args.off} off  min {off.min():8.3f} ms  median block {np.median(off):8.3f} ms")
    print(f"  {args.off} on   min {on.min():8.3f} ms  median block {np.median(on):8.3f} ms")
    print(f"  on / off: minimums {on.min() / off.min():.3f}, median of neighbouring blocks {np.median(on / off):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
