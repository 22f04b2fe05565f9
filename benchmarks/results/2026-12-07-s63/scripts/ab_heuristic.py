"""Two sessions of one model in one process, the second planned with the Conv heuristic overridden, alternated:
whole-run minimums/medians and per-layer in-run minimums (stamped replays)."""
import sys, time, importlib
from collections import defaultdict
import numpy as np
sys.path.insert(0, '/work/main/benchmarks')
from replay_timeline import captured_replay
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.estimate.predict import batch_bindings
from hetflow.devices.cpu.spin_pool import cycles_per_second, replay_stamped
from hetflow.devices.cpu.threads import spinning
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads

model, batch, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rule = sys.argv[4]  # an expression over (node, inputs, choice) giving B's algorithm
from hetflow.tuning import select
orig = select.HEURISTICS["Conv"]

def wrapped(node, inputs):
    choice = orig(node, inputs)
    return eval(rule, {"node": node, "inputs": inputs, "choice": choice, "orig": orig})

values = {"A": orig, "B": wrapped}

def make(value):
    select.HEURISTICS["Conv"] = value
    s = InferenceSession(f"zoo:{model}", threads=2)
    f = random_feeds(s, batch)
    for _ in range(3): s.run(None, f)
    select.HEURISTICS["Conv"] = orig
    return s, f

sessions = {k: make(v) for k, v in values.items()}
outs = {k: s.run(None, f)[0] for k, (s, f) in sessions.items()}
print(f"B: {rule}; max abs diff", float(np.max(np.abs(outs["A"] - outs["B"]))))
rate = cycles_per_second()
best = {k: defaultdict(lambda: np.inf) for k in sessions}
whole = {k: [] for k in sessions}
for r in range(rounds):
    for k, (s, f) in sessions.items():
        rep = captured_replay(s)
        plan = s.plan_for(batch_bindings(s.graph, batch))
        cm, dm = plan_conv_work(plan)
        for _ in range(10):
            t = time.perf_counter(); s.run(None, f); whole[k].append(time.perf_counter() - t)
        with run_threads(cm, holds_batch(f), 2, dm, plan_recurrent_batch(plan)):
            for _ in range(10):
                tot = defaultdict(float)
                for script, owners in rep.scripts:
                    for owner, cyc in zip(owners, replay_stamped(script, spinning())):
                        tot[owner] += cyc / rate
                for o, v in tot.items(): best[k][o] = min(best[k][o], v)
for k in sessions:
    print(f"{k} whole min {min(whole[k])*1e3:.3f} median {np.median(whole[k])*1e3:.3f}  jobs' minimums {sum(best[k].values())*1e3:.3f}")
print(f"A/B whole min {min(whole['A'])/min(whole['B']):.3f} median {np.median(whole['A'])/np.median(whole['B']):.3f}")
diffs = sorted(((best['A'][o] - best['B'][o]), o) for o in best['A'])
for d, o in diffs[:8] + diffs[-6:]:
    print(f"  {o:10s} A {best['A'][o]*1e3:.3f} B {best['B'][o]*1e3:.3f}  {d*1e3:+.3f}")
