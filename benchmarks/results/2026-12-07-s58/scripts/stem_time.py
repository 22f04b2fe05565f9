import numpy as np, time, sys
from hetflow.devices.cpu.kernels import jit_direct_stems as st, jit_direct_phases as ph, jit_direct
from hetflow.ops.spatial import geometry, WindowSpec
rng = np.random.default_rng(0)
def best(f, n=200):
    for _ in range(10): f()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts) * 1e6
for (c, h, k, ks, p) in [(3,224,32,3,1), (3,224,24,3,1), (3,224,64,3,0), (3,224,64,7,3), (3,224,96,7,3)]:
    x = rng.standard_normal((1,c,h,h)).astype(np.float32)
    w = rng.standard_normal((k,c,ks,ks)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    geom = geometry(WindowSpec((ks,ks),(2,2),(1,1),(p,p,p,p)), (h, h))
    y = np.zeros((1,k,*geom.out), np.float32)
    wt = jit_direct.blocked_weights(w)
    bufshape = ph.buffer_shapes(c, k, geom)
    buffers = jit_direct.PartBuffers.allocate(1, bufshape)
    one_ph = ph.bind_one_part(x.shape, k, geom, jit_direct.RELU_BOUNDS, buffers)
    one_st = st.bind_one_part(x.shape, k, geom, jit_direct.RELU_BOUNDS, None)
    t_ph = best(lambda: one_ph(x, wt, b, y))
    t_st = best(lambda: one_st(x, wt, b, y))
    macs = k * c * ks * ks * geom.out[0] * geom.out[1]
    print(f"{c}->{k} {ks}x{ks}/2 pad {p} at {h}: phases {t_ph:7.1f} us, stems {t_st:7.1f} us  ({macs/t_st/1e3:.1f} GMAC/s)")

from hetflow.devices.cpu import threads as th
print("two spinning threads")
for (c, h, k, ks, p) in [(3,224,32,3,1), (3,224,24,3,1), (3,224,64,3,0), (3,224,64,7,3)]:
    x = rng.standard_normal((1,c,h,h)).astype(np.float32)
    w = rng.standard_normal((k,c,ks,ks)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    geom = geometry(WindowSpec((ks,ks),(2,2),(1,1),(p,p,p,p)), (h, h))
    y = np.zeros((1,k,*geom.out), np.float32)
    wt = jit_direct.blocked_weights(w)
    buffers = jit_direct.PartBuffers.allocate(4, ph.buffer_shapes(c, k, geom))
    sp_ph = ph.bind_block_split(x.shape, k, geom, jit_direct.RELU_BOUNDS, buffers)
    sp_st = st.bind_block_split(x.shape, k, geom, jit_direct.RELU_BOUNDS, None)
    with th.own_threads(2, spin=True) as arrangement:
        pool = th.spinning()
        res = {}
        for parts in (2, 4):
            j_ph = sp_ph.job(x, wt, b, y, parts); j_st = sp_st.job(x, wt, b, y, parts)
            res[parts] = (best(lambda: j_ph.run(pool)), best(lambda: j_st.run(pool)))
    print(f"{c}->{k} {ks}x{ks}/2 pad {p}: " + ", ".join(f"{parts} parts phases {a:6.1f} stems {s:6.1f}" for parts, (a, s) in res.items()))
