"""Several sessions of one model in one process, timed interleaved: does a session's speed depend on where its memory lies?"""
import sys, time
import numpy as np
import hetflow
from hetflow.zoo import build
m = build(sys.argv[1] if len(sys.argv) > 1 else "mobilenetv2")
count = int(sys.argv[2]) if len(sys.argv) > 2 else 4
sessions = [hetflow.InferenceSession(m, threads=2) for _ in range(count)]
x = {sessions[0].get_inputs()[0].name: np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)}
for s in sessions:
    for _ in range(5): s.run(None, x)
best = [[] for _ in sessions]
for r in range(12):
    for i, s in enumerate(sessions):
        for _ in range(10): s.run(None, x)  # warm this session's memory
        ts = []
        for _ in range(20):
            t = time.perf_counter(); s.run(None, x); ts.append(time.perf_counter() - t)
        best[i].append(min(ts))
for i, b in enumerate(best):
    print(f"session {i}: min {min(b)*1e3:.3f} ms, median of round minimums {np.median(b)*1e3:.3f}")
