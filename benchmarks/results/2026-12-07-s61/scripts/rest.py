import time, numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow_lite import spinning
s = InferenceSession("zoo:mobilenetv2", threads=2)
feeds = random_feeds(s, 1)
for _ in range(5): s.run(None, feeds)
acc = {}
def add(k, v): acc[k] = acc.get(k, 0) + v
def rest(self):
    t0 = time.perf_counter()
    t1 = time.perf_counter()
    with self._wake:
        t2 = time.perf_counter()
        self._active_runs -= 1
        if self._active_runs == 0:
            self.state[spinning.SPIN] = 0
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    add('first perf_counter', t1 - t0); add('lock', t2 - t1); add('body', t3 - t2); add('unlock', t4 - t3)
spinning.SpinningThreads.rest = rest
for _ in range(200): s.run(None, feeds)
print({k: round(v / 200 * 1e6, 1) for k, v in acc.items()})
