import sys, json, glob, os, numpy as np, onnxruntime as ort
from hetflow.zoo import model_path
name, batch, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
so = ort.SessionOptions(); so.intra_op_num_threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2; so.enable_profiling = True
so.profile_file_prefix = "/tmp/s61/ortprof"
s = ort.InferenceSession(str(model_path(name)), so, providers=["CPUExecutionProvider"])
i = s.get_inputs()[0]
shape = [batch if not isinstance(d, int) else d for d in i.shape]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
for _ in range(runs): s.run(None, {i.name: x})
f = s.end_profiling()
ev = json.load(open(f)); os.remove(f)
best = {}; runsd = []
for e in ev:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
        n = e["name"][:-12]; best[n] = min(best.get(n, 1e9), e["dur"])
    if e.get("cat") == "Session" and e["name"] == "model_run": runsd.append(e["dur"])
print("whole min %.3f ms" % (min(runsd)/1e3))
for n, us in best.items(): print(f"{n:40s} {us/1e3:.3f}")
print("sum of node mins %.3f" % (sum(best.values())/1e3))
