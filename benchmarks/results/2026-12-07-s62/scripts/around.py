import importlib, sys, numpy as np, hetflow
from onnx import helper
pr = importlib.import_module("hetflow.estimate.probes")
validate = importlib.import_module("hetflow.estimate.validate")
from hetflow.devices.cpu.spin_pool import cycles_per_second, replay_stamped
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.runtime.executor import spin_threads
from hetflow.zoo import build
hz = cycles_per_second()
def measure(model, label):
    s = hetflow.InferenceSession(model, threads=2)
    feeds = validate.random_feeds(s, 1)
    for _ in range(3): s.run(None, feeds)
    script = [f.whole_script for _, f in s.captured_runs() if f.whole_script is not None][0]
    out = []
    for _ in range(8):
        whole = validate.model_seconds(s, feeds, budget=0.05)
        with own_threads(spin_threads(2), spin=True):
            pool = spinning()
            jobs = min(int(replay_stamped(script, pool).sum()) for _ in range(300)) / hz
        out.append((whole - jobs) * 1e6)
    print(f"{label:14s} around us: " + " ".join(f"{v:5.1f}" for v in out), f" median {np.median(out):.1f}", f"jobs {jobs*1e6:.1f}")
measure(pr.small_network(), "probe 2MB")
for m in sys.argv[1:]:
    measure(build(m), m)
