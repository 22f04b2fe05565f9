"""A Winograd layer's products at batch 1 on one core (the tile GEMM, grouped by tile element), with the
transformed weights U cold (everything flushed by a 48 MB pass, then V and the products touched again)
against warm. Shapes: DenseNet's 128 -> 32 at 14x14 and 28x28 (F(4,3): 16 and 49 tiles), GoogLeNet's
96 -> 128 and 128 -> 192 at 28x28, ResNet-50's 256 -> 256 at 14x14."""
import time

import numpy as np

from hetflow.devices.cpu.kernels import jit_tile_gemm as tg

rng = np.random.default_rng(0)
flush = np.ones(48 << 20 >> 2, np.float32)
E = 36
for C, K, T in ((128, 32, 16), (128, 32, 49), (96, 128, 49), (128, 192, 49), (256, 256, 16)):
    u = rng.standard_normal((E * K, C)).astype(np.float32)
    v = rng.standard_normal((1, E * C, T)).astype(np.float32)
    y = np.zeros(E * K * T, np.float32)
    b = np.zeros(E * K, np.float32)
    items = np.array([[0, 0, T]], np.int64)

    def run():
        tg.gemm_items(u.reshape(-1), v, y, E * K * T, y, -1, b, np.float32(-np.inf), np.float32(np.inf), E * K, T, E,
                      items, tg.BLOCK_BYTES)

    run()
    warm, cold = [], []
    for i in range(40):
        flush += 1.0
        v += 0.0
        y += 0.0
        t = time.perf_counter(); run(); cold.append(time.perf_counter() - t)
        t = time.perf_counter(); run(); warm.append(time.perf_counter() - t)
    lost = min(cold) - min(warm)
    print(f"C {C} K {K} T {T} (U {u.nbytes >> 10} KB): warm {min(warm) * 1e6:.1f} us, U cold {min(cold) * 1e6:.1f} us "
          f"({min(cold) / min(warm):.2f}x; {u.nbytes / lost / 1e9:.1f} GB/s lost)")
