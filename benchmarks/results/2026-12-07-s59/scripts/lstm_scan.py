import time, sys, numpy as np
from hetflow.devices.cpu.kernels import jit_lstm
from hetflow.devices.cpu.kernels.jit_gate_panels import packed_gates
from hetflow.devices.cpu.threads import own_threads
hidden=int(sys.argv[1]); seq=100
rng=np.random.default_rng(0)
r=(rng.standard_normal((4*hidden,hidden))/np.sqrt(hidden)).astype(np.float32)
w=rng.standard_normal((4*hidden,6)).astype(np.float32)
b=np.zeros(4*hidden,np.float32)
x_t=rng.standard_normal((seq,6,1)).astype(np.float32)
panels=(packed_gates(r), packed_gates(w))
def run():
    h=np.zeros((hidden,1),np.float32); c=np.zeros((hidden,1),np.float32)
    return jit_lstm.scan(r,w,b,x_t,h,c,False,None,panels)
with own_threads(2, spin=True, hold_blas=True):
    run()
    ts=[]
    for i in range(50):
        a=time.perf_counter(); run(); ts.append(time.perf_counter()-a)
print(hidden, 'scan min %.3f med %.3f ms'%(min(ts)*1e3, np.median(ts)*1e3))
