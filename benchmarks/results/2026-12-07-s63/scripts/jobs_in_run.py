"""Each job of the named layers inside a replayed run against the same job replayed alone (its layer's
jobs as a script of their own, replayed over and over: caches warm), cycle-stamped.

    python jobs_in_run.py MODEL BATCH LAYER[,LAYER...] [RUNS]
"""
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, "/work/main/benchmarks")
from replay_timeline import captured_replay  # noqa: E402

from hetflow import InferenceSession  # noqa: E402
from hetflow.devices.cpu.spin_pool import JobScript, cycles_per_second, replay_stamped  # noqa: E402
from hetflow.devices.cpu.threads import spinning  # noqa: E402
from hetflow.estimate.predict import batch_bindings  # noqa: E402
from hetflow.estimate.validate import random_feeds  # noqa: E402
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads  # noqa: E402

model, batch, names = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 100
session = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(session, batch)
for _ in range(5):
    session.run(None, feeds)
replay = captured_replay(session)
plan = session.plan_for(batch_bindings(session.graph, batch))
conv_macs, direct_macs = plan_conv_work(plan)
rate = cycles_per_second()
own_jobs = defaultdict(list)
for script, owners in replay.scripts:
    for job, owner in zip(script.jobs, owners):
        if owner in names:
            own_jobs[owner].append(job)
in_run = defaultdict(lambda: np.inf)
alone = defaultdict(lambda: np.inf)
with run_threads(conv_macs, holds_batch(feeds), 2, direct_macs, plan_recurrent_batch(plan)):
    for _ in range(runs):
        counts = defaultdict(int)
        for script, owners in replay.scripts:
            for owner, cycles in zip(owners, replay_stamped(script, spinning())):
                if owner in names:
                    key = (owner, counts[owner])
                    counts[owner] += 1
                    in_run[key] = min(in_run[key], cycles / rate)
    for owner, jobs in own_jobs.items():
        script = JobScript(jobs)
        for _ in range(runs):
            for index, cycles in enumerate(replay_stamped(script, spinning())):
                alone[(owner, index)] = min(alone[(owner, index)], cycles / rate)
for key in sorted(in_run):
    print(f"{key[0]:8s} job {key[1]}: in run {in_run[key] * 1e6:8.1f} us, alone {alone[key] * 1e6:8.1f} us, "
          f"lost {(in_run[key] - alone[key]) * 1e6:7.1f}")
