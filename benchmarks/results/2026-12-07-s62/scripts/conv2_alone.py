"""mentee b16's conv2 alone: validation's timed call against its jobs replayed with the pool held spinning."""
import importlib, time
import numpy as np
import hetflow
from hetflow.zoo import build
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.runtime.executor import plan_conv_work, plan_recurrent_batch, holds_batch, run_threads, spin_threads
timing = importlib.import_module("hetflow.estimate.timing")
validate = importlib.import_module("hetflow.estimate.validate")
s = hetflow.InferenceSession(build("mentee"))
feeds = validate.random_feeds(s, 16)
for _ in range(3): s.run(None, feeds)
(steady,) = s._steady.values()
d = steady._direct
hz = spin_pool.cycles_per_second()
jobs = d.script.jobs[1:4]  # conv2's three jobs
script = spin_pool.JobScript(list(jobs))
for rep in range(3):
    d.pool.spin()
    try:
        held = min(int(spin_pool.replay_stamped(script, d.pool).sum()) for _ in range(200)) / hz
    finally:
        d.pool.rest()
    nospin = []
    for _ in range(200):
        t = time.perf_counter(); spin_pool.replay_on(script, d.pool); nospin.append(time.perf_counter() - t)
    plan = s.plan_for({"N": 16})
    conv_macs, direct_macs = plan_conv_work(plan)
    with run_threads(conv_macs, holds_batch(feeds), None, direct_macs, plan_recurrent_batch(plan)):
        pool = spinning()
        inside = []
        for _ in range(200):
            t = time.perf_counter(); spin_pool.replay_on(script, pool); inside.append(time.perf_counter() - t)
    print(f"held spinning {held*1e6:.0f} us; replay_on from Python, no spin held {min(nospin)*1e6:.0f} (median {np.median(nospin)*1e6:.0f}); inside run_threads {min(inside)*1e6:.0f} (median {np.median(inside)*1e6:.0f}); pool {pool is d.pool}")
l = validate.layer_seconds(s, feeds)
print("validate conv2", round(l["conv2"] * 1e6))
