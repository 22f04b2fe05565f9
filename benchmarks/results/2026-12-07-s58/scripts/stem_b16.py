import numpy as np, time
from hetflow.devices.cpu.kernels import jit_direct_stems as st, jit_direct_phases as ph, jit_direct
from hetflow.ops.spatial import geometry, WindowSpec
from hetflow.devices.cpu import threads as th
rng = np.random.default_rng(0)
def best(f, n=30):
    for _ in range(3): f()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return min(ts) * 1e3, np.median(ts) * 1e3
for (c, h, k, ks, p) in [(3,224,64,3,0), (3,224,32,3,1)]:
    x = rng.standard_normal((16,c,h,h)).astype(np.float32)
    w = rng.standard_normal((k,c,ks,ks)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    geom = geometry(WindowSpec((ks,ks),(2,2),(1,1),(p,p,p,p)), (h, h))
    y = np.zeros((16,k,*geom.out), np.float32)
    wt = jit_direct.blocked_weights(w)
    buffers = jit_direct.PartBuffers.allocate(4, ph.buffer_shapes(c, k, geom))
    sp_ph = ph.bind_block_split(x.shape, k, geom, jit_direct.RELU_BOUNDS, buffers)
    sp_st = st.bind_block_split(x.shape, k, geom, jit_direct.RELU_BOUNDS, None)
    with th.own_threads(2, spin=True):
        pool = th.spinning()
        j_ph = sp_ph.job(x, wt, b, y, 2); j_st = sp_st.job(x, wt, b, y, 2)
        for _ in range(2):
            print(f"b16 {c}->{k} pad {p}: phases {best(lambda: j_ph.run(pool))}, stems {best(lambda: j_st.run(pool))}")
