import sys, timeit
import numpy as np
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
from hetflow.runtime import executor as ex, session as se, replay as rp
from hetflow.devices.cpu import threads as th, spin_pool
model = sys.argv[1]
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, 1)
for _ in range(20): s.run(None, feeds)
steady = next(iter(s._steady.values()))
prog = steady.program
arena = prog._arenas["sequential"][0]
def t(label, f, n=3000):
    v = min(timeit.repeat(f, number=n, repeat=7)) / n * 1e6
    print(f"{label:40s} {v:7.2f} us")
t("session.run", lambda: s.run(None, feeds), 1000)
t("steady(feeds)", lambda: steady(feeds), 1000)
with steady.arrangement.hold():
    pool = th.spinning()
    key = th.replay_key()
    found = arena.replays[key]
    env = prog.environment(feeds)
    t("prog.run (held)", lambda: prog.run(feeds, True), 1000)
    t("replay.run (held)", lambda: found.run(prog.environment(feeds), pool), 1000)
    seg = [e for e in found.entries if isinstance(e, rp._Segment)]
    print("segments", len(seg), "results", [len(e.results) for e in seg], "release", [len(e.release) for e in seg], "feeds", len(found._feeds))
    script = seg[0].script
    t("replay_on", lambda: spin_pool.replay_on(script, pool), 1000)
    t("_replay direct", lambda: spin_pool._replay(pool.state, script.addresses, script.blocks, script.chunks, False, spin_pool._NO_STAMPS), 1000)
    f0 = found._feeds[0]
    x = env[f0.slot]
    t("feed take", lambda: f0.place.take(x))
    t("environment", lambda: prog.environment(feeds))
    def acq():
        a = prog._acquire("sequential"); prog._release("sequential", a)
    t("acquire+release", acq)
    t("copy_held", lambda: ex._copy_held(env, prog.output_slots, found.held))
    t("copy_out", lambda: arena.copy_out(env))
t("hold enter/exit", lambda: steady.arrangement.hold().__enter__().__exit__(None, None, None))
