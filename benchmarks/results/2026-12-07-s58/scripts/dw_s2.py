import numpy as np, time
from hetflow.devices.cpu.kernels import jit_depthwise_lanes as dl
rng = np.random.default_rng(0)
def best(f, n=50):
    for _ in range(5): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return min(ts)*1e6
act = dl.activation_constants(0, 0.0, 0.0)
for (C, H, s, p) in [(96,112,2,1), (144,56,1,1), (144,56,2,1), (576,14,1,1), (960,7,1,1), (576,14,2,1)]:
    x = rng.standard_normal((1,C,H,H)).astype(np.float32)
    w = rng.standard_normal((C,1,3,3)).astype(np.float32).reshape(-1)
    b = np.zeros(C, np.float32)
    oh = (H + 2*p - 3)//s + 1
    y = np.zeros(C*oh*oh, np.float32)
    t = best(lambda: dl.vector_planes(x, w, b, act, y, C*oh*oh, oh, oh, 0, C, 3, 3, s, s, 1, 1, p, p, 1))
    print(f"{C}x{H}x{H} s{s}: {t:7.1f} us one core, {t/C*1000:6.0f} ns a plane, {C*oh*oh*9/t/1e3:5.1f} GMAC/s, X {x.nbytes/t/1e3:5.1f} GB/s")
