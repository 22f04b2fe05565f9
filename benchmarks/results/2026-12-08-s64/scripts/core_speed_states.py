"""Each vCPU's own speed in either L3 state: the pointwise chain of chain_states.py on one thread,
pinned to one CPU and then the other, in rounds labelled by the cache probe.

    python core_speed_states.py SECONDS
"""
import os
import sys
import threading
import time

import numpy as np

seconds = float(sys.argv[1])
sys.path.insert(0, os.path.dirname(__file__))
import chain_states  # noqa: E402

from hetflow import InferenceSession  # noqa: E402

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
best, rounds = chain_states.labelled_rounds(seconds, lambda: {cpu: timed_on(cpu) for cpu in cpus}, cpus)
for state in (True, False):
    label = "shared" if state else "split"
    print(f"L3 {label} ({rounds[state]} rounds), one thread: " + ", ".join(
        f"cpu{cpu} {best[(state, cpu)] * 1e3:.3f} ms" for cpu in cpus))
