import sys, time, numpy as np, onnxruntime as ort
from hetflow import InferenceSession
from hetflow.zoo import model_path
model = sys.argv[1]; batch = int(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 20
h = InferenceSession(f"zoo:{model}", threads=int(sys.argv[4]))
so = ort.SessionOptions(); so.intra_op_num_threads = int(sys.argv[4])
o = ort.InferenceSession(str(model_path(model)), so, providers=["CPUExecutionProvider"])
i = o.get_inputs()[0]
shape = [batch if not isinstance(d, int) else d for d in i.shape]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
runs = {"hetflow": lambda: h.run(None, {h.get_inputs()[0].name: x}), "ort": lambda: o.run(None, {i.name: x})}
times = {k: [] for k in runs}
for r in range(rounds):
    for k, f in runs.items():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.1: f()
        for _ in range(10):
            t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
for k, v in times.items():
    print(f"{k:8s} min {min(v)*1e3:.3f} p10 {np.percentile(v,10)*1e3:.3f} median {np.median(v)*1e3:.3f}")
print("ratio min %.3f p10 %.3f median %.3f" % tuple(np.array([f(times['hetflow']) for f in (min, lambda v: np.percentile(v,10), np.median)]) / np.array([f(times['ort']) for f in (min, lambda v: np.percentile(v,10), np.median)])))
