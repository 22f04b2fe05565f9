import time, numpy as np
from hetflow.devices.cpu.kernels import jit_depthwise_rows as jr
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
act = activation_constants(0, 0.0, 6.0)
for c, hw, stride in ((144, 56, 1), (16, 56, 1), (32, 112, 1), (8, 112, 1), (96, 112, 2), (16, 112, 2), (576, 14, 1), (64, 14, 1), (960, 7, 1), (64, 7, 1)):
    oh = (hw - 1) // stride + 1
    x = np.random.default_rng(0).standard_normal((1, c, hw, hw)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = np.zeros(c, np.float32)
    y = np.zeros(c * oh * oh, np.float32)
    ts=[]
    for i in range(max(50, 200000 // (c*hw*hw//100))):
        t0 = time.perf_counter(); jr.swept_planes(x, w.reshape(-1), b, act, y, c*oh*oh, oh, oh, 0, c, 3, stride, stride, 1, 1); ts.append(time.perf_counter() - t0)
    print(f'{c}x{hw}x{hw} s{stride}: {min(ts)*1e6:7.1f} us, per plane {min(ts)*1e6/c:.3f} us  ({c*hw*hw*4/1024:.0f} KB in)')
