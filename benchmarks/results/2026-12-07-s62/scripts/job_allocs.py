import importlib, sys, tracemalloc
import hetflow
from hetflow.zoo import build
from hetflow.devices.cpu import spin_pool
validate = importlib.import_module("hetflow.estimate.validate")
m, b = sys.argv[1], int(sys.argv[2])
s = hetflow.InferenceSession(build(m))
feeds = validate.random_feeds(s, b)
for _ in range(3): s.run(None, feeds)
(steady,) = s._steady.values()
d = steady._direct
jobs = d.script.jobs
tracemalloc.start()
d.pool.spin()
found = {}
for i, job in enumerate(jobs):
    sc = spin_pool.JobScript([job])
    d.pool.replay(sc)
    tracemalloc.reset_peak(); base = tracemalloc.get_traced_memory()[0]
    d.pool.replay(sc)
    peak = tracemalloc.get_traced_memory()[1] - base
    if peak > 300:
        f = spin_pool.COMPILED_JOBS.get(job.address)
        key = (f.__module__ + "." + f.__name__) if f else hex(job.address)
        found.setdefault(key, []).append(peak)
d.pool.rest()
for k, v in found.items():
    print(k, len(v), max(v))
