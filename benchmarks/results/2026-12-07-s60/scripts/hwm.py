import sys, os
tree, model, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
def hwm():
    for l in open('/proc/self/status'):
        if l.startswith('VmHWM'): return int(l.split()[1])//1024
import numpy as np
import hetflow
a=hwm()
s = hetflow.InferenceSession(f"zoo:{model}", threads=2)
b=hwm()
inp = s.get_inputs()[0]
shape=[batch if not isinstance(d,int) else d for d in inp.shape]
x=np.random.default_rng(0).standard_normal(shape).astype(np.float32)
for i in range(3): s.run(None,{inp.name:x})
c=hwm()
print(tree, model, batch, 'import', a, 'session', b, 'runs', c)
