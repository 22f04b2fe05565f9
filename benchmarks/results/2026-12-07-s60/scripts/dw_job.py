import time, numpy as np
from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_depthwise_lanes as dl
from hetflow.devices.cpu.kernels import jit_depthwise_rows as jr
from hetflow.devices.cpu.kernels.jit_depthwise_lanes import activation_constants
for c, hw in ((960, 7), (576, 14)):
    x = np.random.default_rng(0).standard_normal((1, c, hw, hw)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((c, 1, 3, 3)).astype(np.float32)
    b = np.zeros(c, np.float32); act = activation_constants(0, 0.0, 0.0)
    y = np.zeros(c * hw * hw, np.float32)
    window = (3, 3, 1, 1, 1, 1, 1, 1)
    print(c, hw, 'spin_plane_shares', threads.spin_plane_shares(c, hw*hw, 2))
    with threads.own_threads(2, spin=True, hold_blas=True):
        pool = threads.spinning()
        for shares in (1, 2, 4, 8):
            job = dl.planes_job(x, w, b, y, c*hw*hw, (hw, hw), window, act, 0, shares)
            ts = []
            for i in range(3000):
                t0 = time.perf_counter(); job.run(pool); ts.append(time.perf_counter() - t0)
            print(f'  shares {shares}: min {min(ts)*1e6:6.1f} med {np.median(ts)*1e6:6.1f} us')
        # one thread alone
        ts=[]
        for i in range(3000):
            t0 = time.perf_counter(); jr.swept_planes(x, w.reshape(-1), b, act, y, c*hw*hw, hw, hw, 0, c, 3, 1, 1, 1, 1); ts.append(time.perf_counter() - t0)
        print(f'  caller alone: min {min(ts)*1e6:6.1f}')
