"""Each layer's loss inside a run (in-run minus alone, replay_timeline's method) beside the estimator's
predicted cold-byte seconds for it, summed by algorithm key.

    python cold_by_layer.py MODEL BATCH PROFILE [RUNS]
"""
import collections
import importlib
import sys

sys.path.insert(0, "/work/main/benchmarks")
from replay_timeline import captured_replay, in_run_seconds as replay_in_run  # noqa: E402

from hetflow import InferenceSession  # noqa: E402
from hetflow.estimate.cache import HitCurve, cold_bytes  # noqa: E402
from hetflow.estimate.profile import DeviceProfile  # noqa: E402
from hetflow.estimate.validate import layer_seconds, random_feeds  # noqa: E402

predict = importlib.import_module("hetflow.estimate.predict")
model, batch, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 60
profile = DeviceProfile.load(path)
session = InferenceSession(f"zoo:{model}", threads=2)
feeds = random_feeds(session, batch)
for _ in range(5):
    session.run(None, feeds)

bindings = predict.batch_bindings(session.graph, batch)
graph = predict.bind_batch(session.graph, bindings) if bindings else session.graph
plan = session.plan_for(bindings)
by_name = {node.name: node for node in graph.nodes}
steps = [(by_name[step.node.name], step.kernel) for step in plan.steps]
spinning = predict.spin_run(profile, plan, batch, 2)
split = predict.split_threads(profile, plan, batch, 2)
keys = [predict.layer_key(node, kernel, graph, spinning, split > 0) for node, kernel in steps]
planned = predict._memory_plan(session, plan)
touches = [predict.step_touches(i, node, key, graph, planned) for i, ((node, _), key) in enumerate(zip(steps, keys))]
cold = cold_bytes(touches, HitCurve.of(profile.memory))
rate = predict.cold_bytes_per_second(profile)
weights = [sum(t.nbytes for t in ts if t.space.startswith("weight:")) for ts in touches]

replay = captured_replay(session)
in_run, fastest, _ = replay_in_run(session, feeds, batch, 2, replay, runs)
alone = layer_seconds(session, feeds)
print(f"{model} b{batch}: cold rate {rate / 1e9:.1f} GB/s; jobs in run {sum(in_run.values()) * 1e3:.3f} ms, "
      f"alone {sum(alone.get(n, 0) for n in in_run) * 1e3:.3f}")
groups = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
for (node, _), key, c, w in zip(steps, keys, cold, weights):
    if node.name not in in_run or node.name not in alone:
        continue
    g = groups[key]
    g[0] += 1
    g[1] += in_run[node.name] - alone[node.name]
    g[2] += c / rate
    g[3] += c
    g[4] += w
print(f"{'key':40s} {'n':>4s} {'lost ms':>8s} {'pred ms':>8s} {'cold MB':>8s} {'weights MB':>10s}")
for key, (n, lost, pred, c, w) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
    print(f"{key:40s} {n:4d} {lost * 1e3:8.3f} {pred * 1e3:8.3f} {c / 1e6:8.2f} {w / 1e6:10.2f}")
print(f"{'total':40s} {'':4s} {sum(g[1] for g in groups.values()) * 1e3:8.3f} "
      f"{sum(g[2] for g in groups.values()) * 1e3:8.3f} {sum(g[3] for g in groups.values()) / 1e6:8.2f}")
