import time, numpy as np, cProfile, pstats
import hetflow
from hetflow.zoo import model_path
s = hetflow.InferenceSession(str(model_path('lstm-gesture')), threads=2)
x = np.random.default_rng(0).standard_normal((1, 100, 6)).astype(np.float32)
feeds = {'data': x}
for i in range(5): s.run(None, feeds)
ts=[]
for i in range(100):
    t=time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter()-t)
print('run min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
(prog, rep), = s.captured_runs()
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.threads import own_threads, spinning
with own_threads(2, spin=True, hold_blas=True):
    ts=[]
    for (script, owners) in rep.scripts:
        for i in range(50):
            t=time.perf_counter(); spin_pool.replay_on(script, spinning()); ts.append(time.perf_counter()-t)
print('replay only min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
pr=cProfile.Profile(); pr.enable()
for i in range(50): s.run(None, feeds)
pr.disable(); pstats.Stats(pr).sort_stats('tottime').print_stats(8)
