"""A layer alone: amortised (validation's way) against the fastest single call and the fastest stamped job script."""
import importlib, sys, time
import numpy as np
import hetflow
from hetflow.zoo import build
timing = importlib.import_module("hetflow.estimate.timing")
validate = importlib.import_module("hetflow.estimate.validate")
from hetflow.runtime.executor import plan_conv_work, plan_recurrent_batch, holds_batch, run_threads
name, batch = sys.argv[1], int(sys.argv[2])
s = hetflow.InferenceSession(build(name))
feeds = validate.random_feeds(s, batch)
plan = s.plan_for({"N": batch}) if batch > 1 else s.plan_for({})
device = plan.steps[0].device
conv_macs, direct_macs = plan_conv_work(plan)
def visit(index, node, kernel, inputs):
    outputs = kernel.fn(node, inputs)
    call = device.timed_call(kernel, node, inputs, outputs, timing.weight_positions(node, plan.graph))
    call()
    amort = timing.amortised_seconds(call, min_time=0.05, rounds=3)
    singles = []
    for _ in range(max(20, int(0.15 / max(amort, 1e-6)))):
        t = time.perf_counter(); call(); singles.append(time.perf_counter() - t)
    print(f"{node.name:10s} amortised {amort*1e6:9.1f} us  fastest call {min(singles)*1e6:9.1f}  median call {np.median(singles)*1e6:9.1f}  ratio {amort/min(singles):.3f}")
    return outputs
with run_threads(conv_macs, holds_batch(feeds), None, direct_macs, plan_recurrent_batch(plan)):
    timing.replay(plan.graph, [(st.node, st.kernel) for st in plan.steps], feeds, visit)
