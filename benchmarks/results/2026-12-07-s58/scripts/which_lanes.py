import sys, onnx
from onnx import shape_inference
from hetflow.zoo import build
from hetflow.devices.cpu.kernels import own_gemm
import math
for name in sys.argv[1:]:
    m = shape_inference.infer_shapes(build(name))
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in list(m.graph.value_info)+list(m.graph.input)+list(m.graph.output)}
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    hits = []
    for n in m.graph.node:
        if n.op_type != "Conv": continue
        w = inits.get(n.input[1]); y = shapes.get(n.output[0]); x = shapes.get(n.input[0])
        if not w or not y: continue
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        depth = w[1]*w[2]*w[3]; pos = y[2]*y[3]
        new = own_gemm.lanes_pay(w[0], depth, pos, group)
        if new: hits.append(f"{n.name or n.output[0]} {w[0]}x{depth}x{pos}")
    print(name, len(hits), hits)
