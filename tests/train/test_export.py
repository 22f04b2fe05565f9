"""Graph -> ONNX export (``hetflow.frontends.onnx_export``): models round-trip through ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import hetflow
from hetflow import zoo
from hetflow.errors import InvalidModelError
from hetflow.frontends import load_model
from hetflow.frontends.onnx_export import export_model, save_model
from hetflow.passes.manager import optimize

MODELS = ["lenet", "cifar10-quick", "lstm-gesture", "mobilenetv2", "squeezenet"]


@pytest.mark.parametrize("name", MODELS)
def test_exported_zoo_model_runs_in_onnx_runtime_like_hetflow(name: str) -> None:
    graph = load_model(f"zoo:{name}")
    model = export_model(graph)
    onnx.checker.check_model(model, full_check=True)
    shape = [2 if isinstance(d, str) else d for d in zoo.entry(name).input_shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    feed = {graph.inputs[0]: x}
    ours = hetflow.InferenceSession(graph).run(None, feed)[0]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, feed)[0]
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4 * float(np.abs(ours).max()))
    # Symbolic batch kept, attributes equal to their defaults left out.
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_defaults_are_left_out_and_floats_stay_floats(tmp_path) -> None:
    graph = load_model("zoo:cifar10-quick")
    path = tmp_path / "cifar.onnx"
    save_model(graph, path)
    model = onnx.load(str(path))
    pools = [n for n in model.graph.node if n.op_type in ("MaxPool", "AveragePool")]
    assert all({a.name for a in n.attribute} >= {"kernel_shape", "strides", "ceil_mode"} for n in pools)
    assert not any(a.name == "storage_order" for n in pools for a in n.attribute)
    gemms = [n for n in model.graph.node if n.op_type == "Gemm"]
    for node in gemms:
        for attribute in node.attribute:
            if attribute.name in ("alpha", "beta"):
                assert attribute.type == onnx.AttributeProto.FLOAT


def test_optimised_graphs_with_fused_activations_are_refused() -> None:
    fused = optimize(load_model("zoo:lenet"))
    assert any(getattr(n.attrs, "fused", None) is not None for n in fused.nodes)
    with pytest.raises(InvalidModelError, match="fused"):
        export_model(fused)
