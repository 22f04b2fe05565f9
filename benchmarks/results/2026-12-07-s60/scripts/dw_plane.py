import time, numpy as np, numba
from hetflow.devices.cpu.kernels import jit_depthwise_rows as jr
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
_sweep = jr._sweep

@numba.njit(nogil=True)
def plain(x, w, bias, activation, y, image_stride, out_h, out_w, first, last, window, stride, pad_top, pad_left):
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    taps = window * window
    flat_x = x.reshape(-1)
    plane_size = height * width
    out_size = out_h * out_w
    for channel in range(first, last):
        _sweep(flat_x, channel * plane_size, height, width, -pad_top, -pad_left, y,
               channel * out_size, out_h, out_w, w, channel * taps, bias, channel, activation, window, stride)

@numba.njit(nogil=True)
def empty(x, w, bias, activation, y, image_stride, out_h, out_w, first, last, window, stride, pad_top, pad_left):
    s = 0.0
    for channel in range(first, last):
        s += y[channel]
    y[0] = s

for c, hw in ((960, 7), (576, 14), (144, 56)):
    x = np.random.default_rng(0).standard_normal((1, c, hw, hw)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((c, 1, 3, 3)).astype(np.float32).reshape(-1)
    b = np.zeros(c, np.float32); act = activation_constants(0, 0.0, 0.0)
    y = np.zeros(c * hw * hw, np.float32)
    for name, f in (('swept_planes', lambda: jr.swept_planes(x, w, b, act, y, c*hw*hw, hw, hw, 0, c, 3, 1, 1, 1, 1)),
                    ('plain loop', lambda: plain(x, w, b, act, y, c*hw*hw, hw, hw, 0, c, 3, 1, 1, 1))):
        f()
        ts = []
        for i in range(2000):
            t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
        print(f'{c}x{hw}x{hw} {name:14s} min {min(ts)*1e6:7.1f} us  {min(ts)*1e9/c:6.1f} ns/plane')
