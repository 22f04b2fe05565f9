"""ONNX import: loading from every kind of source, opsets, folding, and clear errors on bad input."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.errors import InvalidModelError, ModelLoadError, UnsupportedOpsError
from tests.helpers import add_relu_model, make_model


def test_loads_from_path_bytes_and_proto(tmp_path):
    model = add_relu_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    x = np.array([[-2.0, 0.0, 3.0]], np.float32)
    for source in (path, str(path), model.SerializeToString(), model):
        (y,) = hetflow.InferenceSession(source).run(None, {"x": x})
        np.testing.assert_array_equal(y, [[0.0, 1.0, 4.0]])


def test_external_data_is_loaded(tmp_path):
    weights = np.arange(12, dtype=np.float32).reshape(3, 4)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [("x", TensorProto.FLOAT, ["N", 3])],
        [("y", TensorProto.FLOAT, ["N", 4])],
        {"w": weights},
    )
    path = tmp_path / "ext.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    graph = hetflow.load_model(path)
    np.testing.assert_array_equal(graph.initializers["w"], weights)


def test_missing_file_is_a_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="not found"):
        hetflow.InferenceSession(tmp_path / "nope.onnx")


def test_corrupt_file_is_a_model_load_error(tmp_path):
    data = add_relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError):
        hetflow.InferenceSession(path)


@pytest.mark.parametrize("content", [b"", b"hello, I am a text file\n", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"])
def test_non_onnx_file_is_a_model_load_error(tmp_path, content):
    path = tmp_path / "not_a_model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelLoadError, match="ONNX"):
        hetflow.InferenceSession(path)


def test_unsupported_ops_are_listed_together():
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="ok"),
            helper.make_node("Einsum", ["a", "a"], ["b"], name="first_bad", equation="ij,ij->ij"),
            helper.make_node("Relu", ["b"], ["c"], name="also_ok"),
            helper.make_node("NonMaxSuppression", ["c", "c"], ["d"], name="second_bad"),
            helper.make_node("Frobnicate", ["d"], ["y"], name="custom", domain="com.example"),
        ],
        [("x", TensorProto.FLOAT, [2, 2])],
        [("y", TensorProto.FLOAT, None)],
    )
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(UnsupportedOpsError) as raised:
        hetflow.InferenceSession(model)
    error = raised.value
    assert [n.name for n in error.nodes] == ["first_bad", "second_bad", "custom"]
    message = str(error)
    for expected in ("Einsum", "NonMaxSuppression", "Frobnicate", "first_bad", "second_bad", "com.example"):
        assert expected in message


def test_opset_outside_the_supported_range_is_rejected():
    with pytest.raises(ModelLoadError, match="opset 6"):
        hetflow.InferenceSession(add_relu_model(opset=6))


def test_unknown_attribute_names_the_node_and_the_accepted_ones():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="r", bogus=3)],
        [("x", TensorProto.FLOAT, [2])],
        [("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidModelError, match="'r'.*bogus"):
        hetflow.InferenceSession(model)


def test_symbolic_batch_is_kept_in_inputs_and_outputs():
    session = hetflow.InferenceSession(add_relu_model())
    assert session.get_inputs()[0].shape == ["N", 3]
    assert session.get_outputs()[0].shape == ["N", 3]
    assert session.get_inputs()[0].type == "tensor(float)"


def test_constant_nodes_become_initializers():
    model = make_model(
        [
            helper.make_node("Constant", [], ["c"], value_floats=[1.0, 2.0, 3.0]),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        [("x", TensorProto.FLOAT, ["N", 3])],
        [("y", TensorProto.FLOAT, ["N", 3])],
    )
    graph = hetflow.load_model(model)
    assert [n.op_type for n in graph.nodes] == ["Add"]
    np.testing.assert_array_equal(graph.initializers["c"], [1.0, 2.0, 3.0])
