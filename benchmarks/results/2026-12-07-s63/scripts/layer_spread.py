"""One model's layers predicted with each profile given, the layers moving most first.

    python layer_spread.py MODEL BATCH P1.json P2.json [...]
"""
import sys

from hetflow.estimate.predict import estimate, open_session
from hetflow.estimate.profile import DeviceProfile

model, batch = sys.argv[1], int(sys.argv[2])
profiles = [DeviceProfile.load(path) for path in sys.argv[3:]]
session = open_session(f"zoo:{model}", "cpu")
results = [estimate(session, p, batch=batch) for p in profiles]
print("totals", [round(r.predicted_ms, 3) for r in results], "in-run", [round(r.in_run_ms, 3) for r in results],
      "overhead", [round(r.overhead_ms, 3) for r in results] if hasattr(results[0], "overhead_ms") else "")
rows = []
for layers in zip(*(r.layers for r in results)):
    values = [layer.predicted_ms for layer in layers]
    rows.append((max(values) - min(values), layers[0], values))
for moved, layer, values in sorted(rows, key=lambda row: -row[0])[:12]:
    gemm = layer.gemm
    shape = f"n{gemm.n} m{gemm.m} k{gemm.k}" if gemm else ""
    print(f"{layer.name:12s} {layer.op + '/' + (layer.algorithm or ''):26s} {shape:22s} "
          + " ".join(f"{v:8.3f}" for v in values) + f"  moved {moved:.3f}")
