"""Small graphs and checks shared by the optimisation-pass tests.

``check_pass`` runs one pass alone on a loaded model and checks that the rewritten graph is valid, that
it computes what the unoptimised session and ONNX Runtime compute, that the output names stayed, and
that the loaded graph's arrays were not touched (passes must create new arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

import hetflow
from hetflow.graph import Graph
from hetflow.passes import infer_shapes
from tests.helpers import make_model, run_onnxruntime

FLOAT = TensorProto.FLOAT
RNG = np.random.default_rng(11)


def node(op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs) -> onnx.NodeProto:
    """A node named after its op and first output."""
    return helper.make_node(op_type, list(inputs), list(outputs), name=f"{op_type}_{outputs[0]}", **attrs)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[int | str]]],
    outputs: Sequence[tuple[str, int, Sequence[int | str] | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    proto = make_model(nodes, inputs, outputs, initializers, opset=opset)
    proto.ir_version = helper.find_min_ir_version_for(list(proto.opset_import))
    return proto


def weights(*shape: int, positive: bool = False) -> np.ndarray:
    """Random float32 weights (strictly positive ones for variances)."""
    array = np.asarray(RNG.standard_normal(shape), dtype=np.float32)
    return np.abs(array) + np.float32(0.1) if positive else array


def batchnorm_params(prefix: str, channels: int) -> dict[str, np.ndarray]:
    """scale, B, mean and var initializers called ``{prefix}_scale`` ... for a BatchNormalization."""
    return {
        f"{prefix}_scale": weights(channels),
        f"{prefix}_B": weights(channels),
        f"{prefix}_mean": weights(channels),
        f"{prefix}_var": weights(channels, positive=True),
    }


def batchnorm(source: str, output: str, prefix: str, **attrs) -> onnx.NodeProto:
    inputs = [source, f"{prefix}_scale", f"{prefix}_B", f"{prefix}_mean", f"{prefix}_var"]
    return node("BatchNormalization", inputs, [output], **attrs)


def op_types(graph: Graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


def feeds_for(proto: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    """Random float32 feeds for every graph input, ``N`` bound to ``batch``."""
    feeds = {}
    initializers = {t.name for t in proto.graph.initializer}
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shape = [batch if d.dim_param else d.dim_value for d in dims]
        feeds[value.name] = RNG.standard_normal(shape).astype(np.float32)
    return feeds


def check_pass(
    proto: onnx.ModelProto,
    graph_pass: Callable[[Graph], Graph],
    batches: Sequence[int] = (1, 3),
    rtol: float = 1e-5,
) -> Graph:
    """Apply ``graph_pass`` alone to the loaded ``proto``; returns the rewritten graph after checking it.

    Checks: the result validates and re-infers, the session outputs keep their names, and at every
    batch the rewritten graph computes what the unoptimised session and ONNX Runtime compute (to
    ``rtol`` of the largest output magnitude); the loaded graph's initializers are unchanged.
    """
    loaded = hetflow.load_model(proto)
    before = {name: array.copy() for name, array in loaded.initializers.items()}
    rewritten = graph_pass(loaded.copy())
    rewritten.validate()
    rewritten = infer_shapes(rewritten)
    for name, array in loaded.initializers.items():
        np.testing.assert_array_equal(array, before[name], err_msg=f"pass modified initializer {name}")

    plain = hetflow.InferenceSession(proto, optimize=False)
    optimised = hetflow.InferenceSession(rewritten, optimize=False)
    assert [o.name for o in optimised.get_outputs()] == [o.name for o in plain.get_outputs()]
    assert [i.name for i in optimised.get_inputs()] == [i.name for i in plain.get_inputs()]
    for batch in batches:
        feeds = feeds_for(proto, batch)
        expected = plain.run(None, feeds)
        actual = optimised.run(None, feeds)
        oracle = run_onnxruntime(proto, feeds)
        for got, want, ort_out in zip(actual, expected, oracle):
            assert got.dtype == want.dtype and got.shape == want.shape
            if want.dtype.kind != "f":
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(got, ort_out)
                continue
            scale = max(float(np.abs(want).max()), 1e-30)
            np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale)
            np.testing.assert_allclose(got, ort_out, rtol=0, atol=rtol * scale)
    return rewritten
