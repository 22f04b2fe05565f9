import sys, time, numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
model, batch, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = InferenceSession(f"zoo:{model}", threads=2)
f = random_feeds(s, batch)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.0: s.run(None, f)
ts = []
for _ in range(runs):
    t = time.perf_counter(); s.run(None, f); ts.append(time.perf_counter() - t)
hp = [l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages')]
print(f"{min(ts)*1e3:.3f} {np.median(ts)*1e3:.3f} {hp[0].split()[1] if hp else '?'}")
