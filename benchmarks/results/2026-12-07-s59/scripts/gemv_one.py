import time, threading, numpy as np, numba
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from hetflow.devices.cpu.kernels import llvm_vectors as lv
W=64
@intrinsic
def panel_one(typingctx, p, start, depth, h, out, out_start):
    sig = types.void(p, start, depth, h, out, out_start)
    def codegen(context, builder, s, args):
        p_v, sa, depth_v, h_v, out_v, oa = args
        pd = lv.array_data(context, builder, s.args[0], p_v)
        hd = lv.array_data(context, builder, s.args[3], h_v)
        od = lv.array_data(context, builder, s.args[4], out_v)
        fma = lv.fused_multiply_add(builder)
        slots = lv.accumulators(builder, 1, 4)
        with cgutils.for_range(builder, depth_v) as loop:
            k = loop.index
            value = lv.load_scalar(builder, hd, k)
            vecs = lv.load_vectors(builder, pd, builder.add(sa, builder.mul(k, lv.INT(W))), 4)
            lv.multiply_add_broadcast(builder, fma, vecs, value, slots[0])
        lv.store_accumulators(builder, slots, od, oa, lv.INT(0))
        return context.get_dummy_value()
    return sig, codegen

@numba.njit(nogil=True)
def share_gemv(p, depth, h, out, first, last, backward):
    panel = depth * W
    count = last - first
    for i in range(count):
        a = last - 1 - i if backward else first + i
        panel_one(p, a * panel, depth, h, out, a * W)

@numba.njit(nogil=True)
def reps(p, depth, h, out, first, last, n, zig):
    for r in range(n):
        share_gemv(p, depth, h, out, first, last, zig and r % 2 == 1)

for depth, panels in ((320, 20), (512, 32)):
    rng=np.random.default_rng(0)
    p=rng.standard_normal(panels*depth*64).astype(np.float32)
    h=rng.standard_normal(depth).astype(np.float32); out=np.zeros(panels*64,np.float32)
    reps(p,depth,h,out,0,panels,1,False)
    ref = np.einsum('pkw,k->pw', p.reshape(panels, depth, W).astype(np.float64), h.astype(np.float64)).reshape(-1)
    assert np.allclose(out, ref, rtol=1e-4, atol=1e-3)
    N=4000
    half=panels//2
    for zig in (False, True):
        t=time.perf_counter(); reps(p,depth,h,out,0,half,N,zig); one=(time.perf_counter()-t)/N*1e6
        th=[threading.Thread(target=reps,args=(p,depth,h,out,0,half,N,zig)), threading.Thread(target=reps,args=(p,depth,h,out,half,panels,N,zig))]
        t=time.perf_counter()
        for x in th: x.start()
        for x in th: x.join()
        two=(time.perf_counter()-t)/N*1e6
        print(depth, 'zig' if zig else 'fwd', f"one thread half {one:.1f} us/rep; two threads {two:.1f} us/rep")
