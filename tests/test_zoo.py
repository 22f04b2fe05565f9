"""The model zoo: every model builds, is valid and deterministic, runs like ONNX Runtime, and says something.

Models are built once per session into a pytest temporary HETFLOW_HOME (the zoo's own disk cache; the
``zoo_home`` fixture of tests/conftest.py), so each test reads the same file. The hetflow-vs-ONNX
Runtime errors are printed in the terminal summary (tests/conftest.py).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import hetflow
from hetflow import zoo
from hetflow.errors import ModelLoadError
from hetflow.options import home_dir
from tests.conftest import ZOO_MSE_PROPERTY

NAMES = [entry.name for entry in zoo.list_models()]
BATCHES = (1, 4)


@pytest.fixture(scope="module", autouse=True)
def _zoo_home(zoo_home: Path) -> Path:
    """Every test here uses the session's temporary HETFLOW_HOME (tests/conftest.py)."""
    _cached_path.cache_clear()
    return zoo_home


@functools.cache
def _cached_path(name: str) -> Path:
    return zoo.model_path(name)


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(str(_cached_path(name)))


def _feed(name: str, batch: int) -> np.ndarray:
    shape = tuple(batch if dim == "N" else dim for dim in zoo.entry(name).input_shape)
    seed = int.from_bytes(hashlib.sha256(f"{name}/{batch}".encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@functools.cache
def _onnxruntime_outputs(name: str) -> dict[int, np.ndarray]:
    """ONNX Runtime's output (2 threads) for each test batch; the session is dropped afterwards."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    # NOTE: from the file, not a ModelProto: re-serialising VGG-19's 570 MB costs seconds.
    session = ort.InferenceSession(str(_cached_path(name)), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    return {batch: session.run(None, {input_name: _feed(name, batch)})[0] for batch in BATCHES}


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]


# -- the catalogue ---------------------------------------------------------------------------------
def test_catalogue_lists_every_seed_model():
    expected = {
        "alexnet", "zfnet512", "vgg19", "googlenet", "inception_v2", "resnet50", "squeezenet", "shufflenet",
        "densenet121", "lenet", "cifar10-quick", "mentee", "lstm-gesture", "mobilenetv2",
    }
    assert set(NAMES) == expected
    for entry in zoo.list_models():
        assert entry.input_shape[0] == "N"
        assert entry.num_classes > 1
        assert entry.description and entry.source and entry.paper


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ModelLoadError) as error:
        zoo.model_path("no-such-net")
    assert "no-such-net" in str(error.value)
    for name in ("lenet", "resnet50", "lstm-gesture"):
        assert name in str(error.value)
    with pytest.raises(ModelLoadError):
        zoo.build("alexnet2")


def test_home_dir_follows_the_environment(zoo_home: Path):
    assert home_dir() == zoo_home
    assert zoo.cache_dir() == zoo_home / "zoo"


def test_model_path_caches_with_the_zoo_version(zoo_home: Path):
    path = _cached_path("lenet")
    assert path.parent == zoo_home / "zoo"
    assert f"zoo{zoo.ZOO_VERSION}" in path.name
    stamp = path.stat().st_mtime_ns
    assert zoo.model_path("lenet") == path
    assert path.stat().st_mtime_ns == stamp, "a cached model must not be rebuilt"
    assert not [p for p in path.parent.iterdir() if p.suffix == ".tmp"], "temporary files left behind"


def test_zoo_prefix_loads_through_hetflow():
    session = hetflow.InferenceSession("zoo:lenet")
    assert session.get_inputs()[0].shape == ["N", 1, 28, 28]


# -- every model ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_model_is_valid_with_batch_n(name: str):
    model = _load(name)
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version >= 7
    opsets = {o.domain: o.version for o in model.opset_import}
    assert opsets.get("", opsets.get("ai.onnx", 0)) >= 17
    entry = zoo.entry(name)
    (graph_input,) = model.graph.input
    (graph_output,) = model.graph.output
    assert _dims(graph_input) == list(entry.input_shape)
    assert _dims(graph_output)[0] == "N"
    assert entry.num_classes in _dims(graph_output)
    for value in (graph_input, graph_output):
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    for tensor in model.graph.initializer:
        assert tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64), tensor.name
    assert not any(node.op_type == "ConstantOfShape" for node in model.graph.node)


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic_for_a_seed(name: str):
    cached = _cached_path(name).read_bytes()
    assert zoo.build(name, seed=0).SerializeToString() == cached


def test_another_seed_gives_other_weights():
    first, second = zoo.build("lenet", seed=0), zoo.build("lenet", seed=1)
    assert first.graph.initializer[0].raw_data != second.graph.initializer[0].raw_data


@pytest.mark.parametrize("name", NAMES)
def test_outputs_are_finite_and_informative(name: str):
    entry = zoo.entry(name)
    model = _load(name)
    ends_in_softmax = model.graph.node[-1].op_type == "Softmax"
    for batch in BATCHES:
        output = _onnxruntime_outputs(name)[batch]
        assert output.shape[0] == batch
        assert np.isfinite(output).all()
        scores = output.reshape(batch, -1)
        probabilities = scores if ends_in_softmax else _softmax(scores)
        top1 = probabilities.max(axis=1)
        assert (top1 > 1.5 / entry.num_classes).all(), f"near-uniform output, top-1 {top1}"
        assert (top1 < 0.999).all(), f"one-hot output, top-1 {top1}"
    first, many = _onnxruntime_outputs(name)[1], _onnxruntime_outputs(name)[4]
    assert np.abs(many[1:] - many[:1]).max() > 1e-6 * np.abs(many).max(), "outputs ignore the input"
    assert not np.allclose(first[0], many[0], rtol=1e-5, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_hetflow_matches_onnxruntime(name: str, request: pytest.FixtureRequest):
    session = hetflow.InferenceSession(_cached_path(name))
    input_name = session.get_inputs()[0].name
    for batch in BATCHES:
        expected = _onnxruntime_outputs(name)[batch]
        (actual,) = session.run(None, {input_name: _feed(name, batch)})
        assert actual.dtype == np.float32
        assert actual.shape == expected.shape
        error = np.abs(actual.astype(np.float64) - expected)
        scale = float(np.abs(expected).max())
        request.node.user_properties.append(
            (ZOO_MSE_PROPERTY, (name, batch, float((error**2).mean()), float(error.max()), scale))
        )
        assert error.max() <= 1e-4 * scale, f"batch {batch}: max error {error.max():.3g} vs max {scale:.3g}"


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)
