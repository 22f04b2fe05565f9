"""Training on ``opencl:0``: the same steps as on the CPU give the same losses and weights (float32,
1e-4 relative), with the forward and backward of every node its kernels support on the device, the
rest (BatchNormalization's training form, Dropout, LRN's backward) on the CPU."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.train import SGD, Adam, AdamW, Trainer
from tests.train.test_trainer import small_cnn

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def opencl() -> str:
    """The OpenCL device's id, skipped with the reason where OpenCL cannot start (as
    ``tests/devices/conftest.py``'s fixture, which this directory does not see)."""
    from hetflow.devices.opencl import OpenCLDevice, get_opencl_device

    reason = OpenCLDevice.is_available()
    if reason is not None:
        pytest.skip(f"no OpenCL platform: {reason}")
    return get_opencl_device(0).id


def _relative(actual: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(expected), initial=0.0)), 1e-12)
    return float(np.max(np.abs(actual - expected), initial=0.0)) / scale


def _steps(trainer: Trainer, batches: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    return [trainer.train_step(x, y)[0] for x, y in batches]


def _batches(shape: tuple[int, ...], classes: int, batch: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [
        (rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, classes, batch))
        for _ in range(count)
    ]


def _assert_same_training(cpu: Trainer, device: Trainer, batches) -> None:  # noqa: ANN001
    cpu_losses, device_losses = _steps(cpu, batches), _steps(device, batches)
    np.testing.assert_allclose(device_losses, cpu_losses, rtol=TOLERANCE)
    for name, expected in cpu.params.items():
        assert _relative(device.params[name], expected) <= TOLERANCE, name
    for name, expected in cpu.buffers.items():
        assert _relative(device.buffers[name], expected) <= TOLERANCE, name


def test_small_cnn_mixes_devices_and_matches_the_cpu(opencl):
    optimizer = {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3}
    cpu = Trainer(small_cnn(), optimizer=SGD(**optimizer), seed=3)
    device = Trainer(small_cnn(), optimizer=SGD(**optimizer), device=opencl, seed=3)
    placement = device.tape.placement
    assert placement["conv1"] == (opencl, opencl) and placement["conv2"] == (opencl, opencl)
    # The training forms have no OpenCL kernel and LRN no OpenCL backward rule: the CPU takes them.
    assert placement["bn1"] == ("cpu", "cpu") and placement["dropout"] == ("cpu", "cpu")
    assert placement["lrn"] == (opencl, "cpu")
    _assert_same_training(cpu, device, _batches((3, 9, 9), 4, 6, 3))


# NOTE: Adam's first steps move every weight by about lr * sign(g): with the default eps, a weight whose
# gradient is ~1e-9 on both devices (a cancelling sum) moves by +lr on one and -lr on the other. An eps
# above float32's rounding of the gradients keeps the comparison about the kernels, not that sign.
@pytest.mark.parametrize(
    "make_optimizer",
    [lambda: Adam(2e-3, eps=1e-5), lambda: AdamW(2e-3, weight_decay=0.05, eps=1e-5)],
    ids=["adam", "adamw"],
)
def test_lenet_steps_match_the_cpu(opencl, make_optimizer):
    cpu = Trainer("zoo:lenet", optimizer=make_optimizer())
    device = Trainer("zoo:lenet", optimizer=make_optimizer(), device=opencl)
    assert set(device.tape.placement.values()) <= {(opencl, opencl), (opencl, "cpu")}
    _assert_same_training(cpu, device, _batches((1, 28, 28), 10, 5, 2))


def test_auto_picks_the_accelerator_and_predicts_like_the_cpu(opencl):
    device = Trainer("zoo:lenet", optimizer=SGD(0.01), device="auto")
    assert device.device == opencl
    cpu = Trainer("zoo:lenet", optimizer=SGD(0.01))
    [(x, y)] = _batches((1, 28, 28), 10, 7, 1)
    device.train_step(x, y)
    cpu.train_step(x, y)
    assert _relative(device.predict(x, batch_size=4), cpu.predict(x, batch_size=4)) <= TOLERANCE


def test_parameters_live_in_memory_the_device_updates_in_place(opencl):
    from hetflow.devices.opencl import HOST_ALIGNMENT

    trainer = Trainer("zoo:lenet", optimizer=SGD(0.01, momentum=0.9), device=opencl)
    [(x, y)] = _batches((1, 28, 28), 10, 3, 1)
    before = {name: array for name, array in trainer.params.items()}
    trainer.train_step(x, y)
    for name, array in trainer.params.items():
        assert array is before[name], "the update replaced a parameter array instead of writing it"
        assert array.ctypes.data % HOST_ALIGNMENT == 0


def test_a_float64_model_stays_on_the_cpu(opencl):
    from tests.train.test_trainer import as_float64

    device = Trainer(as_float64(small_cnn(dropout=False)), optimizer=SGD(0.05), device=opencl)
    assert set(device.tape.placement.values()) == {("cpu", "cpu")}, "the OpenCL kernels run float32 only"
    cpu = Trainer(as_float64(small_cnn(dropout=False)), optimizer=SGD(0.05))
    batches = [(x.astype(np.float64), y) for x, y in _batches((3, 9, 9), 4, 4, 2)]
    _assert_same_training(cpu, device, batches)
    assert all(p.dtype == np.float64 for p in device.params.values())
