"""Predict a network's time and memory on a device before running it, and prove the prediction.

``estimate`` walks the graph a session would run, asks each op definition for its cost, and turns
costs into times with a ``DeviceProfile`` that ``calibrate`` measured; ``validate`` runs the model and
times every layer the same amortised way calibration does.
"""

from hetflow.estimate.predict import Estimate, LayerEstimate, MemoryEstimate, estimate, parse_bytes
from hetflow.estimate.profile import DeviceProfile, ProfileError, default_profile_path

__all__ = [
    "DeviceProfile",
    "Estimate",
    "LayerEstimate",
    "MemoryEstimate",
    "ProfileError",
    "default_profile_path",
    "estimate",
    "parse_bytes",
]
