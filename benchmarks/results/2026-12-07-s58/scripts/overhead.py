"""session.run's time outside Replay.run, per run."""
import sys, time
import numpy as np
from hetflow import InferenceSession
from hetflow.runtime import replay as rp

from hetflow.estimate.validate import random_feeds
model = sys.argv[1]; batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
inner = []
orig = rp.Replay.run
def timed(self, env, pool):
    t = time.perf_counter(); orig(self, env, pool); inner.append(time.perf_counter() - t)
rp.Replay.run = timed
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, batch)
for _ in range(20): s.run(None, feeds)
outer = []; inner.clear()
for _ in range(300):
    t = time.perf_counter(); s.run(None, feeds); outer.append(time.perf_counter() - t)
outer = np.array(outer); inn = np.array(inner)
d = outer - inn
print(f"{model} b{batch}: run min {outer.min()*1e3:.3f} med {np.median(outer)*1e3:.3f}; replay min {inn.min()*1e3:.3f}; outside min {d.min()*1e6:.1f} us med {np.median(d)*1e6:.1f} us")
