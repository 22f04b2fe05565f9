import sys, cProfile, pstats
from hetflow import InferenceSession
from hetflow.estimate.validate import random_feeds
s = InferenceSession(f"zoo:{sys.argv[1]}", threads=2)
feeds = random_feeds(s, 1)
for _ in range(20): s.run(None, feeds)
pr = cProfile.Profile(); pr.enable()
for _ in range(100): s.run(None, feeds)
pr.disable()
st = pstats.Stats(pr)
rows = sorted(((v[1], k) for k, v in st.stats.items()), reverse=True)
for n, k in rows: print(f"{n/100:5.1f} {k[0].split('/')[-1]}:{k[1]}({k[2]})")
