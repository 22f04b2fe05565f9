"""The optimisation passes on zoo models with BatchNormalization, ReLU/ReLU6, scale/shift pairs and Dropout:
nothing foldable is left, and the optimised session still matches ONNX Runtime at batch 2.

Models come from the session's temporary HETFLOW_HOME (the ``zoo_home`` fixture of tests/conftest.py),
shared with tests/test_zoo.py so that each model is built once per run.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import hetflow
from hetflow import zoo
from hetflow.graph import Graph, Node

BATCH = 2

#: Nodes of these types left after optimisation (the rest of each model's op counts may vary).
EXPECTED_LEFT = {
    # The Relu after each residual Sum fuses into the Sum.
    "resnet50": {"BatchNormalization": 0, "Relu": 0},
    "mobilenetv2": {"BatchNormalization": 0, "Clip": 0},
    # Conv -> BatchNormalization -> Mul -> Add -> Relu collapses into one Conv.
    "inception_v2": {"BatchNormalization": 0, "Mul": 0, "Add": 0, "Relu": 0},
    # Pre-activation BatchNormalizations read a Concat or a pool: Mul and Add fold into them, and the
    # Relu after them fuses into them; the ones after a 1x1 Conv fold into it.
    "densenet121": {"BatchNormalization": 62, "Mul": 0, "Add": 0, "Relu": 0},
    "googlenet": {"Relu": 0, "Dropout": 0},
    "squeezenet": {"Relu": 0, "Dropout": 0},
}
FOLDING_PRODUCERS = ("Conv", "Gemm")

pytestmark = pytest.mark.usefixtures("zoo_home")


def _feed(name: str) -> np.ndarray:
    shape = tuple(BATCH if dim == "N" else dim for dim in zoo.entry(name).input_shape)
    seed = int.from_bytes(hashlib.sha256(f"optimized/{name}".encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _onnxruntime(path: Path, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _sole_reader_producer(graph: Graph, name: str) -> Node | None:
    """The Conv/Gemm writing ``name`` when one node alone reads it and it is not a graph output."""
    producer = graph.producers().get(name)
    readers = graph.consumers().get(name, [])
    if producer is None or producer.op_type not in FOLDING_PRODUCERS or len(readers) != 1:
        return None
    return None if name in graph.outputs else producer


def _leftovers(graph: Graph) -> list[str]:
    """Nodes the passes should have removed: no-ops, and BN/activations a lone Conv/Gemm could absorb."""
    found = []
    for node in graph.nodes:
        if node.op_type in ("Dropout", "Identity"):
            found.append(f"{node.name} ({node.op_type})")
        elif node.op_type == "BatchNormalization" and _sole_reader_producer(graph, node.inputs[0]):
            found.append(f"{node.name} (BatchNormalization after a foldable producer)")
        elif node.op_type in ("Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh"):
            producer = _sole_reader_producer(graph, node.inputs[0])
            if producer is not None and producer.attrs.fused is None:
                found.append(f"{node.name} ({node.op_type} after an unfused {producer.op_type})")
    return found


@pytest.mark.parametrize("name", sorted(EXPECTED_LEFT))
def test_optimised_zoo_model_is_folded_and_matches_onnxruntime(name: str):
    path = zoo.model_path(name)
    session = hetflow.InferenceSession(path)
    before = Counter(n.op_type for n in session.source_graph.nodes)
    after = Counter(n.op_type for n in session.graph.nodes)
    assert len(session.graph.nodes) < len(session.source_graph.nodes)
    assert not _leftovers(session.graph)
    for op_type, count in EXPECTED_LEFT[name].items():
        assert after[op_type] == count, f"{op_type}: {before[op_type]} -> {after[op_type]}, expected {count}"
    assert after["Conv"] == before["Conv"] and after["Gemm"] == before["Gemm"]
    assert [o.name for o in session.get_outputs()] == session.source_graph.outputs

    x = _feed(name)
    (actual,) = session.run(None, {session.get_inputs()[0].name: x})
    expected = _onnxruntime(path, x)
    assert actual.dtype == np.float32 and actual.shape == expected.shape
    scale = float(np.abs(expected).max())
    error = float(np.abs(actual.astype(np.float64) - expected).max())
    assert error <= 1e-4 * scale, f"max error {error:.3g} vs max|ORT| {scale:.3g}"
