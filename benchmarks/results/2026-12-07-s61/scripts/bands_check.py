import numpy as np
from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_depthwise_lanes as dl
rng = np.random.default_rng(0)
bad = 0
with threads.own_threads(2, spin=True):
    pool = threads.spinning()
    for c, h, k, s, pad in ((8, 56, 3, 1, 1), (8, 56, 3, 2, 1), (5, 30, 5, 1, 2), (5, 29, 5, 2, 2), (3, 28, 3, 2, 0), (4, 15, 3, 1, 1)):
        x = rng.standard_normal((1, c, h, h)).astype(np.float32)
        w = rng.standard_normal((c, 1, k, k)).astype(np.float32)
        b = rng.standard_normal(c).astype(np.float32)
        oh = (h + 2 * pad - k) // s + 1
        act = dl.activation_constants(2, 0.0, 6.0)
        window = (k, k, s, s, 1, 1, pad, pad)
        ref = np.zeros(c * oh * oh, np.float32)
        dl.planes_job(x, w, b, ref, c * oh * oh, (oh, oh), window, act, 0, 3).run(pool)
        for shares in (2, 3, 4, 7):
            y = np.full(c * oh * oh, np.nan, np.float32)
            dl.planes_job(x, w, b, y, c * oh * oh, (oh, oh), window, act, 0, shares, True).run(pool)
            ok = np.array_equal(y, ref)
            bad += not ok
            print(c, h, k, s, pad, shares, ok)
print("bad", bad)
