import subprocess, tempfile, numpy as np, onnx
from hetflow.estimate import probes as P
from hetflow.estimate.timing import amortised_seconds
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.threads import own_threads
from hetflow.frontends import load_model
from hetflow.passes.manager import optimize
from hetflow.runtime.planner import input_infos
for steps, batch, feat, hidden in [(50,1,6,512),(60,1,6,384),(80,1,6,320),(100,1,6,256),(100,1,6,512)]:
    m = P.lstm(steps, batch, feat, hidden, last_only=not (feat == 64))()
    path = tempfile.mktemp(suffix='.onnx'); onnx.save(m, path)
    out = subprocess.run(['hetflow', 'estimate', path], capture_output=True, text=True).stdout
    pred = [l for l in out.splitlines() if l.strip().startswith('LSTM')]
    g = optimize(load_model(m))
    node = [n for n in g.nodes if n.op_type == 'LSTM'][0]
    k = CPUDevice().kernels.lookup(node, input_infos(g, node))
    x = np.random.default_rng(1).random((steps, batch, feat), dtype=np.float32) - 0.5
    arrays = [x if n == node.inputs[0] else (g.initializers.get(n) if n else None) for n in node.inputs]
    weights = [i for i, n in enumerate(node.inputs) if n in g.initializers]
    with own_threads(2, spin=True, hold_blas=True):
        call = k.steady_call(node, arrays, None, weights); call()
        t = amortised_seconds(call, min_time=0.05, rounds=5)
    print(steps, batch, feat, hidden, 'measured %.3f ms' % (t*1e3), pred[:1])
