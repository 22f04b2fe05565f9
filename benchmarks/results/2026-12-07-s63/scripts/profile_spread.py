"""How far calibrations apart move the estimate: every zoo model at 1 and 16 predicted with each profile
given, the spread per row, and the layer keys whose summed prediction moves most.

    python profile_spread.py P1.json P2.json [P3.json ...]
"""
import collections
import sys

from hetflow import zoo
from hetflow.estimate.predict import estimate, open_session
from hetflow.estimate.profile import DeviceProfile

profiles = [DeviceProfile.load(path) for path in sys.argv[1:]]
key_ms = collections.defaultdict(lambda: [0.0] * len(profiles))
for entry in zoo.list_models():
    session = open_session(f"zoo:{entry.name}", "cpu")
    for batch in (1, 16):
        results = [estimate(session, p, batch=batch) for p in profiles]
        totals = [r.predicted_ms for r in results]
        spread = max(totals) / min(totals) - 1
        print(f"{entry.name:14s} {batch:3d} " + " ".join(f"{t:9.2f}" for t in totals) + f"  spread {spread * 100:5.1f}%")
        for i, r in enumerate(results):
            for layer in r.layers:
                key_ms[(layer.op + "/" + (layer.algorithm or ""), batch)][i] += layer.predicted_ms
            key_ms[("in-run", batch)][i] += r.in_run_ms
print()
rows = sorted(key_ms.items(), key=lambda kv: -(max(kv[1]) - min(kv[1])))
for (key, batch), values in rows[:25]:
    print(f"{key:32s} b{batch:<3d} " + " ".join(f"{v:9.2f}" for v in values) + f"  moved {max(values) - min(values):8.2f} ms")
