import sys, time, numpy as np
from collections import defaultdict
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
import hetflow.runtime.replay as R
import hetflow.runtime.session as S
from hetflow_lite import spinning, feeds as F
from hetflow.devices.cpu import spin_pool as SP
s = InferenceSession("zoo:mobilenetv2", threads=2)
feeds = random_feeds(s, 1)
for _ in range(5): s.run(None, feeds)
acc = defaultdict(float)
def wrap(owner, name, label):
    orig = getattr(owner, name)
    def w(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); acc[label] += time.perf_counter() - t; return r
    setattr(owner, name, w)
wrap(F.InPlaceFeed, 'take', 'take'); wrap(spinning.SpinningThreads, 'spin', 'spin'); wrap(spinning.SpinningThreads, 'rest', 'rest')
wrap(SP.SpinPool, 'replay', 'replay'); wrap(R.DirectReplay, 'run', 'direct.run'); wrap(S, '_signature', 'signature')
wrap(SP, '_replay', 'numba _replay')
rows = []
for _ in range(400):
    acc.clear()
    t = time.perf_counter(); s.run(None, feeds); w = time.perf_counter() - t
    rows.append((w, dict(acc)))
rows.sort(key=lambda r: r[0])
q = rows[: len(rows) // 4]
keys = rows[0][1].keys()
print(f"whole {np.mean([r[0] for r in q])*1e3:.3f}", {k: round(np.mean([r[1][k] for r in q]) * 1e6, 1) for k in keys})
