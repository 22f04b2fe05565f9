import os, time, numpy as np
from hetflow.devices.cpu.kernels import jit_winograd_lanes as wl
def aligned(n, offset_floats):
    raw = np.zeros(n + 4096, np.float32)
    start = (-raw.ctypes.data // 4) % 1024
    return raw[start + offset_floats: start + offset_floats + n]
c,h,w,m=64,16,16,4
x = aligned(c*h*w, 0); x[:] = np.random.default_rng(0).standard_normal(x.size)
v = aligned(36*c*16 + 2048, 0)
t = wl.tile_table(1,(4,4),4,(-1,-1),w,c*h*w)
ts=[]
for i in range(3000):
    t0=time.perf_counter(); wl.input_channels(x,t,16,c,h,w,v,0,c,m); ts.append(time.perf_counter()-t0)
print('WL_SAME', os.environ.get('WL_SAME'), 'min %.1f us' % (min(ts)*1e6))
