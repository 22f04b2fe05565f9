import time, numpy as np
from hetflow.estimate import probes as P
import hetflow
m = P.lstm(30, 16, 6, 512, last_only=True)()
s = hetflow.InferenceSession(m, threads=2)
inp = m.graph.input[0]
rng = np.random.default_rng(1)
cases = {'normal': rng.standard_normal((30,16,6)).astype(np.float32),
         'uniform±0.5': (rng.random((30,16,6), dtype=np.float32) - 0.5),
         'normal x10': rng.standard_normal((30,16,6)).astype(np.float32) * 10}
for rep in range(2):
    for k, x in cases.items():
        feeds = {inp.name: x}
        for i in range(3): s.run(None, feeds)
        ts=[]
        for i in range(20):
            t=time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter()-t)
        print(k, 'min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
