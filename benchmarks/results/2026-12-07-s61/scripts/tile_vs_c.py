import ctypes, time, numpy as np
from hetflow.devices.cpu.threads import BLAS
from hetflow.devices.cpu.kernels import jit_tile_gemm as tg
BLAS.set(1)
lib = ctypes.CDLL('/tmp/s61/asm/libtile.so')
lib.run_all.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
rng = np.random.default_rng(0)
for K, C, N in ((96, 32, 2048), (96, 96, 2048), (96, 256, 2048), (96, 96, 192)):
    w = rng.standard_normal((K, C)).astype(np.float32); x = rng.standard_normal((1, C, N)).astype(np.float32)
    y = np.zeros(K * N, np.float32); b = np.zeros(K, np.float32); items = np.array([[0, 0, N]], np.int64)
    ours = lambda: tg.gemm_items(w.reshape(-1), x, y, K * N, y, -1, b, np.float32(-np.inf), np.float32(np.inf), K, N, 1, items, tg.BLOCK_BYTES)
    c = lambda: lib.run_all(C, N, x.ctypes.data, w.ctypes.data, K)
    res = {}
    for name, f in (("tile GEMM", ours), ("C depth loop only", c)) * 2:
        f(); best = 1e9
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(100): f()
            best = min(best, (time.perf_counter() - t) / 100)
        res[name] = min(res.get(name, 1e9), best)
    print(f"{K}x{C}x{N}: " + ", ".join(f"{k} {K*C*N/v/1e9:.1f} GMAC/s" for k, v in res.items()))
