import numpy as np
from hetflow.estimate import probes as P
from hetflow.estimate.timing import amortised_seconds
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.threads import own_threads
from hetflow.frontends import load_model
from hetflow.passes.manager import optimize
from hetflow.runtime.planner import input_infos
g = optimize(load_model(P.lstm(30, 16, 6, 512, last_only=True)()))
node = [n for n in g.nodes if n.op_type == 'LSTM'][0]
k = CPUDevice().kernels.lookup(node, input_infos(g, node))
rng = np.random.default_rng(1)
x = rng.random((30, 16, 6), dtype=np.float32) - 0.5
arrays = [x if n == node.inputs[0] else (g.initializers.get(n) if n else None) for n in node.inputs]
weights = [i for i, n in enumerate(node.inputs) if n in g.initializers]
for hold in (True, False):
    with own_threads(2, spin=True, hold_blas=hold):
        call = k.steady_call(node, arrays, None, weights)
        call()
        print('hold_blas', hold, 'amortised %.3f ms' % (amortised_seconds(call, min_time=0.05, rounds=5) * 1e3))
call = k.steady_call(node, arrays, None, weights)
call()
print('no pool amortised %.3f ms' % (amortised_seconds(call, min_time=0.05, rounds=5) * 1e3))
