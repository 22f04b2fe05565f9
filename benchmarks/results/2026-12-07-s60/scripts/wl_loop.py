import time, sys, numpy as np
from hetflow.devices.cpu.kernels import jit_winograd_lanes as wl
import os
n,c,h,w,m,pad=1,int(os.environ.get("C","64")),16,16,int(os.environ.get("M","4")),1
a=m+2
x=np.random.default_rng(0).standard_normal((n,c,h,w)).astype(np.float32)
oh,ow=h,w; tiles=(16//m,16//m); T=tiles[0]*tiles[1]
table=wl.tile_table(n,tiles,m,(-pad,-pad),w,c*h*w)
v=np.zeros((a*a,c,T),np.float32)
k=64
prods=np.random.default_rng(1).standard_normal((a*a,k,T)).astype(np.float32)
y=np.zeros((n,k,oh,ow),np.float32); bias=np.zeros(k,np.float32); act=np.array([1,-np.inf,np.inf],np.float32)
ot=wl.tile_table(n,tiles,m,(0,0),ow,k*oh*ow)
which=sys.argv[1]
ts=[]
for i in range(3000):
    t0=time.perf_counter()
    if which=='in': wl.input_channels(x.reshape(-1),table,T,c,h,w,v.reshape(-1),0,c,m)
    else: wl.output_kernels(prods.reshape(-1),ot,T,k,oh,ow,y.reshape(-1),bias,act,0,k,m)
    ts.append(time.perf_counter()-t0)
print('min %.1f med %.1f us'%(min(ts)*1e6, np.median(ts)*1e6))
