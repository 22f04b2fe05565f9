"""A chain of pointwise layers at 56x56 (64 -> 256 -> 64 -> ..., Relu fused), one image, two threads:
whole runs timed in rounds labelled by the cache probe (L3 shared or split), with each spinning job in
two shares a thread (as runs are) and in one (each core then writes and reads the same positions of
every layer: nothing crosses between the cores but the feed).

    python chain_states.py SECONDS [LAYERS] [--ort]
"""
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from hetflow import InferenceSession
from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import own_gemm
from hetflow.estimate.spells import CacheProbe

seconds = float(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 8
rng = np.random.default_rng(0)
nodes, weights, name = [], [], "x"
for i in range(count):
    c_in, c_out = (64, 256) if i % 2 == 0 else (256, 64)
    weights.append(numpy_helper.from_array(rng.standard_normal((c_out, c_in, 1, 1)).astype(np.float32) * 0.05, f"w{i}"))
    nodes += [helper.make_node("Conv", [name, f"w{i}"], [f"c{i}"]), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    name = f"r{i}"
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 56, 56])],
                          [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)], weights)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
feed = {"x": rng.standard_normal((1, 64, 56, 56)).astype(np.float32)}


def labelled_rounds(seconds, measure, keys):
    """Rounds of ``measure()`` ({key: seconds}) for ``seconds``, each labelled by the cache probe read
    before and after (rounds where they disagree dropped): per (shared?, key) the fastest, and the
    rounds per state."""
    probe = CacheProbe()
    best = {(state, k): np.inf for state in (True, False) for k in keys}
    rounds = {True: 0, False: 0}
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        before = probe.shared()
        got = measure()
        if probe.shared() != before:
            continue
        rounds[before] += 1
        for k, v in got.items():
            best[(before, k)] = min(best[(before, k)], v)
    return best, rounds


def fastest_runs(sessions, runs=20):
    """{key: the fastest of ``runs`` runs} of each session."""
    got = {}
    for k, s in sessions.items():
        got[k] = np.inf
        for _ in range(runs):
            t = time.perf_counter()
            s.run(None, feed)
            got[k] = min(got[k], time.perf_counter() - t)
    return got


def chain_sessions():
    """The chain's hetflow sessions (two shares a thread, and one) and, with ``--ort``, ONNX Runtime's."""
    sessions = {}
    for shares in (2, 1):
        threads.SPIN_SHARES_PER_THREAD = own_gemm.SPIN_SHARES_PER_THREAD = shares
        sessions[shares] = InferenceSession(model, threads=2)
        for _ in range(3):
            sessions[shares].run(None, feed)
    threads.SPIN_SHARES_PER_THREAD = own_gemm.SPIN_SHARES_PER_THREAD = 2
    if "--ort" in sys.argv:  # ONNX Runtime beside them, two threads
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        sessions["ort"] = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sessions


if __name__ == "__main__":
    sessions = chain_sessions()
    best, rounds = labelled_rounds(seconds, lambda: fastest_runs(sessions), list(sessions))

    for state in (True, False):
        label = "shared" if state else "split"
        print(f"L3 {label} ({rounds[state]} rounds): two shares a thread {best[(state, 2)] * 1e3:.3f} ms, "
              f"one {best[(state, 1)] * 1e3:.3f} ms" + (f", ONNX Runtime {best[(state, 'ort')] * 1e3:.3f} ms" if "ort" in sessions else ""))
