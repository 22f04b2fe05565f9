import time, threading, numpy as np, numba
src=open('/tmp/s59/gemv_proto.py').read().split("def bench")[0]
exec(src)
@numba.njit(nogil=True)
def reps(p, depth, h, out, first, last, n, zig):
    for r in range(n):
        share_gemv(p, depth, h, out, first, last, zig and r % 2 == 1)

depth=512; panels=32
rng=np.random.default_rng(0)
p=rng.standard_normal(panels*depth*64).astype(np.float32)
h=rng.standard_normal(depth).astype(np.float32); out=np.zeros(panels*64,np.float32)
reps(p,depth,h,out,0,2,1,False)
N=4000
for zig in (False, True):
    t=time.perf_counter(); reps(p,depth,h,out,0,16,N,zig); one=(time.perf_counter()-t)/N*1e6
    ts=[]
    def run(first,last):
        reps(p,depth,h,out,first,last,N,zig)
    th=[threading.Thread(target=run,args=(0,16)), threading.Thread(target=run,args=(16,32))]
    t=time.perf_counter()
    for x in th: x.start()
    for x in th: x.join()
    two=(time.perf_counter()-t)/N*1e6
    print('zig' if zig else 'fwd', f"one thread 2MB {one:.1f} us/rep; two threads 2MB each {two:.1f} us/rep")
