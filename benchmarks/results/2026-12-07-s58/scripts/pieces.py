import sys, time, timeit
import numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.runtime import executor as ex
from hetflow.runtime import session as se
from hetflow.devices.cpu import threads as th
model = sys.argv[1]
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, 1)
for _ in range(20): s.run(None, feeds)
names = s._all_outputs
plan = s._accepted[se._signature(feeds)]
wanted = tuple(names)
prog = ex.compiled(plan, wanted)
def t(label, f, n=2000):
    v = min(timeit.repeat(f, number=n, repeat=5)) / n * 1e6
    print(f"{label:40s} {v:7.2f} us")
t("session.run", lambda: s.run(None, feeds), 300)
t("_images_for", lambda: s._images_for(feeds))
t("_signature", lambda: se._signature(feeds))
t("compiled", lambda: ex.compiled(plan, wanted))
t("holds_batch", lambda: ex.holds_batch(feeds))
t("thread_arrangement", lambda: ex.thread_arrangement(prog.conv_macs, False, 2, prog.direct_macs, prog.recurrent_batch))
arr = ex.thread_arrangement(prog.conv_macs, False, 2, prog.direct_macs, prog.recurrent_batch)
print(arr)
t("arrangement.hold()", lambda: arr.hold())
def enter_exit():
    with arr.hold(): pass
t("hold enter+exit", enter_exit)
t("environment", lambda: prog.environment(feeds))
def acq():
    a = prog._acquire("sequential"); prog._release("sequential", a)
t("acquire+release", acq)
t("replay_key", th.replay_key)
def prog_run():
    with arr.hold(): prog.run(feeds, True)
t("hold + program.run", prog_run, 300)
