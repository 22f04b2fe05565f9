import sys, numpy as np, onnx, onnxruntime as ort
from onnx import helper, numpy_helper, TensorProto
sys.path.insert(0,'/work/main/benchmarks')
import hetflow
from hetflow.bench.timing import side_by_side
def conv_model(c, k, hw, relu=True):
    rng=np.random.default_rng(0)
    w=numpy_helper.from_array((rng.standard_normal((k,c,3,3))*0.1).astype(np.float32),'w')
    b=numpy_helper.from_array(rng.standard_normal(k).astype(np.float32),'b')
    nodes=[helper.make_node('Conv',['x','w','b'],['c'],pads=[1,1,1,1],kernel_shape=[3,3])]
    nodes.append(helper.make_node('Relu',['c'],['y']))
    g=helper.make_graph(nodes,'c',[helper.make_tensor_value_info('x',TensorProto.FLOAT,[1,c,hw,hw])],[helper.make_tensor_value_info('y',TensorProto.FLOAT,[1,k,hw,hw])],[w,b])
    m=helper.make_model(g,opset_imports=[helper.make_opsetid('',13)]); m.ir_version=8; return m
for c,k,hw in [(32,32,32),(32,64,16),(64,64,16),(64,128,8)]:
    m=conv_model(c,k,hw); p=f'/tmp/s59/conv_{c}_{k}_{hw}.onnx'; onnx.save(m,p)
    x={'x':np.random.default_rng(1).standard_normal((1,c,hw,hw)).astype(np.float32)}
    s=hetflow.InferenceSession(p, threads=2); s.run(None,x)
    o=ort.SessionOptions(); o.intra_op_num_threads=2
    r=ort.InferenceSession(p,o,providers=['CPUExecutionProvider'])
    np.testing.assert_allclose(s.run(None,x)[0], r.run(None,x)[0], rtol=1e-3, atol=1e-3)
    t=side_by_side({'hetflow':lambda: s.run(None,x),'ort':lambda: r.run(None,x)}, 200)
    print(c,k,hw, {n:(round(v.min*1e3,4), round(v.median*1e3,4)) for n,v in t.items()})
