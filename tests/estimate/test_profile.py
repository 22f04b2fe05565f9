"""DeviceProfile JSON, calibration coverage, and what-if predictions from edited profiles."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from hetflow.cli import main
from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.table import CPU_KERNELS
from hetflow.estimate.calibrate import SKIPPED_ALGORITHMS
from hetflow.estimate.models import FALLBACK_COEF
from hetflow.estimate.predict import estimate
from hetflow.estimate.profile import (
    FEATURES,
    PROFILE_VERSION,
    DeviceProfile,
    ProfileError,
    default_profile_path,
)
from hetflow.options import HOME_ENV
from tests.helpers import make_model


def _conv_model():
    rng = np.random.default_rng(0)
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
        [("x", TensorProto.FLOAT, ["N", 64, 28, 28])],
        [("y", TensorProto.FLOAT, None)],
        {"w": rng.standard_normal((64, 64, 3, 3)).astype(np.float32)},
    )


def test_profile_records_machine_and_round_trips(quick_profile, tmp_path):
    assert quick_profile.device == "cpu" and quick_profile.quick
    assert quick_profile.fingerprint == CPUDevice().fingerprint()
    assert quick_profile.created[:2] == "20" and quick_profile.hetflow_version and quick_profile.threads >= 1
    path = quick_profile.save(tmp_path / "p.json")
    data = json.loads(path.read_text())
    assert data["format"] == "hetflow.device-profile" and data["features"] == list(FEATURES)
    loaded = DeviceProfile.load(path)
    assert loaded == quick_profile


def test_a_profile_measures_what_a_run_replayed_whole_adds_and_saves(quick_profile, tmp_path):
    """Beside its layers timed alone, a run replayed whole from compiled code saves each layer's call
    from Python (about a microsecond here) and adds what it does around its jobs (feeds, outputs; time
    and the Python objects it allocates): all
    measured where such runs exist (2 threads or more, the spinning pool), else 0; a profile written
    before they were measured reads as 0."""
    from hetflow.devices.cpu.kernels import jit_gemm

    if quick_profile.threads < 2 or not jit_gemm.available():
        assert quick_profile.replayed_step_s == quick_profile.direct_run_s == quick_profile.direct_run_bytes == 0
    else:
        assert 0.0 < quick_profile.replayed_step_s < 2e-5
        assert 0.0 < quick_profile.direct_run_s < 5e-4
        assert 0 < quick_profile.direct_run_bytes < 16384
    data = quick_profile.to_dict()
    del data["replayed_step_s"], data["direct_run_s"], data["direct_run_bytes"]
    old = DeviceProfile.from_dict(data)
    assert old.replayed_step_s == old.direct_run_s == old.direct_run_bytes == 0


def test_calibration_covers_every_registered_conv_algorithm(quick_profile):
    algorithms = {k.algorithm for k in CPU_KERNELS.kernels["Conv"]} - set(SKIPPED_ALGORITHMS)
    assert algorithms <= {key.split("/")[1] for key in quick_profile.ops if key.startswith("Conv/")}
    for op in ("Gemm", "MaxPool", "AveragePool", "LRN", "BatchNormalization", "Relu", "Add", "Softmax", "LSTM",
               "Concat"):
        assert any(key.startswith(f"{op}/") for key in quick_profile.ops), op
    for model in quick_profile.ops.values():
        assert len(model.coef) == len(FEATURES) and all(c >= 0 for c in model.coef)
    assert quick_profile.gemm.peak_gflops > 0 and quick_profile.memory.bandwidth_gbs
    # Bandwidth never rises with the working set (noise is flattened out).
    rates = quick_profile.memory.bandwidth_gbs
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_views_are_calibrated_as_aliases(quick_profile):
    assert quick_profile.ops["Reshape/default"].retained < 0.5
    assert quick_profile.ops["Relu/default"].retained > 0.5


def test_half_the_gflops_predicts_a_slower_conv(quick_profile, tmp_path):
    # Physical coefficients (every term counted once) so the test does not depend on this machine's fit.
    ops = {key: dataclasses.replace(model, coef=list(FALLBACK_COEF)) for key, model in quick_profile.ops.items()}
    base = dataclasses.replace(quick_profile, ops=ops)
    slow = dataclasses.replace(base, gemm=dataclasses.replace(base.gemm, peak_gflops=base.gemm.peak_gflops / 2))
    path = slow.save(tmp_path / "slow.json")
    fast_ms = estimate(_conv_model(), base, batch=4).layers[0].predicted_ms
    slow_ms = estimate(_conv_model(), str(path), batch=4).layers[0].predicted_ms
    assert slow_ms > fast_ms * 1.05
    # A GEMM-bound layer is at most twice as slow when only the arithmetic rate halves.
    assert slow_ms <= fast_ms * 2.0 + 1e-9


def test_cli_what_if_with_an_edited_profile(profile_path, tmp_path, capsys):
    data = json.loads(profile_path.read_text())
    for model in data["ops"].values():  # physical coefficients: independent of this machine's fit
        model["coef"] = list(FALLBACK_COEF)
    here_path = tmp_path / "here.json"
    here_path.write_text(json.dumps(data))
    data["name"] = "imaginary chip"
    data["gemm"]["peak_gflops"] /= 4
    edited = tmp_path / "imaginary.json"
    edited.write_text(json.dumps(data))
    model = tmp_path / "conv.onnx"
    model.write_bytes(_conv_model().SerializeToString())
    assert main(["estimate", str(model), "--device", str(edited), "--json"]) == 0
    what_if = json.loads(capsys.readouterr().out)
    assert main(["estimate", str(model), "--device", str(here_path), "--json"]) == 0
    here = json.loads(capsys.readouterr().out)
    assert "imaginary chip" in what_if["device"]
    assert what_if["totals"]["predicted_ms"] > here["totals"]["predicted_ms"]


def test_bad_profiles_are_refused(tmp_path):
    with pytest.raises(ProfileError, match="cannot read"):
        DeviceProfile.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not JSON"):
        DeviceProfile.load(tmp_path / "x.json")
    (tmp_path / "y.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ProfileError, match="not a hetflow device profile"):
        DeviceProfile.load(tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({"format": "hetflow.device-profile", "version": PROFILE_VERSION}))
    with pytest.raises(ProfileError, match="malformed"):
        DeviceProfile.load(tmp_path / "z.json")
    (tmp_path / "old.json").write_text(json.dumps({"format": "hetflow.device-profile", "version": 0}))
    with pytest.raises(ProfileError, match="calibrate"):
        DeviceProfile.load(tmp_path / "old.json")


def test_calibrate_command_writes_the_default_profile_then_estimate_uses_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert main(["calibrate", "--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    device = CPUDevice()
    path = default_profile_path(device.id, device.fingerprint())
    assert path.exists() and str(path) in out and str(tmp_path / "home" / "profiles") in str(path)
    assert "Conv/im2col" in out
    model = tmp_path / "conv.onnx"
    model.write_bytes(_conv_model().SerializeToString())
    assert main(["estimate", str(model), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert "quick calibration" in captured.out and "running a quick calibration" not in captured.err


def test_estimate_without_a_profile_calibrates_a_quick_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    model = tmp_path / "conv.onnx"
    model.write_bytes(_conv_model().SerializeToString())
    assert main(["estimate", str(model), "--device", "cpu", "--json"]) == 0
    captured = capsys.readouterr()
    assert "hetflow calibrate --device cpu" in captured.err
    assert json.loads(captured.out)["layers"][0]["op"] == "Conv"
    device = CPUDevice()
    assert default_profile_path(device.id, device.fingerprint()).exists()


def test_transfer_model_is_zero_on_the_host_and_linear_elsewhere(quick_profile, tmp_path):
    from hetflow.estimate.profile import TransferModel

    assert quick_profile.transfer.to_device_seconds(1 << 20) == 0.0  # the CPU copies nothing
    model = TransferModel(latency_s=1e-5, to_device_gbs=2.0, to_host_gbs=4.0)
    assert model.to_device_seconds(2_000_000_000) == pytest.approx(1.0 + 1e-5)
    assert model.to_host_seconds(2_000_000_000) == pytest.approx(0.5 + 1e-5)
    assert model.to_host_seconds(0) == 0.0
    edited = dataclasses.replace(quick_profile, transfer=model)
    path = edited.save(tmp_path / "p.json")
    assert DeviceProfile.load(path).transfer == model


def test_opencl_transfers_are_measured_through_the_device():
    from hetflow.devices.opencl import OpenCLDevice, get_opencl_device
    from hetflow.estimate.calibrate import QUICK, _calibrate_transfer

    reason = OpenCLDevice.is_available()
    if reason is not None:
        pytest.skip(f"no OpenCL device: {reason}")
    model = _calibrate_transfer(QUICK, get_opencl_device(0))
    assert model.to_device_gbs > 0 and model.to_host_gbs > 0 and model.latency_s >= 0


def test_a_pool_over_the_whole_map_is_predicted_as_the_global_pool_it_runs_as(quick_profile):
    # The CPU kernel reduces such a pool in one pass (no per-plane tap loop), as GlobalAveragePool does.
    model = make_model(
        [
            helper.make_node("AveragePool", ["x"], ["whole"], name="whole", kernel_shape=[7, 7]),
            helper.make_node("GlobalAveragePool", ["x"], ["global"], name="global"),
            helper.make_node("AveragePool", ["x"], ["windows"], name="windows", kernel_shape=[3, 3]),
        ],
        [("x", TensorProto.FLOAT, [4, 512, 7, 7])],
        [("whole", TensorProto.FLOAT, None), ("global", TensorProto.FLOAT, None), ("windows", TensorProto.FLOAT, None)],
    )
    layers = {layer.name: layer for layer in estimate(model, quick_profile).layers}
    assert layers["whole"].predicted_ms == pytest.approx(layers["global"].predicted_ms, rel=1e-9)
    assert layers["windows"].predicted_ms != pytest.approx(layers["global"].predicted_ms, rel=1e-3)
