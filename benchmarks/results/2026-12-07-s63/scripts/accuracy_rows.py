"""The measured side of estimate_accuracy.py's JSON files, for the refitting scripts beside this one."""
import json

import numpy as np


def fastest_measured(paths):
    """(model, batch) -> the fastest ``measured_ms`` any of the files holds for it."""
    measured = {}
    for path in paths:
        with open(path) as handle:
            for row in json.load(handle)["rows"]:
                key = (row["model"], row["batch"])
                measured[key] = min(measured.get(key, np.inf), row["measured_ms"])
    return measured
