"""One-off (s46): the in-run cache models side by side on saved measurements, with one profile.

    python benchmarks/results/2026-12-06-s46/cache_models.py MEASURED.json PROFILE.json

For every row of an ``estimate_accuracy.py --json`` file: the estimate's error against the measured run
with the run's cold bytes read off (a) an LRU cache of 32 MiB (the model before s46, at the size sysfs
reports), (b) the profile's copy curve, (c) its re-read curve (``HitCurve.of``, the model since s46).
Only the in-run term differs between the three; layers and overheads are the profile's.
"""

import json
import sys
import types

import numpy as np

import hetflow.estimate.predict  # noqa: F401

predict = sys.modules["hetflow.estimate.predict"]
from hetflow.estimate.cache import HitCurve  # noqa: E402
from hetflow.estimate.predict import estimate, resolve_profile  # noqa: E402

MIB = 1 << 20
profile = resolve_profile(sys.argv[2])
rows = json.load(open(sys.argv[1]))["rows"]
models = {
    "lru32": lambda distance: 1.0 if distance < 32 * MIB else 0.0,
    "copy": HitCurve(profile.memory.working_set_bytes, profile.memory.bandwidth_gbs),
    "reread": HitCurve.of(profile.memory),
}
errors: dict[str, list[float]] = {name: [] for name in models}
table = {}
for name, curve in models.items():
    predict.HitCurve = types.SimpleNamespace(of=lambda memory, curve=curve: curve)
    for row in rows:
        result = estimate(f"zoo:{row['model']}", profile, row["batch"])
        error = (result.predicted_ms / row["measured_ms"] - 1) * 100
        errors[name].append(error)
        table.setdefault((row["model"], row["batch"]), []).append(f"{error:+6.1f}% ({result.in_run_ms:5.2f})")
print(f"{'model':14s} batch  " + "  ".join(f"{name + ' (in-run ms)':>17s}" for name in models))
for (model, batch), cells in table.items():
    print(f"{model:14s} {batch:5d}  " + "  ".join(f"{cell:>17s}" for cell in cells))
for name, values in errors.items():
    spread = np.abs(values)
    print(f"{name:7s} within +-10%: {int((spread <= 10).sum())} of {len(values)}, MAPE {spread.mean():.2f}%, worst {spread.max():.1f}%")
