import sys, subprocess, tempfile, numpy as np, onnx
from onnx import TensorProto, helper, numpy_helper
def model(steps, batch, hidden, features=6):
    rng = np.random.default_rng(0); scale = 1/np.sqrt(hidden)
    ws = [numpy_helper.from_array((rng.standard_normal(s)*scale).astype(np.float32), n) for n, s in (("W",(1,4*hidden,features)),("R",(1,4*hidden,hidden)),("B",(1,8*hidden)))]
    node = helper.make_node("LSTM", ["x","W","R","B"], ["","h"], hidden_size=hidden)
    g = helper.make_graph([node], "l", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, batch, features])], [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, batch, hidden])], ws)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("",14)]); m.ir_version=8; return m
for steps, batch in [(100,1),(100,1),(30,16),(30,16)]:
    p = tempfile.mktemp(suffix='.onnx'); onnx.save(model(steps,batch,512), p)
    out = subprocess.run(['hetflow','estimate',p,'--validate'],capture_output=True,text=True).stdout
    line=[l for l in out.splitlines() if l.startswith('time')]
    print(steps, batch, line)
