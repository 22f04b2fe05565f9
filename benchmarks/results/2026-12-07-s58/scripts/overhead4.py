import sys, time
import numpy as np
from hetflow import InferenceSession
from hetflow.runtime import replay as rp
from hetflow.devices.cpu import threads as th
from hetflow.estimate.validate import random_feeds
model = sys.argv[1]; batch = 1
if len(sys.argv) > 3: th.BLAS.set = lambda count: None
marks = {}
def wrap(cls, name, key):
    orig = getattr(cls, name)
    def f(*a, **k):
        marks[key + "0"] = time.perf_counter(); r = orig(*a, **k); marks[key + "1"] = time.perf_counter(); return r
    setattr(cls, name, f)
wrap(rp.Replay, "run", "replay")
wrap(th.own_threads, "__enter__", "enter")
wrap(th.own_threads, "__exit__", "exit")
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, batch)
for _ in range(20): s.run(None, feeds)
rows = []
for _ in range(300):
    t = time.perf_counter(); s.run(None, feeds); e = time.perf_counter()
    rows.append([marks["enter0"] - t, marks["enter1"] - marks["enter0"], marks["replay0"] - marks["enter1"],
                 marks["exit0"] - marks["replay1"], marks["exit1"] - marks["exit0"], e - marks["exit1"]])
rows = np.array(rows) * 1e6
names = ["to enter", "enter", "enter->replay", "replay->exit", "exit", "exit->end"]
print(model, " ".join(f"{n}: {rows[:, i].min():.1f}/{np.median(rows[:, i]):.1f}" for i, n in enumerate(names)))
