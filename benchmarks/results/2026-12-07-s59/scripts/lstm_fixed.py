import time, numpy as np
from hetflow.estimate import probes as P
import hetflow
for steps in (5, 10, 30, 100):
    for batch in (16, 1):
        m = P.lstm(steps, batch, 6, 512, last_only=True)()
        s = hetflow.InferenceSession(m, threads=2)
        inp = m.graph.input[0]
        x = np.random.default_rng(0).standard_normal((steps, batch, 6)).astype(np.float32)
        feeds = {inp.name: x}
        for i in range(3): s.run(None, feeds)
        ts=[]
        for i in range(30):
            t=time.perf_counter(); s.run(None, feeds); ts.append(time.perf_counter()-t)
        print(steps, batch, 'min %.3f med %.3f' % (min(ts)*1e3, np.median(ts)*1e3))
