"""A direct replay's jobs timed in the run (replay_stamped) vs the whole run vs layers alone."""
import importlib, sys, time
import numpy as np
import hetflow
from hetflow.devices.cpu import spin_pool
from hetflow.zoo import build
validate = importlib.import_module("hetflow.estimate.validate")
name = sys.argv[1]
s = hetflow.InferenceSession(build(name))
feeds = validate.random_feeds(s, 1)
whole = min(validate.model_seconds(s, feeds, budget=0.3) for _ in range(3))
steady = list(s._steady.values())[0]
direct = steady._direct
assert direct is not None
hz = spin_pool.cycles_per_second()
best = None
totals = []
from hetflow.devices.cpu.threads import own_threads
for _ in range(2000):
    direct.pool.spin()
    try:
        st = spin_pool.replay_stamped(direct.script, direct.pool)
    finally:
        direct.pool.rest()
    totals.append(st.sum())
    best = st if best is None else np.minimum(best, st)
jobs_s = best / hz
layers = validate.layer_seconds(s, feeds)
print(f"{name}: whole {whole*1e6:.1f} us; jobs in run (min each) {jobs_s.sum()*1e6:.1f} us over {len(jobs_s)} jobs; layers alone {sum(layers.values())*1e6:.1f} us over {len(layers)} steps")
print(f"  min of sums {min(totals)/hz*1e6:.1f} us, median {np.median(totals)/hz*1e6:.1f}")
print("  jobs us:", " ".join(f"{v*1e6:.2f}" for v in jobs_s))
print("  layers us:", " ".join(f"{k}={v*1e6:.2f}" for k, v in layers.items()))
