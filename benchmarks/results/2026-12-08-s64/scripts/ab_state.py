"""Two sessions of one model in one process, made with a module attribute at two values, alternated
in rounds, each round labelled by the cache probe (L3 shared or split, read before and after; rounds
where they disagree are dropped): per state, whole-run minimums / medians and the named layers' in-run
minimums (stamped replays).

    python ab_state.py MODEL BATCH SECONDS MODULE.ATTR[+MODULE.ATTR...] A B [LAYER,LAYER,...]
"""
import importlib
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, "/work/main/benchmarks")
from replay_timeline import captured_replay, in_run_seconds  # noqa: E402

from hetflow import InferenceSession  # noqa: E402
from hetflow.estimate.spells import CacheProbe  # noqa: E402
from hetflow.estimate.validate import random_feeds  # noqa: E402

model, batch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
layers = sys.argv[7].split(",") if len(sys.argv) > 7 else []


def resolve(path):
    """(module or object, attribute name) of a dotted ``MODULE.ATTR``."""
    target, attr = path.rsplit(".", 1)
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
            break
        except ImportError:
            continue
    for part in parts[cut:]:
        found = getattr(found, part)
    return found, attr


targets = [resolve(path) for path in sys.argv[4].split("+")]  # several attributes set alike
name = sys.argv[4]
originals = [getattr(mod, attr) for mod, attr in targets]
orig = originals[0]
values = {"A": eval(sys.argv[5]), "B": eval(sys.argv[6])}


def set_all(value):
    for (mod, attr), original in zip(targets, originals):
        setattr(mod, attr, original if value is None else value)


def make(value):
    set_all(value)
    s = InferenceSession(f"zoo:{model}", threads=2)
    f = random_feeds(s, batch)
    for _ in range(3):
        s.run(None, f)
    set_all(None)
    return s, f


sessions = {k: make(v) for k, v in values.items()}
outs = {k: s.run(None, f)[0] for k, (s, f) in sessions.items()}
print(f"{name}: A={sys.argv[5]} B={sys.argv[6]}; max abs diff", float(np.max(np.abs(outs["A"] - outs["B"]))))
probe = CacheProbe()
runs = 10 if batch == 1 else 3
whole = {state: {k: [] for k in sessions} for state in (True, False)}
best = {state: {k: defaultdict(lambda: np.inf) for k in sessions} for state in (True, False)}
rounds = {True: 0, False: 0}
deadline = time.perf_counter() + seconds
while time.perf_counter() < deadline:
    before = probe.shared()
    times = {k: [] for k in sessions}
    layer = {k: defaultdict(lambda: np.inf) for k in sessions}
    for k, (s, f) in sessions.items():
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, f)
            times[k].append(time.perf_counter() - t)
        if layers:
            in_run = in_run_seconds(s, f, batch, 2, captured_replay(s), 3)[0]
            for o in layers:
                layer[k][o] = in_run[o]
    after = probe.shared()
    if before != after:
        continue
    rounds[before] += 1
    for k in sessions:
        whole[before][k] += times[k]
        for o in layers:
            best[before][k][o] = min(best[before][k][o], layer[k][o])
for state in (True, False):
    label = "shared" if state else "split"
    if not rounds[state]:
        print(f"L3 {label}: no rounds")
        continue
    w = whole[state]
    print(f"L3 {label}, {rounds[state]} rounds: A min {min(w['A']) * 1e3:.3f} median {np.median(w['A']) * 1e3:.3f}; "
          f"B min {min(w['B']) * 1e3:.3f} median {np.median(w['B']) * 1e3:.3f}; A/B min {min(w['A']) / min(w['B']):.3f} "
          f"median {np.median(w['A']) / np.median(w['B']):.3f}")
    for o in layers:
        print(f"    {o:10s} A {best[state]['A'][o] * 1e3:.3f} B {best[state]['B'][o] * 1e3:.3f}")
