import time, numpy as np
from hetflow.estimate import probes as P
from hetflow.devices.cpu.threads import own_threads
import hetflow
m = P.lstm(30, 16, 6, 512, last_only=True)()
s = hetflow.InferenceSession(m, threads=2)
name = s.graph.inputs[0] if hasattr(s.graph,'inputs') else None
inp = [v for v in m.graph.input][0]
shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
feeds = {inp.name: x}
for i in range(3): s.run(None, feeds)
ts=[]
for i in range(30):
    t=time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter()-t)
print('session min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
from hetflow.devices.cpu import CPUDevice
from hetflow.runtime.planner import input_infos
g = s.graph
node = [n for n in g.nodes if n.op_type == 'LSTM'][0]
kernel = CPUDevice().kernels.lookup(node, input_infos(g, node))
arrays = [x if n == inp.name else g.initializers.get(n) for n in node.inputs]
for hold in (True, False):
    with own_threads(2, spin=True, hold_blas=hold):
        for i in range(3): kernel(node, arrays)
        ts=[]
        for i in range(30):
            t=time.perf_counter(); kernel(node, arrays); ts.append(time.perf_counter()-t)
    print('kernel hold_blas', hold, 'min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
