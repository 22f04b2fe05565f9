"""Refit calibrations' kept samples (calibrate_samples.py) with variants of the fit, and compare: how far
the calibrations' estimates of every zoo model at 1 and 16 spread, and how many land within +-10% of
the measured times of two accuracy runs (the faster of the two per row).

    python refit_variants.py MEASURED1.json MEASURED2.json PREFIX1 PREFIX2 [...]
"""
import copy
import functools
import pickle
import sys

import numpy as np

from accuracy_rows import fastest_measured

from hetflow.estimate import calibrate as calibration
from hetflow.estimate import models
from hetflow.estimate.predict import estimate, open_session
from hetflow.estimate.profile import DeviceProfile

measured = fastest_measured(sys.argv[1:3])
prefixes = sys.argv[3:]
bases = [DeviceProfile.load(p + ".json") for p in prefixes]
samples = [pickle.load(open(p + ".pkl", "rb")) for p in prefixes]
sessions = {name: open_session(f"zoo:{name}", "cpu") for name, _ in measured}
original_curve = models.fit_curve

VARIANTS = {
    "as calibrated": {},
    "refit": {"ridge": 0.5},
    "ridge 1": {"ridge": 1.0},
    "ridge 2": {"ridge": 2.0},
    "ridge 4": {"ridge": 4.0},
    "no curve": {"ridge": 1e9},
}
for name, options in VARIANTS.items():
    profiles = bases
    if options:
        calibration.fit_curve = functools.partial(original_curve, ridge=options["ridge"])
        profiles = []
        for base, kept in zip(bases, samples):
            profile = copy.copy(base)
            profile.ops = calibration.fit_op_models(kept)
            profiles.append(profile)
        calibration.fit_curve = original_curve
    spreads, within, errors = [], [], []
    for (model, batch), meas in sorted(measured.items()):
        totals = [estimate(sessions[model], p, batch=batch).predicted_ms for p in profiles]
        spreads.append(max(totals) / min(totals) - 1)
        for total in totals:
            error = total / meas - 1
            errors.append(abs(error))
            within.append(abs(error) <= 0.10)
    worst = int(np.argmax(spreads))
    print(f"{name:14s} spread mean {np.mean(spreads) * 100:5.1f}% max {max(spreads) * 100:5.1f}% "
          f"({sorted(measured)[worst]}); within 10%: {np.mean(within) * 100:4.0f}% MAPE {np.mean(errors) * 100:4.1f}%",
          flush=True)
