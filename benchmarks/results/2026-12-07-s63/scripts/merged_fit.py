"""Profiles fitted on the fastest of several calibrations' samples, probe by probe (calibrate_samples.py's
kept samples, in probe order), against each calibration alone: within +-10% of the faster of two
accuracy runs' measurements per row, MAPE, and the spread between merged pairs.

    python merged_fit.py MEASURED1.json MEASURED2.json PREFIX1 PREFIX2 PREFIX3
"""
import copy
import dataclasses
import itertools
import pickle
import sys

import numpy as np

from accuracy_rows import fastest_measured

from hetflow.estimate import calibrate as calibration
from hetflow.estimate.predict import estimate, open_session
from hetflow.estimate.profile import DeviceProfile

measured = fastest_measured(sys.argv[1:3])
prefixes = sys.argv[3:]
bases = [DeviceProfile.load(p + ".json") for p in prefixes]
samples = [pickle.load(open(p + ".pkl", "rb")) for p in prefixes]
sessions = {name: open_session(f"zoo:{name}", "cpu") for name, _ in measured}


def merged(indices, how="fastest"):
    base = bases[indices[-1]]
    chosen = []
    for group in zip(*(samples[i] for i in indices)):
        assert len({s.key for s in group}) == 1
        if how == "fastest":
            chosen.append(min(group, key=lambda s: s.seconds))
        else:
            median = float(np.median([s.seconds for s in group]))
            chosen.append(dataclasses.replace(group[-1], seconds=median))
    profile = copy.copy(base)
    profile.ops = calibration.fit_op_models(chosen)
    return profile


def score(label, profiles):
    within, errors, spreads, rows = [], [], [], []
    for (model, batch), meas in sorted(measured.items()):
        totals = [estimate(sessions[model], p, batch=batch).predicted_ms for p in profiles]
        spreads.append(max(totals) / min(totals) - 1)
        errs = [t / meas - 1 for t in totals]
        errors += [abs(e) for e in errs]
        within += [abs(e) <= 0.10 for e in errs]
        rows.append((model, batch, errs))
    print(f"{label:26s} within 10%: {np.mean(within) * 100:4.0f}% MAPE {np.mean(errors) * 100:4.1f}% "
          f"spread mean {np.mean(spreads) * 100:4.1f}% max {max(spreads) * 100:4.1f}%", flush=True)
    return rows


score("each alone", bases)
pairs = [merged(pair) for pair in itertools.combinations(range(len(bases)), 2)]
score("fastest of two (3 pairs)", pairs)
score("median of three", [merged(tuple(range(len(bases))), "median")])
score("mean of two (3 pairs)", [merged(pair, "median") for pair in itertools.combinations(range(len(bases)), 2)])
rows = score("fastest of three", [merged(tuple(range(len(bases))))])
for model, batch, errs in rows:
    if abs(errs[0]) > 0.10:
        print(f"   miss: {model} {batch} {errs[0] * 100:+.1f}%")
