import time, numpy as np, numba
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from hetflow.devices.cpu.kernels import llvm_vectors as lv
from hetflow.devices.cpu.kernels.jit_lstm import _row_dots

W = 64  # panel columns

@intrinsic
def panel_pair(typingctx, p, start_a, start_b, depth, h, out, out_a, out_b):
    sig = types.void(p, start_a, start_b, depth, h, out, out_a, out_b)
    def codegen(context, builder, s, args):
        p_v, sa, sb, depth_v, h_v, out_v, oa, ob = args
        pd = lv.array_data(context, builder, s.args[0], p_v)
        hd = lv.array_data(context, builder, s.args[4], h_v)
        od = lv.array_data(context, builder, s.args[5], out_v)
        fma = lv.fused_multiply_add(builder)
        slots = lv.accumulators(builder, 2, 4)
        with cgutils.for_range(builder, depth_v) as loop:
            k = loop.index
            value = lv.load_scalar(builder, hd, k)
            row = builder.mul(k, lv.INT(W))
            for which, start in enumerate((sa, sb)):
                vecs = lv.load_vectors(builder, pd, builder.add(start, row), 4)
                lv.multiply_add_broadcast(builder, fma, vecs, value, slots[which])
        for which, start in enumerate((oa, ob)):
            for v, slot in enumerate(slots[which]):
                ptr = lv.vector_pointer(builder, od, builder.add(start, lv.INT(16 * v)))
                builder.store(builder.load(slot), ptr, align=4)
        return context.get_dummy_value()
    return sig, codegen

@numba.njit(nogil=True)
def share_gemv(p, depth, h, out, first, last, backward):
    panel = depth * W
    count = last - first
    for i in range(0, count, 2):
        a = last - 2 - i if backward else first + i
        panel_pair(p, a * panel, (a + 1) * panel, depth, h, out, a * W, (a + 1) * W)

def bench(hidden, panels, reps=200):
    depth = hidden
    rng = np.random.default_rng(0)
    p = rng.standard_normal(panels * depth * W).astype(np.float32)
    h = rng.standard_normal(depth).astype(np.float32)
    out = np.zeros(panels * W, np.float32)
    # check
    share_gemv(p, depth, h, out, 0, panels, False)
    ref = np.einsum('pkw,k->pw', p.reshape(panels, depth, W).astype(np.float64), h.astype(np.float64)).reshape(-1)
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)
    res = {}
    for mode in ('fwd', 'zig'):
        ts = []
        for r in range(reps):
            t = time.perf_counter()
            share_gemv(p, depth, h, out, 0, panels, mode == 'zig' and r % 2 == 1)
            ts.append(time.perf_counter() - t)
        res[mode] = min(ts) * 1e6, np.median(ts) * 1e6
    # row dots on equivalent rows
    m = rng.standard_normal(panels * W * depth).astype(np.float32)
    base = np.zeros(panels * W, np.float32); o2 = np.zeros_like(base)
    _row_dots(m, 0, panels * W, depth, h, base, o2)
    ts = []
    for r in range(reps):
        t = time.perf_counter(); _row_dots(m, 0, panels * W, depth, h, base, o2); ts.append(time.perf_counter() - t)
    res['rowdots'] = min(ts) * 1e6, np.median(ts) * 1e6
    mb = p.nbytes / 2**20
    print(f"hidden {hidden} panels {panels} ({mb:.2f} MB):", {k: f"{a:.1f}/{b:.1f} us" for k, (a, b) in res.items()})

for hidden, panels in ((320, 10), (512, 8), (512, 12), (512, 16), (512, 24), (512, 32)):
    bench(hidden, panels)

if __name__ == "__main__" and False:
    pass
