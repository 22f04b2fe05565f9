import numpy as np, time
from hetflow.devices.cpu.kernels import jit_direct_stems as st, jit_direct_phases as ph, jit_direct
from hetflow.ops.spatial import geometry
from hetflow.ops.conv import conv_window
import onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper

def reference(x, w, b, pads, stride=2):
    from onnx import helper
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[stride, stride], pads=pads)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]

from hetflow.ops.spatial import WindowSpec
rng = np.random.default_rng(0)
for (n, c, h, wd, k, ks, pads) in [(1,3,224,224,32,3,[1,1,1,1]), (2,3,31,45,13,3,[1,0,0,1]), (1,3,224,224,64,7,[3,3,3,3]), (1,1,20,19,9,5,[2,2,2,2]), (1,3,227,227,64,3,[0,0,0,0]), (1,4,9,9,8,7,[3,3,3,3])]:
    x = rng.standard_normal((n,c,h,wd)).astype(np.float32)
    w = rng.standard_normal((k,c,ks,ks)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    ref = np.maximum(reference(x, w, b, pads), 0)
    spec = WindowSpec((ks,ks),(2,2),(1,1),tuple(pads))
    geom = geometry(spec, (h, wd))
    pass
    y = np.full(ref.shape, np.nan, np.float32)
    st.conv2d(x, w, b, geom, jit_direct.RELU_BOUNDS, y)
    print((n,c,h,wd,k,ks), np.abs(y-ref).max(), np.isnan(y).sum())
