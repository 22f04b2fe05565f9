import time, numpy as np
from hetflow.devices.cpu.kernels import jit_lstm
from hetflow.devices.cpu.kernels.jit_gate_panels import packed_gates, share_gates
for hidden in (256, 512):
    rng=np.random.default_rng(0)
    r=(rng.standard_normal((4*hidden,hidden))/np.sqrt(hidden)).astype(np.float32)
    panels=packed_gates(r)
    seq=100
    proj=rng.standard_normal((seq,4*hidden,1)).astype(np.float32)
    states=np.zeros((2,hidden,1),np.float32); h0=np.zeros((hidden,1),np.float32); c=np.zeros((hidden,1),np.float32)
    gates=np.zeros(4*hidden,np.float32)
    f=jit_lstm._spin_vector_step
    f(panels, proj, states, h0, c, gates, False, False, 0, 0, 1)
    # check gates vs reference at step 0 (h0 zero -> gates=proj) and step 1
    f(panels, proj, states, h0, c, gates, False, False, 1, 0, 1)
    h=states[0,:,0]
    ref=proj[1,:,0]+r@h
    print('err', np.abs(gates-ref).max())
    for share,shares in ((0,1),(0,2)):
        ts=[]
        for i in range(2000):
            t=time.perf_counter(); f(panels, proj, states, h0, c, gates, False, False, 1+i%50, share, shares); ts.append(time.perf_counter()-t)
        print(hidden, shares, 'min %.1f med %.1f us'%(min(ts)*1e6, np.median(ts)*1e6))
    p=panels.reshape(-1); hh=np.ones(hidden,np.float32); pr=proj[0,:,0]
    ts=[]
    for i in range(2000):
        t=time.perf_counter(); share_gates(p, hh, pr, gates, 0, hidden//16, False); ts.append(time.perf_counter()-t)
    print(' share_gates all', 'min %.1f med %.1f us'%(min(ts)*1e6, np.median(ts)*1e6))
