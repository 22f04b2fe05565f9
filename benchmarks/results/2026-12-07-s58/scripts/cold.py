import sys, time
import numpy as np
from hetflow import InferenceSession
from hetflow.runtime import replay as rp
from hetflow.estimate.validate import random_feeds
model = sys.argv[1]; evict = int(sys.argv[2])
marks = {}
orig = rp.Replay.run
def timed(self, env, pool):
    marks["in"] = time.perf_counter(); orig(self, env, pool); marks["out"] = time.perf_counter()
rp.Replay.run = timed
s = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(s, 1)
junk = np.ones(evict // 4, np.float32)
for _ in range(20): s.run(None, feeds)
pre, post = [], []
for _ in range(300):
    if evict: junk += 1.0
    t = time.perf_counter(); s.run(None, feeds); e = time.perf_counter()
    pre.append(marks["in"] - t); post.append(e - marks["out"])
pre, post = np.array(pre) * 1e6, np.array(post) * 1e6
print(f"{model} evict {evict>>20} MB: before replay min {pre.min():.1f} med {np.median(pre):.1f} us; after min {post.min():.1f} med {np.median(post):.1f} us")
