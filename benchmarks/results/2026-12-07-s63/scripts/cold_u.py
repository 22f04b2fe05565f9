"""A Winograd layer's products at batch 1 on one core (the tile GEMM, grouped by tile element), with the
transformed weights U cold (everything flushed by a 48 MB pass, then V and the products touched again)
against warm. Shapes: DenseNet's 128 -> 32 at 14x14 and 28x28 (F(4,3): 16 and 49 tiles), GoogLeNet-like
96 -> 128 and 128 -> 192 at 28x28, ResNet-50's 256 -> 256 at 14x14.

    python cold_u.py            # U on 4 KB pages
    python cold_u.py --huge     # U on 4 KB pages and on transparent huge pages (madvise), alternated
"""
import mmap
import sys
import time

import numpy as np

from hetflow.devices.cpu.kernels import jit_tile_gemm as tg

HUGE = 2 << 20
E = 36
SHAPES = ((128, 32, 16), (128, 32, 49), (96, 128, 49), (128, 192, 49), (256, 256, 16))


def huge_array(shape):
    nbytes = int(np.prod(shape)) * 4
    region = mmap.mmap(-1, nbytes + HUGE)
    region.madvise(mmap.MADV_HUGEPAGE)
    base = np.frombuffer(region, np.uint8)
    offset = (-base.ctypes.data) % HUGE
    return base[offset:offset + nbytes].view(np.float32).reshape(shape)


def cold_and_warm(u, v, flush):
    """The fastest of 40 calls with U cold and of 40 with everything warm, in seconds."""
    count = v.shape[2]
    y = np.zeros(E * u.shape[0] // E * count, np.float32)
    b = np.zeros(u.shape[0], np.float32)
    items = np.array([[0, 0, count]], np.int64)

    def run():
        tg.gemm_items(u.reshape(-1), v, y, y.size, y, -1, b, np.float32(-np.inf), np.float32(np.inf), u.shape[0],
                      count, E, items, tg.BLOCK_BYTES)

    run()
    warm, cold = [], []
    for _ in range(40):
        flush += 1.0
        v += 0.0
        y += 0.0
        started = time.perf_counter(); run(); cold.append(time.perf_counter() - started)
        started = time.perf_counter(); run(); warm.append(time.perf_counter() - started)
    return min(cold), min(warm)


rng = np.random.default_rng(0)
flush = np.ones(48 << 20 >> 2, np.float32)
kinds = ("4k", "huge", "4k", "huge") if "--huge" in sys.argv else ("4k",)
for C, K, T in SHAPES:
    for kind in kinds:
        u = rng.standard_normal((E * K, C)).astype(np.float32)
        if kind == "huge":
            placed = huge_array(u.shape)
            placed[...] = u
            u = placed
        v = rng.standard_normal((1, E * C, T)).astype(np.float32)
        cold, warm = cold_and_warm(u, v, flush)
        print(f"{kind:5s} C {C} K {K} T {T} (U {u.nbytes >> 10} KB): warm {warm * 1e6:.1f} us, U cold {cold * 1e6:.1f} us "
              f"({cold / warm:.2f}x; lost {(cold - warm) * 1e6:.1f} us, {u.nbytes / (cold - warm) / 1e9:.1f} GB/s)")
