"""The CPU's compiled optimizer updates (``jit_optim``) against the optimizers' numpy updates: the same
float32 values, step after step, for every option."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hetflow.devices.cpu import training
from hetflow.devices.cpu.kernels import jit_optim
from hetflow.train.device import TrainingKernels
from hetflow.train.optim import SGD, Adam, AdamW, Optimizer

OPTIMIZERS = {
    "sgd": lambda: SGD(0.05),
    "sgd-momentum-decay": lambda: SGD(0.05, momentum=0.9, weight_decay=1e-2),
    "sgd-nesterov": lambda: SGD(0.05, momentum=0.9, nesterov=True),
    "adam": lambda: Adam(2e-3),
    "adam-l2": lambda: Adam(2e-3, weight_decay=0.05),
    "adamw": lambda: AdamW(2e-3, weight_decay=0.05),
}
COMPILED = TrainingKernels(updates={"sgd": jit_optim.sgd_update, "adam": jit_optim.adam_update})


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_compiled_updates_give_the_numpy_values(name):
    rng = np.random.default_rng(5)
    params = {
        "w": rng.standard_normal((17, 9)).astype(np.float32),
        "b": rng.standard_normal(13).astype(np.float32),
    }
    numpy_params, compiled_params = copy.deepcopy(params), copy.deepcopy(params)
    numpy_optimizer: Optimizer = OPTIMIZERS[name]()
    compiled_optimizer: Optimizer = OPTIMIZERS[name]()
    for _ in range(4):
        grads = {key: rng.standard_normal(value.shape).astype(np.float32) for key, value in params.items()}
        numpy_optimizer.step(numpy_params, grads)
        compiled_optimizer.step(compiled_params, grads, COMPILED)
    for key in params:
        assert not np.array_equal(compiled_params[key], params[key])
        np.testing.assert_array_equal(compiled_params[key], numpy_params[key])
    for key, slots in numpy_optimizer.state.items():
        for slot, value in slots.items():
            np.testing.assert_array_equal(compiled_optimizer.state[key][slot], value)


def test_a_transposed_gradient_is_read_by_value():
    """A gradient that is a view (not C-contiguous) updates the same as its contiguous copy."""
    rng = np.random.default_rng(6)
    param = rng.standard_normal((5, 8)).astype(np.float32)
    grad = rng.standard_normal((8, 5)).astype(np.float32).T
    expected = param - np.float32(0.1) * grad
    jit_optim.sgd_update(param, grad, None, lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0)
    np.testing.assert_array_equal(param, expected)


def test_the_cpu_registers_its_updates():
    kernels = TrainingKernels()
    training.register_training(None, kernels)  # type: ignore[arg-type]  # the CPU's rules ignore the device
    assert kernels.updates == {"sgd": jit_optim.sgd_update, "adam": jit_optim.adam_update}
