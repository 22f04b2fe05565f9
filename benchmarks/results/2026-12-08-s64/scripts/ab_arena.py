"""Sessions with their arena where numpy puts it (any 16 bytes) against sessions with it on a page, in
one process, timed interleaved: each session's fastest run, and each kind's mean and spread of those.

    python ab_arena.py MODEL BATCH SESSIONS_PER_KIND SECONDS
"""
import sys
import time

import numpy as np

from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.runtime import memory

model, batch, per_kind, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
aligned_arena = memory.MemoryPlan.new_arena


def numpy_arena(self):
    return np.empty(self.arena_bytes, dtype=np.uint8)


sessions = []
for index in range(2 * per_kind):  # the kinds made in turn, so neither gets the earlier heap
    kind = "numpy" if index % 2 == 0 else "page"
    memory.MemoryPlan.new_arena = numpy_arena if kind == "numpy" else aligned_arena
    s = InferenceSession(f"zoo:{model}", threads=2)
    f = random_feeds(s, batch)
    for _ in range(3):
        s.run(None, f)
    offset = None
    sessions.append((kind, s, f))
memory.MemoryPlan.new_arena = aligned_arena
runs = 20 if batch == 1 else 3
best = [np.inf] * len(sessions)
deadline = time.perf_counter() + seconds
while time.perf_counter() < deadline:
    for i, (_, s, f) in enumerate(sessions):
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, f)
            best[i] = min(best[i], time.perf_counter() - t)
for kind in ("numpy", "page"):
    mins = [b for (k, _, _), b in zip(sessions, best) if k == kind]
    print(f"{model} b{batch} arena {kind:5s}: sessions' fastest {' '.join(f'{m * 1e3:.3f}' for m in mins)} ms; "
          f"mean {np.mean(mins) * 1e3:.3f}, spread {max(mins) / min(mins) - 1:.1%}")
