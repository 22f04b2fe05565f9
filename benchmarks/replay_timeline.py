"""Where a replayed run's time goes: each layer's time inside the run against its time alone.

    python benchmarks/replay_timeline.py --model mobilenetv2 [--batch 1] [--threads 2] [--runs 200] [--top 15]
        [--jobs conv4,conv5]

A captured run (``hetflow.runtime.replay``) runs its layers' compiled jobs back to back, with no Python
between them, so ``hetflow profile`` (which calls each node from Python) cannot say what a layer takes
there. Here the run's segments are replayed in order, ``--runs`` times, with the CPU's cycle counter read
after every job (``spin_pool.replay_stamped``): each layer's in-run time is the minimum over the runs of
its jobs' cycles. Beside it: the layer replayed alone on its own inputs, caches warm
(``hetflow.estimate.validate.layer_seconds``, what ``hetflow estimate --validate`` measures), and the whole
``session.run`` (minimum). The gaps say what a run loses to cold caches (in-run against alone) and to
everything around the jobs (the whole run against the sum of its jobs: copying the feed in, steps still
called from Python, the executor). ``--jobs`` lists the named layers' jobs one by one (a Winograd layer's
input transform, products and output transform, say).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict

import numpy as np

from hetflow import InferenceSession
from hetflow.devices.cpu.spin_pool import cycles_per_second, replay_stamped
from hetflow.devices.cpu.threads import spinning
from hetflow.estimate.predict import batch_bindings
from hetflow.estimate.validate import layer_seconds, random_feeds
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads
from hetflow.runtime.replay import Replay


def captured_replay(session: InferenceSession) -> Replay:
    """The session's first captured run (after ``session.run`` has captured one)."""
    for plan in [session.plan, *session._accepted.values()]:  # noqa: SLF001  (a diagnostic's reach)
        for program in plan.programs.values():
            for found in program.captured_runs():
                return found
    raise SystemExit("no run was captured: this model's runs are not replayed at these settings")


def in_run_seconds(
    session: InferenceSession, feeds: dict, batch: int, threads: int, replay: Replay, runs: int
) -> tuple[dict[str, float], float, dict[tuple[str, int], float]]:
    """Per node, the minimum over ``runs`` replays of its jobs' seconds, the segments replayed in run
    order inside the thread arrangement a run of the session holds (``executor.thread_arrangement``);
    the fastest replay's jobs in all (the per-node minimums come from different replays, and sum
    to less than any one); and per (node, its job's index) that job's minimum."""
    plan = session.plan_for(batch_bindings(session.graph, batch))
    conv_macs, direct_macs = plan_conv_work(plan)
    rate = cycles_per_second()
    best: dict[str, float] = {}
    each_job: dict[tuple[str, int], float] = {}
    fastest = np.inf
    with run_threads(conv_macs, holds_batch(feeds), threads, direct_macs, plan_recurrent_batch(plan)):
        for _ in range(runs):
            totals: dict[str, float] = defaultdict(float)
            counts: dict[str, int] = defaultdict(int)
            for script, owners in replay.scripts:
                for owner, cycles in zip(owners, replay_stamped(script, spinning())):
                    totals[owner] += cycles / rate
                    job = (owner, counts[owner])
                    counts[owner] += 1
                    each_job[job] = min(each_job.get(job, np.inf), cycles / rate)
            for owner, seconds in totals.items():
                best[owner] = min(best.get(owner, np.inf), seconds)
            fastest = min(fastest, sum(totals.values()))
    return best, float(fastest), each_job


def run_seconds(session: InferenceSession, feeds: dict, runs: int) -> float:
    """The fastest of ``runs`` whole ``session.run`` calls."""
    best = np.inf
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        best = min(best, time.perf_counter() - start)
    return float(best)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a zoo model name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--top", type=int, default=15, help="layers listed, those losing most in the run first")
    parser.add_argument("--jobs", default="", help="comma-separated layers whose jobs are listed one by one")
    args = parser.parse_args(argv)

    session = InferenceSession(f"zoo:{args.model}", threads=args.threads)
    feeds = random_feeds(session, args.batch)
    for _ in range(5):
        session.run(None, feeds)
    replay = captured_replay(session)
    whole = run_seconds(session, feeds, args.runs)
    in_run, fastest, each_job = in_run_seconds(session, feeds, args.batch, args.threads, replay, args.runs)
    alone = layer_seconds(session, feeds)
    whole_again = run_seconds(session, feeds, args.runs)

    print(f"{args.model} at batch {args.batch}, {args.threads} threads: {replay.jobs} jobs replayed, "
          f"{replay.called} step(s) called from Python")
    rows = sorted(in_run, key=lambda name: alone.get(name, 0.0) - in_run[name])
    print(f"{'layer':16s} {'in run ms':>10s} {'alone ms':>9s} {'ratio':>6s}")
    for name in rows[: args.top]:
        single = alone.get(name, float("nan"))
        print(f"{name:16s} {in_run[name] * 1e3:10.3f} {single * 1e3:9.3f} {in_run[name] / single:6.2f}")
    jobs = sum(in_run.values())
    alone_sum = sum(alone.get(name, 0.0) for name in in_run)
    run = min(whole, whole_again)
    print(f"jobs in run: their minimums sum to {jobs * 1e3:.3f} ms (alone {alone_sum * 1e3:.3f}, "
          f"{jobs / alone_sum:.2f}x), the fastest replay's {fastest * 1e3:.3f}; whole run {run * 1e3:.3f} ms "
          f"(before / after the timeline {whole * 1e3:.3f} / {whole_again * 1e3:.3f}): "
          f"{(run - fastest) * 1e3:.3f} ms around the jobs")
    for name in filter(None, args.jobs.split(",")):
        jobs_of = sorted((index, seconds) for (owner, index), seconds in each_job.items() if owner == name)
        listed = ", ".join(f"{index}: {seconds * 1e3:.3f}" for index, seconds in jobs_of)
        print(f"{name} jobs in run (ms): {listed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
