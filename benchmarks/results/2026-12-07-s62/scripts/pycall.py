"""Per-step Python overhead of a layer timed alone (CPU timed_call -> replayed) vs its jobs repeated inside one compiled replay."""
import importlib, sys, time
import numpy as np
import hetflow
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.threads import own_threads, spinning
from hetflow.runtime.executor import spin_threads
timing = importlib.import_module("hetflow.estimate.timing")
validate = importlib.import_module("hetflow.estimate.validate")
from hetflow.zoo import build

name = sys.argv[1] if len(sys.argv) > 1 else "lenet"
s = hetflow.InferenceSession(build(name).SerializeToString())
feeds = validate.random_feeds(s, 1)
plan = s.plan_for({})
device = plan.steps[0].device
REPEAT = 32

def best(fn, n=2000, rounds=5):
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n)
    return min(out)

with own_threads(spin_threads(2), spin=True, hold_blas=True):
    def visit(index, node, kernel, inputs):
        outputs = kernel.fn(node, inputs)
        call = device.timed_call(kernel, node, inputs, outputs, timing.weight_positions(node, plan.graph))
        call()
        bound = kernel.steady_bound(node, inputs, outputs, timing.weight_positions(node, plan.graph))
        capture = getattr(bound, "capture", None)
        found = capture(inputs) if capture else None
        alone = best(call)
        if found is None:
            print(f"{node.name:10s} {node.op_type:12s} called {alone*1e6:7.2f} us  (not captured)")
            return outputs
        jobs = list(found[1])
        one = spin_pool.JobScript(jobs)
        many = spin_pool.JobScript(jobs * REPEAT)
        pool = spinning()
        t1 = best(lambda: pool.replay(one))
        tk = best(lambda: pool.replay(many), n=max(20, 2000 // REPEAT))
        per = (tk - t1) / (REPEAT - 1)
        print(f"{node.name:10s} {node.op_type:12s} called {alone*1e6:7.2f} us  replay(1) {t1*1e6:7.2f}  in-compiled {per*1e6:7.2f}  python {1e6*(alone-per):6.2f} jobs {len(jobs)}")
        return outputs
    timing.replay(plan.graph, [(st.node, st.kernel) for st in plan.steps], feeds, visit)
