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
seq = []
for entry in rep.entries:
    script = getattr(entry, 'script', None)
    if script is None: continue
    seq += list(zip(entry.owners, script.jobs))
names = [n for n, _ in seq]
plan = s.plan_for(batch_bindings(s.graph, 1))
conv_macs, direct_macs = plan_conv_work(plan)
rate = cycles_per_second()
def span(first, last):
    i, j = names.index(first), len(names) - 1 - names[::-1].index(last)
    return seq[i:j + 1]
with run_threads(conv_macs, holds_batch(feeds), 2, direct_macs, plan_recurrent_batch(plan)):
    for first, last in (('conv43', 'conv44'), ('conv45', 'conv47'), ('conv42', 'conv50'), ('conv34', 'conv50'), ('conv1', 'prob1')):
        part = span(first, last)
        script = JobScript([j for _, j in part])
        best = None
        for _ in range(300):
            t = np.asarray(replay_stamped(script, spinning()), dtype=float) / rate * 1e6
            best = t if best is None else np.minimum(best, t)
        shown = [(n, v) for (n, _), v in zip(part, best) if n in ('conv44', 'conv47', 'conv50', 'conv35', 'conv38', 'conv41')]
        print(f'{first}..{last}:', ', '.join(f'{n} {v:.1f}' for n, v in shown), f'| total {best.sum():.0f} us')
def arrays(name):
    for n, j in seq:
        if n == name:
            return [(a.ctypes.data, a.nbytes) for a in j.keep if isinstance(a, np.ndarray) and a.nbytes > 20000]
base = min(a for n in ('conv43','conv44','conv45','conv46','conv47') for a, _ in arrays(n))
for n in ('conv42','conv43','conv44','conv45','conv46','conv47','conv48'):
    print(n, [(hex(a - base), b) for a, b in arrays(n)])
