"""Each vCPU's own speed in either L3 state: the pointwise chain of chain_states.py on one thread,
pinned to one CPU and then the other, in rounds labelled by the cache probe.

    python core_speed_states.py SECONDS
"""
import os
import sys
import threading
import time

import numpy as np

sys.argv = [sys.argv[0], "0", *sys.argv[2:]] if len(sys.argv) < 2 else sys.argv
seconds = float(sys.argv[1])
sys.argv[1] = "0"  # build chain_states' model without its timing loop
sys.path.insert(0, os.path.dirname(__file__))
import chain_states  # noqa: E402

from hetflow import InferenceSession  # noqa: E402
from hetflow.estimate.spells import CacheProbe  # noqa: E402

session = InferenceSession(chain_states.model, threads=1)
feed = chain_states.feed
cpus = sorted(os.sched_getaffinity(0))[:2]


def timed_on(cpu):
    out = []

    def work():
        os.sched_setaffinity(0, {cpu})
        best = np.inf
        for _ in range(10):
            t = time.perf_counter()
            session.run(None, feed)
            best = min(best, time.perf_counter() - t)
        out.append(best)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out[0]


for cpu in cpus:
    timed_on(cpu)
probe = CacheProbe()
best = {(state, cpu): np.inf for state in (True, False) for cpu in cpus}
rounds = {True: 0, False: 0}
deadline = time.perf_counter() + seconds
while time.perf_counter() < deadline:
    before = probe.shared()
    got = {cpu: timed_on(cpu) for cpu in cpus}
    if probe.shared() != before:
        continue
    rounds[before] += 1
    for cpu, v in got.items():
        best[(before, cpu)] = min(best[(before, cpu)], v)
for state in (True, False):
    label = "shared" if state else "split"
    print(f"L3 {label} ({rounds[state]} rounds), one thread: " + ", ".join(
        f"cpu{cpu} {best[(state, cpu)] * 1e3:.3f} ms" for cpu in cpus))
