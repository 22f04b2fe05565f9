import time, numpy as np
from hetflow.devices.cpu.kernels import jit_tile_gemm as tg
rng = np.random.default_rng(0)
flush = np.ones(48 << 20 >> 2, np.float32)
for K, C, N in ((576, 96, 196), (160, 960, 49), (64, 384, 196), (384, 64, 196), (16, 32, 12544)):
    w = rng.standard_normal((K, C)).astype(np.float32)
    x = rng.standard_normal((1, C, N)).astype(np.float32)
    y = np.zeros(K * N, np.float32); b = np.zeros(K, np.float32)
    items = np.array([[0, 0, N]], np.int64)
    def run():
        tg.gemm_items(w.reshape(-1), x, y, K * N, y, -1, b, np.float32(0), np.float32(6), K, N, 1, items, tg.BLOCK_BYTES)
    run()
    warm, cold = [], []
    for i in range(40):
        flush += 1.0  # evict everything
        x += 0.0; y += 0.0  # X and Y back in cache, W not
        t = time.perf_counter(); run(); cold.append(time.perf_counter() - t)
        t = time.perf_counter(); run(); warm.append(time.perf_counter() - t)
    print(f"{K}x{C}x{N} (W {K*C*4>>10} KB): warm {min(warm)*1e6:.1f} us, W cold {min(cold)*1e6:.1f} us ({min(cold)/min(warm):.2f}x)")
