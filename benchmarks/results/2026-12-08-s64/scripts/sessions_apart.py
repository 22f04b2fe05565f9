"""How far sessions of one model apart run: SESSIONS sessions made in one process, timed interleaved
(blocks of 20 runs, for SECONDS), each one's fastest run and median, and its fastest in either half of the time
(does a session stay as fast or as slow as it was?).

    python sessions_apart.py MODEL BATCH SESSIONS SECONDS
"""
import sys
import time

import numpy as np

from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds

model, batch, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
sessions = []
for _ in range(count):
    s = InferenceSession(f"zoo:{model}", threads=2)
    f = random_feeds(s, batch)
    for _ in range(3):
        s.run(None, f)
    sessions.append((s, f))
times = [[] for _ in sessions]
deadline = time.perf_counter() + seconds
while time.perf_counter() < deadline:
    for i, (s, f) in enumerate(sessions):
        for _ in range(20):
            t = time.perf_counter()
            s.run(None, f)
            times[i].append(time.perf_counter() - t)
fastest = min(min(t) for t in times)
for i, t in enumerate(times):
    half = len(t) // 2
    print(f"session {i}: min {min(t) * 1e3:.4f} ms ({min(t) / fastest:.3f}), median {np.median(t) * 1e3:.4f}; "
          f"min of the first half {min(t[:half]) * 1e3:.4f}, of the second {min(t[half:]) * 1e3:.4f}")
