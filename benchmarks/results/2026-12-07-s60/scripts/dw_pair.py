import numpy as np
from hetflow import InferenceSession
from hetflow.devices.cpu.spin_pool import JobScript, cycles_per_second, replay_stamped
from hetflow.devices.cpu.threads import spinning
from hetflow.estimate.predict import batch_bindings
from hetflow.estimate.validate import random_feeds
from hetflow.runtime.executor import holds_batch, plan_conv_work, plan_recurrent_batch, run_threads

s = InferenceSession("zoo:mobilenetv2", threads=2)
feeds = random_feeds(s, 1)
for _ in range(5): s.run(None, feeds)
(program, rep), = s.captured_runs()[:1]
jobs = {}
order = []
for entry in rep.entries:
    script = getattr(entry, 'script', None)
    if script is None: continue
    for job, owner in zip(script.jobs, entry.owners):
        jobs.setdefault(owner, []).append(job); order.append(owner)
plan = s.plan_for(batch_bindings(s.graph, 1))
conv_macs, direct_macs = plan_conv_work(plan)
rate = cycles_per_second()
pairs = [('conv43','conv44'), ('conv46','conv47'), ('conv49','conv50'), ('conv44',), ('conv47',), ('conv50',), ('conv46','conv44'), ('conv43','conv47')]
with run_threads(conv_macs, holds_batch(feeds), 2, direct_macs, plan_recurrent_batch(plan)):
    for pair in pairs:
        script = JobScript([j for name in pair for j in jobs[name]])
        best = None
        for _ in range(400):
            c = replay_stamped(script, spinning())
            t = np.asarray(c, dtype=float) / rate * 1e6
            best = t if best is None else np.minimum(best, t)
        print(pair, ' '.join(f'{v:.1f}' for v in best), 'us')
from hetflow.devices.cpu.spin_pool import Job
print('lane GEMM chunks', [j.chunks for j in jobs['conv43']], 'dw chunks', [j.chunks for j in jobs['conv44']])
with run_threads(conv_macs, holds_batch(feeds), 2, direct_macs, plan_recurrent_batch(plan)):
    for dw_chunks in (2, 4, 8, 16):
        for gemm_chunks in (2, 4):
            g = jobs['conv43'][0]; d = jobs['conv44'][0]
            script = JobScript([Job(g.address, g.block, gemm_chunks, g.keep), Job(d.address, d.block, dw_chunks, d.keep)])
            best = None
            for _ in range(400):
                t = np.asarray(replay_stamped(script, spinning()), dtype=float) / rate * 1e6
                best = t if best is None else np.minimum(best, t)
            print('gemm chunks', gemm_chunks, 'dw chunks', dw_chunks, ' '.join(f'{v:.1f}' for v in best), 'us')
