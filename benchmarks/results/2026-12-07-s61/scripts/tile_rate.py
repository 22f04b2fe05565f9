import time, numpy as np
from hetflow.devices.cpu.kernels import jit_tile_gemm as tg
rng = np.random.default_rng(0)
for K, C, N in ((576, 96, 196), (160, 960, 49), (96, 16, 12544), (16, 32, 12544), (1280, 320, 49), (384, 64, 196), (64, 384, 196)):
    w = rng.standard_normal((K, C)).astype(np.float32)
    x = rng.standard_normal((1, C, N)).astype(np.float32)
    y = np.zeros(K * N, np.float32)
    b = np.zeros(K, np.float32)
    items = np.array([[0, 0, N]], np.int64)
    def run():
        tg.gemm_items(w.reshape(-1), x, y, K * N, y, -1, b, np.float32(0), np.float32(6), K, N, 1, items, tg.BLOCK_BYTES)
    run()
    ts = []
    for _ in range(max(20, int(2e9 / (K*C*N*30)))):
        t = time.perf_counter(); run(); ts.append(time.perf_counter() - t)
    t0 = min(ts)
    ref = (w @ x[0]).reshape(-1)
    err = float(np.max(np.abs(np.clip(ref, 0, 6) - y)))
    ts2 = []
    o = np.empty((K, N), np.float32)
    for _ in range(len(ts)):
        t = time.perf_counter(); np.matmul(w, x[0], out=o); ts2.append(time.perf_counter() - t)
    print(f"{K}x{C}x{N}: tile {t0*1e6:.1f} us {K*C*N/t0/1e9:.1f} GMAC/s | openblas {min(ts2)*1e6:.1f} us {K*C*N/min(ts2)/1e9:.1f} | err {err:.1e}")
