"""Reading an ONNX file with its large initializers streamed from the file (``onnx_lean``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hetflow
from hetflow import zoo
from hetflow.errors import InvalidModelError, ModelLoadError
from hetflow.frontends.onnx_import import import_onnx, load_proto
from hetflow.frontends.onnx_lean import MIN_STREAMED_BYTES, Lean
from tests.helpers import make_model

BIG = MIN_STREAMED_BYTES // 2  # elements: at least 64 KiB for every type of 2 bytes or more


def mixed_model() -> onnx.ModelProto:
    """A MatMul whose weight is streamed, beside unread initializers of every storage the scanner meets."""
    rng = np.random.default_rng(0)
    arrays = {
        "w": rng.standard_normal((BIG // 64, 64)).astype(np.float32),
        "half": rng.standard_normal(BIG).astype(np.float16),
        "longs": rng.integers(-(2**40), 2**40, BIG),
        "flags": rng.random(MIN_STREAMED_BYTES) < 0.5,
        "small": rng.standard_normal(7).astype(np.float64),
        "scalar": np.array(3.5, np.float32),
    }
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, ["N", BIG // 64])],
        [("y", TensorProto.FLOAT, ["N", 64])],
        arrays,
    )
    # A large tensor held in float_data, not raw_data: left in the message.
    model.graph.initializer.append(helper.make_tensor("listed", TensorProto.FLOAT, [BIG], np.ones(BIG).tolist()))
    return model


def test_streamed_initializers_equal_onnx_own_arrays(tmp_path):
    path = tmp_path / "mixed.onnx"
    onnx.save(mixed_model(), path)
    loaded = load_proto(path)
    streamed = {loaded.model.graph.initializer[i].name for i in loaded.lean.spans}
    assert streamed == {"w", "half", "longs", "flags"}
    reference = onnx.load(path)
    for index, tensor in enumerate(reference.graph.initializer):
        expected = numpy_helper.to_array(tensor)
        actual = loaded.initializer(index)
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, tensor.name
        np.testing.assert_array_equal(actual, expected)


def test_a_session_from_the_file_computes_what_one_from_the_bytes_does(tmp_path):
    model = mixed_model()
    path = tmp_path / "mixed.onnx"
    onnx.save(model, path)
    x = np.random.default_rng(1).standard_normal((3, BIG // 64)).astype(np.float32)
    (from_file,) = hetflow.InferenceSession(path).run(None, {"x": x})
    (from_bytes,) = hetflow.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_array_equal(from_file, from_bytes)


def test_a_zoo_model_imports_the_same_either_way():
    path = zoo.model_path("squeezenet")
    lean, full = import_onnx(path), import_onnx(path.read_bytes())
    assert lean.initializers.keys() == full.initializers.keys()
    for name, array in full.initializers.items():
        np.testing.assert_array_equal(lean.initializers[name], array)
    assert [n.op_type for n in lean.nodes] == [n.op_type for n in full.nodes]


def test_loading_a_file_holds_its_weights_once(tmp_path):
    weights = np.random.default_rng(0).standard_normal((1024, 2048)).astype(np.float32)  # 8 MiB
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, ["N", 1024])],
                       [("y", TensorProto.FLOAT, ["N", 2048])], {"w": weights})  # fmt: skip
    path = tmp_path / "big.onnx"
    onnx.save(model, path)
    del model
    tracemalloc.start()
    try:
        graph = import_onnx(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(graph.initializers["w"], weights)
    assert peak < 1.2 * weights.nbytes


def test_a_file_cut_inside_a_weight_is_a_model_load_error(tmp_path):
    data = mixed_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) - 1000])
    assert Lean.of(path) is None  # the scanner steps aside; the parser explains
    with pytest.raises(ModelLoadError):
        hetflow.load_model(path)


def test_raw_data_of_the_wrong_size_is_an_invalid_model(tmp_path):
    model = mixed_model()
    del model.graph.initializer[0].dims[:]
    model.graph.initializer[0].dims.extend([10])
    path = tmp_path / "wrong.onnx"
    onnx.save(model, path)
    with pytest.raises(InvalidModelError, match="'w'.*raw_data"):
        import_onnx(path)


@pytest.mark.parametrize("content", [b"\xff" * 16, b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"])
def test_bytes_that_are_not_protobuf_are_left_to_the_parser(tmp_path, content):
    path = tmp_path / "noise.onnx"
    path.write_bytes(content)
    assert Lean.of(path) is None
    with pytest.raises(ModelLoadError):
        hetflow.load_model(path)
