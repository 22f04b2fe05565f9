import sys, numpy as np, openvino as ov
from hetflow.zoo import model_path
name, batch = sys.argv[1], int(sys.argv[2])
core = ov.Core()
m = core.read_model(str(model_path(name)))
inp = m.inputs[0]
shape = [batch if (d.is_dynamic) else d.get_length() for d in inp.get_partial_shape()]
m.reshape({inp: shape})
c = core.compile_model(m, "CPU", {"PERF_COUNT": "YES", "INFERENCE_NUM_THREADS": 2, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"})
r = c.create_infer_request()
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
for i in range(50): r.infer({0: x})
best = {}
import time
ts=[]
for i in range(200):
    t=time.perf_counter(); r.infer({0: x}); ts.append(time.perf_counter()-t)
    for p in r.get_profiling_info():
        us = p.real_time.total_seconds()*1e6
        if p.status.name == 'EXECUTED':
            best[p.node_name] = min(best.get(p.node_name, (1e9,))[0], us), p.exec_type, p.node_type
print('whole min %.3f ms' % (min(ts)*1e3))
for k, (us, et, nt) in best.items():
    if us > 1: print(f"{k:30s} {nt:15s} {et:30s} {us/1e3:.3f} ms")
