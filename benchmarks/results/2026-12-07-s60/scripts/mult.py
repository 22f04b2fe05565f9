import time, sys, numpy as np
from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import winograd as wg
rng = np.random.default_rng(0)
for (e, k, c, t) in ((36, 64, 64, 16), (36, 64, 32, 16), (36, 256, 256, 16), (36, 192, 96, 16), (36, 32, 32, 64)):
    u = rng.standard_normal((e, k, c)).astype(np.float32)
    v = rng.standard_normal((e, c, t)).astype(np.float32)
    p = np.zeros((e, k, t), np.float32)
    with threads.own_threads(2, spin=True, hold_blas=True):
        pool = threads.spinning()
        job = wg.multiply_job(u, v, p)
        job.run(pool)
        ref = np.matmul(u, v)
        err = np.abs(p - ref).max() / np.abs(ref).max()
        ts = []
        for i in range(2000):
            t0 = time.perf_counter(); job.run(pool); ts.append(time.perf_counter() - t0)
    macs = e * k * c * t
    print(f'{e}x{k}x{c}x{t}: min {min(ts)*1e6:7.1f} us  {2*macs/min(ts)/1e9:6.1f} GFLOP/s  err {err:.1e}')
