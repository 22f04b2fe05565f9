"""cold_u.py's products with U on 4 KB pages against U on transparent huge pages (madvise)."""
import mmap
import time

import numpy as np

from hetflow.devices.cpu.kernels import jit_tile_gemm as tg

HUGE = 2 << 20


def huge_array(shape):
    nbytes = int(np.prod(shape)) * 4
    region = mmap.mmap(-1, nbytes + HUGE)
    region.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(region, np.uint8)
    offset = (-base.ctypes.data) % HUGE
    out = base[offset:offset + nbytes].view(np.float32).reshape(shape)
    out[...] = 0
    return out


rng = np.random.default_rng(0)
flush = np.ones(48 << 20 >> 2, np.float32)
E = 36
for C, K, T in ((128, 32, 16), (128, 32, 49), (128, 192, 49), (256, 256, 16)):
    for kind in ("4k", "huge", "4k", "huge"):
        u = rng.standard_normal((E * K, C)).astype(np.float32)
        if kind == "huge":
            h = huge_array(u.shape); h[...] = u; u = h
        v = rng.standard_normal((1, E * C, T)).astype(np.float32)
        y = np.zeros(E * K * T, np.float32)
        b = np.zeros(E * K, np.float32)
        items = np.array([[0, 0, T]], np.int64)

        def run():
            tg.gemm_items(u.reshape(-1), v, y, E * K * T, y, -1, b, np.float32(-np.inf), np.float32(np.inf), E * K, T,
                          E, items, tg.BLOCK_BYTES)

        run()
        warm, cold = [], []
        for i in range(40):
            flush += 1.0
            v += 0.0
            y += 0.0
            t = time.perf_counter(); run(); cold.append(time.perf_counter() - t)
            t = time.perf_counter(); run(); warm.append(time.perf_counter() - t)
        lost = min(cold) - min(warm)
        print(f"{kind:5s} C {C} K {K} T {T} (U {u.nbytes >> 10} KB): warm {min(warm) * 1e6:.1f} us, U cold "
              f"{min(cold) * 1e6:.1f} us ({min(cold) / min(warm):.2f}x; lost {lost * 1e6:.1f} us)")
