import sys, time, numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.devices.cpu import spin_pool as SP
import hetflow.runtime.executor as E
model = sys.argv[1]; direct = sys.argv[2] == "1"
if not direct: E.Program.direct_replay = lambda self, a: None
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, 1)
for _ in range(5): s.run(None, feeds)
orig = SP.SpinPool.replay
acc = [0.0]
def timed(self, script, stamps=SP._NO_STAMPS):
    t = time.perf_counter(); orig(self, script, stamps); acc[0] += time.perf_counter() - t
SP.SpinPool.replay = timed
for rnd in range(4):
    res = []
    for _ in range(300):
        acc[0] = 0.0
        t = time.perf_counter(); s.run(None, feeds); w = time.perf_counter() - t
        res.append((w, acc[0]))
    arounds = sorted(w - j for w, j in res)
    print(f"direct={direct} whole min {min(r[0] for r in res)*1e3:.3f}  around: min {arounds[0]*1e6:.0f} us median {arounds[len(arounds)//2]*1e6:.0f} us")
