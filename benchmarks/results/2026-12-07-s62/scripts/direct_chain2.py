"""Whole direct-replayed run vs its layers timed alone, on spinning chains of small pools."""
import importlib, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import hetflow
validate = importlib.import_module("hetflow.estimate.validate")

def chain(pools):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["v0"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2])]
    for i in range(pools):
        nodes.append(helper.make_node("MaxPool", [f"v{i}"], [f"v{i+1}"], name=f"pool{i}", kernel_shape=[2, 2]))
    nodes.append(helper.make_node("GlobalAveragePool", [f"v{pools}"], ["g"], name="gap"))
    nodes.append(helper.make_node("Flatten", ["g"], ["f"], name="flat"))
    nodes.append(helper.make_node("Softmax", ["f"], ["y"], name="prob"))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 24, 24])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

lengths = [int(a) for a in sys.argv[1:]] or [1, 11]
for rep in range(3):
    out = []
    for pools in lengths:
        s = hetflow.InferenceSession(chain(pools))
        feeds = {"x": np.random.default_rng(1).standard_normal((1, 8, 24, 24)).astype(np.float32)}
        whole = min(validate.model_seconds(s, feeds, budget=0.2) for _ in range(3))
        layers = validate.layer_seconds(s, feeds, min_time=0.02)
        steady = list(s._steady.values())[0]
        n = len(s.plan_for({}).steps)
        out.append((n, whole, sum(layers.values())))
        print(f"steps {n:3d} direct {steady._direct is not None} whole {whole*1e6:8.2f} us layers {sum(layers.values())*1e6:8.2f} us  diff {(whole-sum(layers.values()))*1e6:7.2f}", {k: round(v*1e6, 2) for k, v in layers.items()} if n < 6 else "")
    (n1, w1, l1), (n2, w2, l2) = out[0], out[-1]
    step = ((w2 - l2) - (w1 - l1)) / (n2 - n1)
    print(f"  per step {step*1e6:.2f} us, per run {((w1-l1) - n1*step)*1e6:.2f} us")
