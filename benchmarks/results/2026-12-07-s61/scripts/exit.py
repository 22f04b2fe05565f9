import time, numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
import hetflow.devices.cpu.threads as T
from hetflow_lite import spinning
s = InferenceSession("zoo:mobilenetv2", threads=2)
feeds = random_feeds(s, 1)
for _ in range(5): s.run(None, feeds)
st = next(iter(s._steady.values()))
print(st.arrangement)
acc = {}
def wrap(owner, name, label):
    orig = getattr(owner, name)
    def w(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; return r
    setattr(owner, name, w)
wrap(spinning.SpinningThreads, 'rest', 'rest'); wrap(spinning.SpinningThreads, 'spin', 'spin')
wrap(T.BlasThreads, 'restore', 'restore'); wrap(T.BlasThreads, 'hold', 'hold'); wrap(T.BlasThreads, 'set', 'set')
for _ in range(200):
    s.run(None, feeds)
print({k: round(v / 200 * 1e6, 1) for k, v in acc.items()})
