import sys, time, numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
import hetflow.runtime.replay as R
model = sys.argv[1]; batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, batch)
for _ in range(5): s.run(None, feeds)
orig = R.replay_on
acc = [0.0]
def timed(script, pool):
    t = time.perf_counter(); orig(script, pool); acc[0] += time.perf_counter() - t
R.replay_on = timed
for rnd in range(5):
    res = []
    for _ in range(300):
        acc[0] = 0.0
        t = time.perf_counter(); s.run(None, feeds); w = time.perf_counter() - t
        res.append((w, acc[0]))
    res.sort()
    arounds = sorted(w - j for w, j in res)
    print(f"whole min {res[0][0]*1e3:.3f} (its jobs {res[0][1]*1e3:.3f})  around: min {arounds[0]*1e3:.3f} median {arounds[len(arounds)//2]*1e3:.3f}")
