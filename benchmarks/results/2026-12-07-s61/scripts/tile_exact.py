import time, numpy as np, sys
from hetflow.devices.cpu.threads import BLAS
from hetflow.devices.cpu.kernels import jit_tile_gemm as tg
BLAS.set(1)
rng = np.random.default_rng(0)
for K, C, N in ((96, 96, 192), (96, 96, 196), (96, 32, 4096), (96, 512, 192), (576, 96, 196), (96, 96, 64)):
    w = rng.standard_normal((K, C)).astype(np.float32)
    x = rng.standard_normal((1, C, N)).astype(np.float32)
    y = np.zeros(K * N, np.float32); b = np.zeros(K, np.float32)
    items = np.array([[0, 0, N]], np.int64)
    def run():
        tg.gemm_items(w.reshape(-1), x, y, K * N, y, -1, b, np.float32(-np.inf), np.float32(np.inf), K, N, 1, items, tg.BLOCK_BYTES)
    run()
    n = max(50, int(3e8 / (K * C * N)))
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): run()
        best = min(best, (time.perf_counter() - t) / n)
    print(f"{K}x{C}x{N}: {K*C*N/best/1e9:.1f} GMAC/s ({best*1e6:.1f} us)")
