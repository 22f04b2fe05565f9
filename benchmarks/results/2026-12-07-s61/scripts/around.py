import sys, time, numpy as np
sys.path.insert(0, '/work/main/benchmarks')
from replay_timeline import captured_replay
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.devices.cpu.spin_pool import replay_on
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads
from hetflow.estimate.predict import batch_bindings
from hetflow.devices.cpu.threads import spinning
model = sys.argv[1]; batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, batch)
for _ in range(5): s.run(None, feeds)
rep = captured_replay(s)
plan = s.plan_for(batch_bindings(s.graph, batch))
cm, dm = plan_conv_work(plan)
def whole():
    t = time.perf_counter(); s.run(None, feeds); return time.perf_counter() - t
def jobs():
    t = time.perf_counter()
    for script, owners in rep.scripts: replay_on(script, spinning())
    return time.perf_counter() - t
for rnd in range(3):
    w = min(whole() for _ in range(200))
    with run_threads(cm, holds_batch(feeds), 2, dm, plan_recurrent_batch(plan)):
        j = min(jobs() for _ in range(200))
    print(f"whole {w*1e3:.3f} ms  jobs only {j*1e3:.3f}  around {1e3*(w-j):.3f}  scripts {len(rep.scripts)}")
