"""Caffe frontend: prototxt text format, caffemodel wire format, layer conversion, counts and numerics.

Per-layer params and MACs are checked against a counter written here from Caffe's own formulas over
the prototxt's layer list (it shares only the text parser with the importer); numerics against a numpy
forward pass with Caffe's layer semantics (``caffe_reference``) and against ONNX Runtime on equivalent
``onnx.helper`` models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.errors import InvalidModelError, ModelLoadError, UnsupportedOpsError
from hetflow.frontends.caffe import caffe_pooled_size, decode_caffemodel, import_caffe, parse_prototxt
from hetflow.frontends.caffe.caffemodel import read_varint
from hetflow.frontends.caffe.net import net_layers
from hetflow.ops.cost import node_costs
from hetflow.passes import bind_batch
from tests.frontends.caffe_reference import caffemodel_bytes, forward_ref, varint
from tests.helpers import make_model, run_onnxruntime

FIXTURES = Path(__file__).parent.parent / "fixtures" / "caffe"

#: fixture -> (classes, published total params of conv + FC layers, where known exactly). ResNet-50's is
#: torchvision's 25,557,032 less its BatchNorms' gamma and beta (2 x 26,560), which Caffe keeps in Scale.
MODELS = {
    "lenet": (10, 431_080),
    "cifar10_quick": (10, 145_578),
    "alexnet": (1000, 60_965_224),
    "vgg16": (1000, 138_357_544),
    "googlenet": (1000, 6_998_552),
    "nin": (1000, None),
    "resnet50": (1000, 25_503_912),
}


# -- prototxt text format --------------------------------------------------------------------------


def test_prototxt_parses_every_text_format_form():
    text = r"""
    # a comment
    name: "n\"et" 'two' "parts"   # adjacent strings concatenate
    count: -3 ratio: 1.5e-3 big: 0x10 f: 2.5f neg_inf: -inf
    flag: true other: False mode: MAX
    nested { a: 1 a: 2 deep { b: "x" } }
    colon_form: { c: 3 }
    angle < d: 4 >
    listed: [1, 2, 3]
    msgs: [{ e: 5 }, { e: 6 }];
    """
    msg = parse_prototxt(text)
    assert msg.get("name") == 'n"ettwoparts'
    assert msg.get("count") == -3 and msg.get("ratio") == pytest.approx(1.5e-3) and msg.get("big") == 16
    assert msg.get("f") == 2.5 and msg.get("neg_inf") == float("-inf")
    assert msg.get("flag") is True and msg.get("other") is False and msg.get("mode") == "MAX"
    assert msg.message("nested").all("a") == [1, 2]
    assert msg.message("nested").message("deep").get("b") == "x"
    assert msg.message("colon_form").get("c") == 3 and msg.message("angle").get("d") == 4
    assert msg.all("listed") == [1, 2, 3]
    assert [m.get("e") for m in msg.all("msgs")] == [5, 6]
    assert msg.to_dict()["nested"] == {"a": [1, 2], "deep": {"b": "x"}}
    assert msg.message("absent").get("x", 7) == 7


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('layer {\n  name: "a"\n', "end of file"),
        ('layer {\n  name "a"\n}', "2:8"),
        ("layer {\n  name: }\n", "2:9"),
        ("a: 1 }", "1:6"),
        ("a: [1 2]", "1:7"),
        ("a: 1 $", "1:6"),
    ],
)
def test_broken_prototxt_is_a_model_load_error_with_position(tmp_path, text, where):
    path = tmp_path / "broken.prototxt"
    path.write_text(text)
    with pytest.raises(ModelLoadError, match=where) as info:
        hetflow.load_model(path)
    assert "broken.prototxt" in str(info.value)


# -- caffemodel wire format ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**31, 2**63 - 1])
def test_varint_round_trip(value):
    encoded = varint(value)
    assert read_varint(memoryview(encoded), 0) == (value, len(encoded))


@pytest.mark.parametrize(("v1", "legacy", "packed"), [(False, False, True), (True, True, False), (False, True, True)])
def test_caffemodel_decodes_layers_and_blobs(v1, legacy, packed):
    rng = np.random.default_rng(0)
    conv_w = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    data = caffemodel_bytes([("conv", "Convolution", [conv_w, bias]), ("relu", "ReLU", [])], "tiny",
                            v1=v1, legacy_dims=legacy, packed=packed)
    weights = decode_caffemodel(data)
    assert weights.name == "tiny"
    assert list(weights.layers) == ["conv", "relu"]
    layer = weights.layers["conv"]
    assert layer.type == "Convolution"
    np.testing.assert_array_equal(layer.blobs[0], conv_w)
    np.testing.assert_array_equal(layer.blobs[1].ravel(), bias)
    assert layer.blobs[1].shape == ((1, 1, 1, 4) if legacy else (4,))


@pytest.mark.parametrize("data", [b"\x0a\x05ab", b"\xff\xff\xff", b"", b"\x0b\x00"])
def test_garbage_caffemodel_is_a_model_load_error(tmp_path, data):
    (tmp_path / "lenet.prototxt").write_text((FIXTURES / "lenet.prototxt").read_text())
    (tmp_path / "w.caffemodel").write_bytes(data)
    with pytest.raises(ModelLoadError, match="caffemodel"):
        hetflow.load_model(tmp_path / "lenet.prototxt", weights=tmp_path / "w.caffemodel")


# -- the fixtures: shapes, params and MACs ---------------------------------------------------------


class CaffeCounter:
    """Params and MACs of conv / FC layers from a prototxt's layer list, with Caffe's formulas."""

    def __init__(self, net, batch: int):
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.rows: dict[str, tuple[int, int]] = {}  # layer -> (params, macs)
        self.batchnorm_channels: list[int] = []
        inputs = net.all("input")
        dims = [int(d) for d in net.all("input_dim")]
        shapes = [tuple(int(d) for d in s.all("dim")) for s in net.all("input_shape")]
        shapes = shapes or [tuple(dims[4 * i:4 * i + 4]) for i in range(len(inputs))]
        for name, shape in zip(inputs, shapes):
            self.shapes[name] = (batch, *shape[1:])
        v1 = {"CONVOLUTION": "Convolution", "POOLING": "Pooling", "INNER_PRODUCT": "InnerProduct",
              "CONCAT": "Concat"}
        for layer in net.all("layer") + net.all("layers"):
            kind = v1.get(layer.get("type"), layer.get("type"))
            getattr(self, f"_{kind.lower()}", self._same)(layer, batch)

    def _top(self, layer, shape):
        for top in layer.all("top"):
            self.shapes[top] = shape

    def _input(self, layer, batch):
        shape = tuple(int(d) for d in layer.message("input_param").message("shape").all("dim"))
        self._top(layer, (batch, *shape[1:]))

    def _same(self, layer, batch):
        self._top(layer, self.shapes[layer.get("bottom")])

    def _batchnorm(self, layer, batch):
        self.batchnorm_channels.append(self.shapes[layer.get("bottom")][1])
        self._same(layer, batch)

    def _convolution(self, layer, batch):
        p = layer.message("convolution_param")
        n, c, h, w = self.shapes[layer.get("bottom")]
        k, s, pad, g = int(p.get("kernel_size")), int(p.get("stride", 1)), int(p.get("pad", 0)), int(p.get("group", 1))
        out = int(p.get("num_output"))
        oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
        params = out * (c // g) * k * k + (out if p.get("bias_term", True) else 0)
        self.rows[layer.get("name")] = (params, batch * out * oh * ow * (c // g) * k * k)
        self._top(layer, (n, out, oh, ow))

    def _pooling(self, layer, batch):
        p = layer.message("pooling_param")
        n, c, h, w = self.shapes[layer.get("bottom")]
        k, s, pad = int(p.get("kernel_size")), int(p.get("stride", 1)), int(p.get("pad", 0))
        sizes = []
        for size in (h, w):
            pooled = int(np.ceil((size + 2 * pad - k) / s)) + 1
            if pad and (pooled - 1) * s >= size + pad:
                pooled -= 1
            sizes.append(pooled)
        self._top(layer, (n, c, *sizes))

    def _innerproduct(self, layer, batch):
        shape = self.shapes[layer.get("bottom")]
        features = int(np.prod(shape[1:]))
        out = int(layer.message("inner_product_param").get("num_output"))
        self.rows[layer.get("name")] = (out * features + out, batch * out * features)
        self._top(layer, (shape[0], out))

    def _concat(self, layer, batch):
        shapes = [self.shapes[b] for b in layer.all("bottom")]
        self._top(layer, (shapes[0][0], sum(s[1] for s in shapes), *shapes[0][2:]))


def _node_params(graph, node) -> int:
    return sum(graph.initializers[i].size for i in node.inputs if i in graph.initializers)


@pytest.fixture(scope="module", params=list(MODELS))
def fixture_model(request):
    path = FIXTURES / f"{request.param}.prototxt"
    return request.param, path, hetflow.load_model(path)


def test_fixture_output_shape_and_placeholders(fixture_model):
    name, _, graph = fixture_model
    classes, _ = MODELS[name]
    (output,) = graph.output_values()
    assert output.shape[0] == "N" and output.shape[1] == classes
    assert all(d == 1 for d in output.shape[2:])
    assert graph.metadata["weights"] == "placeholder"
    assert graph.metadata["source_format"] == "caffe"
    assert [v.shape[0] for v in graph.input_values()] == ["N"]


@pytest.mark.parametrize("batch", [1, 16])
def test_fixture_params_and_macs_per_layer_match_an_independent_count(fixture_model, batch):
    name, path, graph = fixture_model
    net = parse_prototxt(path.read_text())
    counter = CaffeCounter(net, batch)
    bound = bind_batch(graph, {"N": batch})
    costs = {node.name: (node, cost) for node, cost in node_costs(bound)}
    for layer, (params, macs) in counter.rows.items():
        node, cost = costs[layer]
        assert node.op_type in ("Conv", "Gemm")
        assert (_node_params(bound, node), cost.macs) == (params, macs), layer
    # Every other node is MAC-free; BatchNormalization holds scale, bias, mean and variance.
    assert sum(cost.macs for _, cost in costs.values()) == sum(m for _, m in counter.rows.values())
    conv_fc_params = sum(p for p, _ in counter.rows.values())
    assert sum(a.size for a in graph.initializers.values()) == conv_fc_params + 4 * sum(counter.batchnorm_channels)
    published = MODELS[name][1]
    if published is not None:
        assert conv_fc_params == published
    assert bound.output_values()[0].shape[:2] == counter.shapes["prob"][:2]


def test_augur_alexnet_conv1_gemm_is_exact():
    graph = bind_batch(hetflow.load_model(FIXTURES / "alexnet.prototxt"), {"N": 1})
    costs = {node.name: cost for node, cost in node_costs(graph)}
    gemm = costs["conv1"].gemm
    assert (gemm.n, gemm.m, gemm.k, gemm.count) == (96, 3025, 363, 1)
    assert costs["conv1"].macs == 96 * 3025 * 363
    # The grouped layers run one GEMM per group.
    conv2 = costs["conv2"].gemm
    assert (conv2.n, conv2.m, conv2.k, conv2.count) == (128, 27 * 27, 5 * 5 * 48, 2)
    fc6 = costs["fc6"].gemm
    assert (fc6.n, fc6.m, fc6.k) == (4096, 1, 9216)


@pytest.mark.parametrize(
    ("model", "blobs"),
    [
        ("alexnet", {"conv1": 55, "pool1": 27, "pool2": 13, "pool5": 6}),
        ("cifar10_quick", {"pool1": 16, "pool2": 8, "pool3": 4}),
        ("nin", {"conv1": 54, "pool0": 27, "pool2": 13, "pool3": 6, "pool4": 1}),
        ("googlenet", {"pool1/3x3_s2": 56, "pool2/3x3_s2": 28, "pool3/3x3_s2": 14, "pool4/3x3_s2": 7}),
        ("resnet50", {"conv1": 112, "pool1": 56, "pool5": 1}),
        ("vgg16", {"pool1": 112, "pool5": 7}),
    ],
)
def test_caffe_pooling_rounds_up(model, blobs):
    graph = hetflow.load_model(FIXTURES / f"{model}.prototxt")
    for blob, size in blobs.items():
        assert graph.values[blob].shape[2:] == (size, size), blob


@pytest.mark.parametrize(
    ("size", "kernel", "stride", "pad", "expected"),
    [(112, 3, 2, 0, 56), (13, 3, 2, 0, 6), (55, 3, 2, 0, 27), (32, 3, 2, 0, 16), (7, 3, 2, 1, 4),
     (6, 3, 3, 2, 3), (10, 3, 3, 2, 4), (5, 2, 2, 1, 3), (28, 3, 1, 1, 28)],
)
def test_pooled_size_formula(size, kernel, stride, pad, expected):
    assert caffe_pooled_size(size, kernel, stride, pad) == expected


# -- running with weights --------------------------------------------------------------------------


def _random_weights(graph, seed: int) -> dict[str, list[np.ndarray]]:
    """Random blobs for every layer of a placeholder graph, in Caffe's blob layout."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[np.ndarray]] = {}
    for node in graph.nodes:
        if node.op_type in ("Conv", "Gemm"):
            w = graph.initializers[node.inputs[1]]
            scale = 1.0 / np.sqrt(w[0].size)
            out[node.name] = [(rng.standard_normal(w.shape) * scale).astype(np.float32)]
            if len(node.inputs) > 2:
                out[node.name].append(rng.standard_normal(w.shape[0]).astype(np.float32) * 0.1)
    return out


def _save(tmp_path: Path, fixture: str, weights, **kwargs) -> Path:
    prototxt = tmp_path / f"{fixture}.prototxt"
    prototxt.write_text((FIXTURES / f"{fixture}.prototxt").read_text())
    blobs = [(name, "Convolution", arrays) for name, arrays in weights.items()]
    (tmp_path / f"{fixture}.caffemodel").write_bytes(caffemodel_bytes(blobs, fixture, **kwargs))
    return prototxt


def _gemm_nodes(name, w, b, x, out):
    return helper.make_node("Gemm", [x, w, b], [out], transB=1, name=name)


def test_lenet_with_caffemodel_matches_numpy_and_onnxruntime(tmp_path):
    placeholder = hetflow.load_model(FIXTURES / "lenet.prototxt")
    weights = _random_weights(placeholder, seed=1)
    prototxt = _save(tmp_path, "lenet", weights)
    graph = hetflow.load_model(prototxt)  # finds lenet.caffemodel beside it
    assert graph.metadata["weights"] == "caffemodel"
    np.testing.assert_array_equal(graph.initializers["conv1/W"], weights["conv1"][0])

    x = np.random.default_rng(2).standard_normal((3, 1, 28, 28)).astype(np.float32)
    (y,) = hetflow.InferenceSession(prototxt).run(None, {"data": x})
    ref = forward_ref(parse_prototxt(prototxt.read_text()), weights, {"data": x})["prob"]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-6)

    init = {f"{k}_{i}": a for k, arrays in weights.items() for i, a in enumerate(arrays)}
    nodes = [
        helper.make_node("Conv", ["data", "conv1_0", "conv1_1"], ["c1"], kernel_shape=[5, 5]),
        helper.make_node("MaxPool", ["c1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("Conv", ["p1", "conv2_0", "conv2_1"], ["c2"], kernel_shape=[5, 5]),
        helper.make_node("MaxPool", ["c2"], ["p2"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
        helper.make_node("Flatten", ["p2"], ["f"]),
        _gemm_nodes("ip1", "ip1_0", "ip1_1", "f", "i1"),
        helper.make_node("Relu", ["i1"], ["r"]),
        _gemm_nodes("ip2", "ip2_0", "ip2_1", "r", "i2"),
        helper.make_node("Softmax", ["i2"], ["prob"], axis=1),
    ]
    model = make_model(nodes, [("data", TensorProto.FLOAT, ["N", 1, 28, 28])],
                       [("prob", TensorProto.FLOAT, ["N", 10])], init)
    model.ir_version = 8
    (expected,) = run_onnxruntime(model, {"data": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-6)


def test_cifar10_quick_with_legacy_v1_caffemodel_matches_numpy_and_onnxruntime(tmp_path):
    placeholder = hetflow.load_model(FIXTURES / "cifar10_quick.prototxt")
    weights = _random_weights(placeholder, seed=3)
    # Legacy 4-D blob dims (an InnerProduct's weights stored 1 x 1 x N x K) and one fixed32 per value.
    prototxt = _save(tmp_path, "cifar10_quick", weights, v1=True, legacy_dims=True, packed=False)
    x = np.random.default_rng(4).standard_normal((2, 3, 32, 32)).astype(np.float32)
    graph = hetflow.load_model(prototxt, weights=tmp_path / "cifar10_quick.caffemodel")
    (y,) = hetflow.InferenceSession(graph).run(None, {"data": x})
    ref = forward_ref(parse_prototxt(prototxt.read_text()), weights, {"data": x})["prob"]
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-6)

    init = {f"{k}_{i}": a for k, arrays in weights.items() for i, a in enumerate(arrays)}
    conv = dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2])
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    nodes = [
        helper.make_node("Conv", ["data", "conv1_0", "conv1_1"], ["c1"], **conv),
        helper.make_node("MaxPool", ["c1"], ["p1"], **pool),
        helper.make_node("Relu", ["p1"], ["r1"]),
        helper.make_node("Conv", ["r1", "conv2_0", "conv2_1"], ["c2"], **conv),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("AveragePool", ["r2"], ["p2"], count_include_pad=1, **pool),
        helper.make_node("Conv", ["p2", "conv3_0", "conv3_1"], ["c3"], **conv),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("AveragePool", ["r3"], ["p3"], count_include_pad=1, **pool),
        helper.make_node("Flatten", ["p3"], ["f"]),
        _gemm_nodes("ip1", "ip1_0", "ip1_1", "f", "i1"),
        _gemm_nodes("ip2", "ip2_0", "ip2_1", "i1", "i2"),
        helper.make_node("Softmax", ["i2"], ["prob"], axis=1),
    ]
    model = make_model(nodes, [("data", TensorProto.FLOAT, ["N", 3, 32, 32])],
                       [("prob", TensorProto.FLOAT, ["N", 10])], init)
    model.ir_version = 8
    (expected,) = run_onnxruntime(model, {"data": x})
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-6)


KITCHEN_SINK = """
name: "kitchen_sink"
input: "data"
input_dim: 1 input_dim: 3 input_dim: 11 input_dim: 11
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 8 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0 } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { eps: 0.001 } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1" scale_param { bias_term: true } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" relu_param { negative_slope: 0.1 } }
layer { name: "split" type: "Split" bottom: "conv1" top: "a" top: "b" }
layer { name: "conv2" type: "Convolution" bottom: "a" top: "conv2"
  convolution_param { num_output: 8 kernel_size: 3 pad: 2 dilation: 2 group: 2 bias_term: false } }
layer { name: "bn2" type: "BatchNorm" bottom: "conv2" top: "bn2" }
layer { name: "prelu" type: "PReLU" bottom: "bn2" top: "bn2p" }
layer { name: "scale2" type: "Scale" bottom: "bn2" top: "scale2" }
layer { name: "sum" type: "Eltwise" bottom: "b" bottom: "bn2p" bottom: "scale2" top: "sum"
  eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 } }
layer { name: "prod" type: "Eltwise" bottom: "sum" bottom: "b" top: "prod" eltwise_param { operation: PROD } }
layer { name: "max" type: "Eltwise" bottom: "prod" bottom: "sum" top: "max" eltwise_param { operation: MAX } }
layer { name: "norm" type: "LRN" bottom: "max" top: "norm" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 } }
layer { name: "pool_ave" type: "Pooling" bottom: "norm" top: "pa" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "pool_max" type: "Pooling" bottom: "norm" top: "pm" pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "cat" type: "Concat" bottom: "pa" bottom: "pm" top: "cat" concat_param { axis: 1 } }
layer { name: "sig" type: "Sigmoid" bottom: "cat" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "cat" top: "tanh" }
layer { name: "cat2" type: "Concat" bottom: "sig" bottom: "tanh" top: "cat2" concat_param { concat_dim: 1 } }
layer { name: "gpool" type: "Pooling" bottom: "cat2" top: "gpool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "gmax" type: "Pooling" bottom: "cat2" top: "gmax" pooling_param { pool: MAX global_pooling: true } }
layer { name: "flat" type: "Flatten" bottom: "gpool" top: "flat" }
layer { name: "drop" type: "Dropout" bottom: "flat" top: "flat" }
layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
layer { name: "clip_ave" type: "Pooling" bottom: "max" top: "clip_ave" pooling_param { pool: AVE kernel_size: 3 stride: 3 pad: 2 } }
layer { name: "clip_max" type: "Pooling" bottom: "max" top: "clip_max" pooling_param { pool: MAX kernel_size: 3 stride: 3 pad: 2 } }
layer { name: "train_only" type: "Dropout" bottom: "fc" top: "fc_train" include { phase: TRAIN } }
"""


def _kitchen_weights(rng) -> dict[str, list[np.ndarray]]:
    def normal(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def positive(*shape):
        return rng.uniform(0.5, 2.0, shape).astype(np.float32)

    return {
        "conv1": [normal(8, 3, 3, 2), normal(8)],
        # Caffe's running sums and their factor: mean = blob0 / blob2.
        "bn1": [normal(8) * 4, positive(8) * 4, np.array([4.0], np.float32)],
        "scale1": [positive(8), normal(8)],
        "conv2": [normal(8, 4, 3, 3)],
        "bn2": [normal(8), positive(8), np.array([1.0], np.float32)],
        "prelu": [normal(8)],
        "scale2": [normal(8)],
        "fc": [normal(5, 32), normal(5)],
    }


def test_every_layer_type_matches_caffe_semantics(tmp_path):
    rng = np.random.default_rng(5)
    weights = _kitchen_weights(rng)
    prototxt = tmp_path / "sink.prototxt"
    prototxt.write_text(KITCHEN_SINK)
    blobs = [(name, "Convolution", arrays) for name, arrays in weights.items()]
    (tmp_path / "sink.caffemodel").write_bytes(caffemodel_bytes(blobs))
    graph = hetflow.load_model(prototxt)
    assert graph.outputs == ["gmax", "prob", "clip_ave", "clip_max"]
    ops = [n.op_type for n in graph.nodes]
    # bn1+scale1 fuse; bn2 has two readers, so it stays alone and scale2 becomes a Mul.
    assert ops.count("BatchNormalization") == 2 and "scale1" not in [n.name for n in graph.nodes]
    assert graph.values["clip_ave"].shape == ("N", 8, 3, 4)  # both axes drop a window in the padding
    assert graph.values["pa"].shape == ("N", 8, 4, 6)
    # In-place layers write fresh SSA values.
    assert graph.node("relu1").outputs == ["conv1/relu1"] and graph.node("relu1").op_type == "LeakyRelu"

    x = rng.standard_normal((2, 3, 11, 11)).astype(np.float32)
    session = hetflow.InferenceSession(prototxt)
    results = dict(zip(graph.outputs, session.run(None, {"data": x})))
    ref = forward_ref(parse_prototxt(KITCHEN_SINK), weights, {"data": x})
    for name, value in results.items():
        np.testing.assert_allclose(value, ref[name], rtol=1e-4, atol=1e-5, err_msg=name)


RESHAPES = """
layer { name: "in" type: "Input" top: "data" top: "gate" input_param { shape { dim: 2 dim: 4 dim: 3 dim: 5 }
  shape { dim: 2 dim: 4 } } }
layer { name: "gated" type: "Scale" bottom: "data" bottom: "gate" top: "gated" scale_param { axis: 0 } }
layer { name: "bias" type: "Bias" bottom: "gated" top: "biased" bias_param { num_axes: 2 } }
layer { name: "flat" type: "Flatten" bottom: "biased" top: "flat" flatten_param { axis: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "flat" top: "fc" inner_product_param { num_output: 6 axis: 2 } }
layer { name: "tail" type: "Flatten" bottom: "fc" top: "tail" }
layer { name: "fc2" type: "InnerProduct" bottom: "biased" top: "fc2"
  inner_product_param { num_output: 3 axis: 2 transpose: true bias_term: false } }
layer { name: "bn" type: "BatchNorm" bottom: "biased" top: "bn" batch_norm_param { use_global_stats: false } }
layer { name: "re" type: "Reshape" bottom: "bn" top: "re" reshape_param { shape { dim: 0 dim: -1 dim: 5 } } }
"""


def test_reshaping_layers_two_bottom_scale_and_batch_statistics(tmp_path):
    rng = np.random.default_rng(6)
    weights = {"bias": [rng.standard_normal((4, 3)).astype(np.float32)],
               "fc": [rng.standard_normal((6, 15)).astype(np.float32), rng.standard_normal(6).astype(np.float32)],
               "fc2": [rng.standard_normal((15, 3)).astype(np.float32)],
               "bn": [np.zeros(4, np.float32), np.ones(4, np.float32), np.ones(1, np.float32)]}
    path = tmp_path / "reshapes.prototxt"
    path.write_text(RESHAPES)
    graph = import_caffe(path, decode_caffemodel(caffemodel_bytes([(k, "X", v) for k, v in weights.items()])))
    assert graph.values["fc"].shape == ("N", 4, 6)
    assert graph.outputs == ["tail", "fc2", "re"] and graph.values["re"].shape == ("N", 12, 5)
    assert graph.values["fc2"].shape == ("N", 4, 3)
    assert graph.node("bn").attrs.training_mode == 1  # use_global_stats: false normalises per batch
    feeds = {"data": rng.standard_normal((3, 4, 3, 5)).astype(np.float32),
             "gate": rng.standard_normal((3, 4)).astype(np.float32)}
    results = hetflow.InferenceSession(graph).run(None, feeds)
    ref = forward_ref(parse_prototxt(RESHAPES), weights, feeds)
    for name, value in zip(graph.outputs, results):
        np.testing.assert_allclose(value, ref[name], rtol=1e-5, atol=1e-5, err_msg=name)


def test_layers_are_filtered_for_the_test_phase():
    net = parse_prototxt("""
    layer { name: "always" type: "ReLU" }
    layer { name: "train" type: "ReLU" include { phase: TRAIN } }
    layer { name: "test" type: "ReLU" include { phase: TEST } }
    layer { name: "numeric_test" type: "ReLU" include { phase: 1 } }
    layer { name: "staged" type: "ReLU" include { phase: TEST stage: "extra" } }
    layer { name: "not_train" type: "ReLU" exclude { phase: TRAIN } }
    layer { name: "not_test" type: "ReLU" exclude { phase: TEST } }
    layer { name: "high_level" type: "ReLU" include { min_level: 1 } }
    """)
    assert [layer.name for layer in net_layers(net)] == ["always", "test", "numeric_test", "not_train"]


def test_placeholder_graph_runs():
    (y,) = hetflow.InferenceSession(FIXTURES / "lenet.prototxt").run(
        None, {"data": np.ones((2, 1, 28, 28), np.float32)})
    np.testing.assert_allclose(y, np.full((2, 10), 0.1, np.float32), rtol=1e-6)


# -- errors ----------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "net.prototxt") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


_HEADER = 'input: "data" input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }\n'


def test_unknown_layer_types_are_listed_together(tmp_path):
    path = _write(tmp_path, _HEADER + """
    layer { name: "up" type: "Deconvolution" bottom: "data" top: "up" }
    layer { name: "ok" type: "ReLU" bottom: "up" top: "up" }
    layer { name: "odd" type: "MyCustomLayer" bottom: "up" top: "odd" }
    layer { name: "sto" type: "Pooling" bottom: "odd" top: "sto" pooling_param { pool: STOCHASTIC kernel_size: 2 } }
    layer { name: "within" type: "LRN" bottom: "sto" top: "w" lrn_param { norm_region: WITHIN_CHANNEL } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "w" bottom: "label" top: "loss" }
    """)
    with pytest.raises(UnsupportedOpsError) as info:
        hetflow.load_model(path)
    assert [(n.name, n.op_type) for n in info.value.nodes] == [
        ("up", "Deconvolution"), ("odd", "MyCustomLayer"), ("sto", "Pooling"), ("within", "LRN"),
        ("loss", "SoftmaxWithLoss")]
    message = str(info.value)
    for part in ("'up' (caffe::Deconvolution)", "'odd'", "STOCHASTIC", "WITHIN_CHANNEL", "deploy prototxt"):
        assert part in message


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ('layer { name: "r" type: "ReLU" bottom: "nothing" top: "r" }', "reads blob 'nothing'"),
        ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" convolution_param { kernel_size: 3 } }',
         "num_output is required"),
        ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
         'convolution_param { num_output: 4 kernel_size: 3 group: 2 } }', "group 2 must divide"),
        ('layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
         'convolution_param { num_output: 4 kernel_size: 30 } }', "layer 'c'"),
        ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 1 stride: 3 } }',
         "empty window"),
        ('layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { kernel_size: 2 pad: 2 } }',
         "smaller than the kernel"),
        ('layer { name: "n" type: "LRN" bottom: "data" top: "n" lrn_param { local_size: 4 } }', "must be odd"),
        ('layer { name: "e" type: "Eltwise" bottom: "data" bottom: "data" top: "e" '
         'eltwise_param { operation: MAX coeff: 1 coeff: 2 } }', "coeff only applies"),
        ('layer { name: "x" type: "Concat" bottom: "data" top: "x" concat_param { axis: 5 } }', "out of range"),
    ],
)
def test_inconsistent_layers_are_invalid_model_errors(tmp_path, body, match):
    with pytest.raises(InvalidModelError, match=match):
        hetflow.load_model(_write(tmp_path, _HEADER + body))


def test_net_without_input_is_invalid(tmp_path):
    with pytest.raises(InvalidModelError, match="no input"):
        hetflow.load_model(_write(tmp_path, 'name: "empty"\n'))


def test_caffemodel_mismatches_are_model_load_errors(tmp_path):
    prototxt = _write(tmp_path, (FIXTURES / "lenet.prototxt").read_text(), "lenet.prototxt")
    good = _random_weights(hetflow.load_model(FIXTURES / "lenet.prototxt"), seed=0)
    cases = {
        "no weights for layer 'ip2'": {k: v for k, v in good.items() if k != "ip2"},
        "implies": {**good, "conv1": [np.zeros((20, 1, 3, 3), np.float32), good["conv1"][1]]},
        "has 1 blob": {**good, "conv2": good["conv2"][:1]},
        "uses 2": {**good, "ip1": good["ip1"] + [np.zeros(3, np.float32)]},
    }
    for match, weights in cases.items():
        blobs = [(name, "Convolution", arrays) for name, arrays in weights.items()]
        (tmp_path / "w.caffemodel").write_bytes(caffemodel_bytes(blobs))
        with pytest.raises(ModelLoadError, match=match):
            hetflow.load_model(prototxt, weights=tmp_path / "w.caffemodel")


def test_load_model_dispatch_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        hetflow.load_model(tmp_path / "missing.prototxt")
    with pytest.raises(ModelLoadError, match="caffemodel not found"):
        hetflow.load_model(FIXTURES / "lenet.prototxt", weights=tmp_path / "missing.caffemodel")
    with pytest.raises(ModelLoadError, match="weights only"):
        hetflow.load_model(tmp_path / "x.caffemodel")
    with pytest.raises(ModelLoadError, match="only applies to a Caffe"):
        hetflow.load_model(tmp_path / "x.onnx", weights=tmp_path / "x.caffemodel")
