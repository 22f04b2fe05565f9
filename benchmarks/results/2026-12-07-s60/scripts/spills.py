import numpy as np, numba, re, sys
from hetflow.devices.cpu.kernels import jit_winograd_lanes as wl
which = sys.argv[1] if len(sys.argv) > 1 else 'in'
if which == 'in':
    f = numba.njit(wl.input_channels.py_func)
    x=np.zeros(64*256,np.float32); t=wl.tile_table(1,(4,4),4,(-1,-1),16,64*256)
    v=np.zeros(36*64*16,np.float32)
    f(x,t,16,64,16,16,v,0,64,4)
else:
    f = numba.njit(wl.output_kernels.py_func)
    p=np.zeros(36*64*16,np.float32); t=wl.tile_table(1,(4,4),4,(0,0),16,64*256)
    y=np.zeros(64*256,np.float32); b=np.zeros(64,np.float32); a=np.zeros(3,np.float32)
    f(p,t,16,64,16,16,y,b,a,0,64,4)
asm = list(f.inspect_asm().values())[0]
lines=[l for l in asm.splitlines() if l.startswith('\t')]
print('spill stores:', sum(1 for l in lines if re.search(r'vmov[ua]ps\s+%zmm\d+, -?\d*\(%rsp\)', l)), 'reloads:', sum(1 for l in lines if re.search(r'\(%rsp\), %zmm', l)),
      'gathers', sum('vgatherdps' in l for l in lines), 'scatters', sum('vscatterdps' in l for l in lines), 'lines', len(lines))
