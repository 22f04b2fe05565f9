"""Per layer, a replayed run's in-run time with the cores' L3 shared and with it split.

    python split_timeline.py MODEL BATCH SECONDS [TOP]

Blocks of 20 stamped replays (replay_timeline's method), the cache probe read before and after each
block; a block counts for a state when both readings agree. Per layer the minimum over the blocks of
each state, sorted by what the split costs."""
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, "/work/main/benchmarks")
from replay_timeline import captured_replay  # noqa: E402

from hetflow import InferenceSession  # noqa: E402
from hetflow.devices.cpu.spin_pool import cycles_per_second, replay_stamped  # noqa: E402
from hetflow.devices.cpu.threads import spinning  # noqa: E402
from hetflow.estimate.predict import batch_bindings  # noqa: E402
from hetflow.estimate.spells import CacheProbe  # noqa: E402
from hetflow.estimate.validate import random_feeds  # noqa: E402
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads  # noqa: E402

model, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
session = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(session, batch)
for _ in range(5):
    session.run(None, feeds)
replay = captured_replay(session)
plan = session.plan_for(batch_bindings(session.graph, batch))
conv_macs, direct_macs = plan_conv_work(plan)
rate = cycles_per_second()
probe = CacheProbe()
best = {True: defaultdict(lambda: np.inf), False: defaultdict(lambda: np.inf)}
whole = {True: np.inf, False: np.inf}
blocks = {True: 0, False: 0}
deadline = time.perf_counter() + seconds
with run_threads(conv_macs, holds_batch(feeds), 2, direct_macs, plan_recurrent_batch(plan)):
    while time.perf_counter() < deadline:
        before = probe.shared()
        block = defaultdict(lambda: np.inf)
        block_whole = np.inf
        for _ in range(20):
            totals = defaultdict(float)
            for script, owners in replay.scripts:
                for owner, cycles in zip(owners, replay_stamped(script, spinning())):
                    totals[owner] += cycles / rate
            for owner, s in totals.items():
                block[owner] = min(block[owner], s)
            block_whole = min(block_whole, sum(totals.values()))
        after = probe.shared()
        if before == after:
            blocks[before] += 1
            whole[before] = min(whole[before], block_whole)
            for owner, s in block.items():
                best[before][owner] = min(best[before][owner], s)
print(f"{model} b{batch}: blocks shared {blocks[True]}, split {blocks[False]}; "
      f"fastest replay shared {whole[True] * 1e3:.3f} ms, split {whole[False] * 1e3:.3f} ms")
if blocks[True] and blocks[False]:
    names = sorted(best[True], key=lambda n: best[True][n] - best[False][n])
    print(f"{'layer':14s} {'shared':>8s} {'split':>8s} {'ratio':>6s} {'lost':>7s}")
    for n in names[:top]:
        print(f"{n:14s} {best[True][n] * 1e3:8.3f} {best[False][n] * 1e3:8.3f} "
              f"{best[False][n] / best[True][n]:6.2f} {(best[False][n] - best[True][n]) * 1e3:7.3f}")
    print(f"sum of minimums shared {sum(best[True].values()) * 1e3:.3f}, split {sum(best[False].values()) * 1e3:.3f}")
