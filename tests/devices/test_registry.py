"""Device names as users write them, the "auto" order, and what happens when OpenCL cannot start."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices import registry
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.opencl import OpenCLDevice
from hetflow.errors import DeviceUnavailableError
from tests.helpers import make_model


def test_cpu_resolves():
    assert registry.get_device("cpu").id == "cpu"


def test_opencl_index_resolves_to_one_shared_device(opencl):
    device = registry.get_device("opencl:0")
    assert isinstance(device, OpenCLDevice) and device.id == "opencl:0"
    assert registry.get_device("opencl") is device  # "opencl" means device 0; contexts are shared


def test_missing_opencl_index_raises_with_the_reason(opencl):
    with pytest.raises(DeviceUnavailableError, match="opencl:7"):
        registry.get_device("opencl:7")


@pytest.mark.parametrize("name", ["opencl:x", "tpu", "gpu:0"])
def test_malformed_or_unknown_names_raise(name):
    with pytest.raises(DeviceUnavailableError):
        registry.get_device(name)


def test_auto_puts_opencl_first_and_the_cpu_last(opencl):
    ids = [d.id for d in registry.resolve_devices("auto")]
    assert ids[0] == "opencl:0" and ids[-1] == "cpu" and ids.count("cpu") == 1


def test_named_device_resolves_alone(opencl):
    assert [d.id for d in registry.resolve_devices("opencl:0")] == ["opencl:0"]


def _no_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        OpenCLDevice, "is_available", classmethod(lambda cls: "no OpenCL platform found (test)")
    )


def test_without_a_platform_auto_is_the_cpu_and_a_named_device_raises(monkeypatch):
    _no_platform(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no platform at all is not worth a warning: nothing failed
        assert [d.id for d in registry.resolve_devices("auto")] == ["cpu"]
    with pytest.raises(DeviceUnavailableError, match="no OpenCL platform found"):
        registry.resolve_devices("opencl:0")


def test_auto_warns_once_and_runs_on_the_cpu_when_opencl_fails_to_start(monkeypatch):
    monkeypatch.setattr(registry, "accelerator_ids", lambda: ["opencl:0"])
    monkeypatch.setattr(OpenCLDevice, "is_available", classmethod(lambda cls: None))

    def broken(device_id: str):
        if device_id == "cpu":
            return CPUDevice()
        raise DeviceUnavailableError("driver crashed (test)")

    monkeypatch.setattr(registry, "get_device", broken)
    with pytest.warns(RuntimeWarning, match="driver crashed") as caught:
        devices = registry.resolve_devices("auto")
    assert len(caught) == 1
    assert [d.id for d in devices] == ["cpu"]


def _mlp_model():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((13, 10)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Relu", ["hb"], ["r"], name="relu"),
        helper.make_node("Softmax", ["r"], ["y"], name="softmax", axis=-1),
    ]
    return make_model(
        nodes, [("x", TensorProto.FLOAT, ["N", 13])], [("y", TensorProto.FLOAT, ["N", 10])], {"w": w, "b": b}
    )


@pytest.mark.parametrize("device", ["opencl:0", "auto"])
def test_session_on_opencl_matches_the_cpu(opencl, device):
    model = _mlp_model()
    x = np.random.default_rng(2).standard_normal((5, 13)).astype(np.float32)
    [expected] = hetflow.InferenceSession(model, device="cpu").run(None, {"x": x})
    session = hetflow.InferenceSession(model, device=device)
    # Every node of this model has an OpenCL kernel, so the planner puts all of them there.
    assert set(session.placement().values()) == {"opencl:0"}, session.placement()
    [got] = session.run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def _float64_conv_relu_model():
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    weights = {"w": rng.standard_normal((4, 3, 3, 3)), "b": rng.standard_normal(4)}
    return make_model(
        nodes, [("x", TensorProto.DOUBLE, ["N", 3, 8, 8])], [("y", TensorProto.DOUBLE, ["N", 4, 8, 8])], weights
    )


@pytest.mark.parametrize("device", ["opencl:0", "auto"])
def test_a_float64_model_with_a_symbolic_batch_stays_on_the_cpu(opencl, device):
    model = _float64_conv_relu_model()
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8))
    [expected] = hetflow.InferenceSession(model, device="cpu").run(None, {"x": x})
    session = hetflow.InferenceSession(model, device=device)
    # NOTE: the OpenCL kernels run float32 only; the dtypes are known although the batch is not.
    assert session.placement()["conv"] == "cpu", session.placement()
    assert set(session.placement(batch=2).values()) == {"cpu"}
    [got] = session.run(None, {"x": x})
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
