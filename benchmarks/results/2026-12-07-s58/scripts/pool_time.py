import numpy as np, time
from hetflow.devices.cpu.kernels import jit_pool_strided as ps
rng = np.random.default_rng(0)
def best(f, n=100):
    for _ in range(5): f()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    return min(ts)*1e6
import numba
@numba.njit(nogil=True)
def planes(x, C, H, W, pad, y, oh, ow):
    for c in range(C):
        ps.pool_plane(x, c*H*W, H, W, pad, pad, y, c*oh*ow, oh, ow)
for (C, H, pad, ceil) in [(256,27,0,0), (128,55,0,0), (96,56,0,1), (480,28,0,1), (64,111,0,0)]:
    oh = (H - 3 + (1 if ceil else 0)) // 2 + 1
    x = rng.standard_normal(C*H*H).astype(np.float32); y = np.zeros(C*oh*oh, np.float32)
    print(f"{C}x{H}x{H}: {best(lambda: planes(x, C, H, H, pad, y, oh, oh)):6.1f} us")
