import time, numpy as np
from hetflow.devices.cpu.threads import BLAS
from hetflow.devices.cpu.kernels import jit_tile_gemm as tg
BLAS.set(1)
rng = np.random.default_rng(0)
K, N = 96, 2048
ghz = 3.6
for rep in range(2):
    pts = []
    for C in (8, 16, 32, 64, 128, 256):
        w = rng.standard_normal((K, C)).astype(np.float32); x = rng.standard_normal((1, C, N)).astype(np.float32)
        y = np.zeros(K * N, np.float32); b = np.zeros(K, np.float32); items = np.array([[0, 0, N]], np.int64)
        run = lambda: tg.gemm_items(w.reshape(-1), x, y, K * N, y, -1, b, np.float32(-np.inf), np.float32(np.inf), K, N, 1, items, tg.BLOCK_BYTES)
        run(); best = 1e9
        for _ in range(7):
            t = time.perf_counter()
            for _ in range(200): run()
            best = min(best, (time.perf_counter() - t) / 200)
        tiles = (K // 6) * (N // 64)
        pts.append((C, best / tiles * ghz * 1e9))
    cs = np.array([p[0] for p in pts]); cyc = np.array([p[1] for p in pts])
    slope, icpt = np.polyfit(cs, cyc, 1)
    print(" ".join(f"d{c}:{v:.0f}" for c, v in pts), f"-> {slope:.1f} cycles per k (24 ideal), {icpt:.0f} cycles per tile fixed (at {ghz} GHz)")
