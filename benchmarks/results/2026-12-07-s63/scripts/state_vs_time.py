"""Whole-run fastest of 10 beside the cache probe's ratio, over a few minutes."""
import importlib, sys, time
import numpy as np
sp = importlib.import_module('hetflow.estimate.spells')
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
names = sys.argv[1].split(","); batch = int(sys.argv[2]); rounds = int(sys.argv[3])
probe = sp.CacheProbe()
sessions = {}
for n in names:
    s = InferenceSession(f"zoo:{n}", threads=2); f = random_feeds(s, batch)
    for _ in range(3): s.run(None, f)
    sessions[n] = (s, f)
for r in range(rounds):
    ratio = probe.ratio()
    row = []
    for n, (s, f) in sessions.items():
        ts = []
        for _ in range(10):
            t = time.perf_counter(); s.run(None, f); ts.append(time.perf_counter() - t)
        row.append(f"{n} {min(ts)*1e3:7.2f} {np.median(ts)*1e3:7.2f}")
    print(f"{time.strftime('%H:%M:%S')} ratio {ratio:4.2f} | " + " | ".join(row), flush=True)
