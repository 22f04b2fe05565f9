"""Per-step time of a one-column spinning LSTM across hidden sizes and step counts."""
import importlib, sys
import numpy as np
import hetflow
probes = importlib.import_module("hetflow.estimate.probes")
validate = importlib.import_module("hetflow.estimate.validate")
rows = []
for hidden in (128, 256, 320, 384, 448, 512, 640):
    for steps in (25, 50, 100):
        model = probes.lstm(steps, 1, 6, hidden, last_only=True)()
        s = hetflow.InferenceSession(model.SerializeToString())
        feeds = {"x": np.random.default_rng(0).standard_normal((steps, 1, 6), dtype=np.float32)}
        t = min(validate.model_seconds(s, feeds, budget=0.3) for _ in range(3))
        print(f"h{hidden:4d} steps {steps:4d}  {t*1e3:8.3f} ms  {t/steps*1e6:7.2f} us/step  R {4*hidden*hidden*4/2**20:5.2f} MiB  {4*hidden*hidden*4/(t/steps)/1e9:6.1f} GB/s", flush=True)
