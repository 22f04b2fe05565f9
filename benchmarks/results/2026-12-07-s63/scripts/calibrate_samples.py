"""A calibration that also keeps its final samples (what ``fit_op_models`` fitted), to refit offline.

    python calibrate_samples.py OUT_PREFIX      # writes OUT_PREFIX.json (the profile) and OUT_PREFIX.pkl
"""
import pickle
import sys

from hetflow.estimate import calibrate as calibration

prefix = sys.argv[1]
fitted = []
original = calibration.fit_op_models


def keeping(samples):
    fitted.append(list(samples))
    return original(samples)


calibration.fit_op_models = keeping
profile = calibration.calibrate("cpu", progress=False)
profile.save(prefix + ".json")
with open(prefix + ".pkl", "wb") as handle:
    pickle.dump(fitted[-1], handle)
print(f"{len(fitted[-1])} samples; wrote {prefix}.json and {prefix}.pkl")
