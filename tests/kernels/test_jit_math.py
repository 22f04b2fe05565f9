"""The vectorisable ``exp`` of compiled loops (``hetflow.devices.cpu.kernels.jit_math``)."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest

from hetflow.devices.cpu.kernels.jit_math import exp


@numba.njit(error_model="numpy")
def _exp_all(values, out):  # noqa: ANN001, ANN202
    for index in range(values.shape[0]):
        out[index] = exp(values[index])


def _compiled_exp(values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    _exp_all(values, out)
    return out


def test_float32_exp_is_within_one_ulp_over_its_range():
    values = np.linspace(-87.0, 87.9, 400_001, dtype=np.float32)
    exact = np.exp(values.astype(np.float64))
    relative = np.abs(_compiled_exp(values) - exact) / exact
    assert relative.max() <= 2.0**-23  # one unit in the last place of a float32 in [1, 2)


def test_float32_exp_is_exact_where_it_must_be():
    values = np.array([0.0, 1.0, -1.0, math.log(2.0)], dtype=np.float32)
    result = _compiled_exp(values)
    assert result[0] == 1.0
    np.testing.assert_allclose(result[1:], np.exp(values[1:].astype(np.float64)), rtol=2.0**-23)


def test_float32_exp_saturates_instead_of_overflowing_and_passes_nan():
    values = np.array([-1000.0, -88.0, 89.0, 1000.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    result = _compiled_exp(values)
    lowest, highest = np.exp(np.float64(-87.33654)), np.exp(np.float64(88.0))
    np.testing.assert_allclose(result[[0, 1, 5]], lowest, rtol=1e-6)
    np.testing.assert_allclose(result[[2, 3, 4]], highest, rtol=1e-6)
    assert np.isfinite(result[:6]).all()
    assert np.isnan(result[6])


@pytest.mark.parametrize("value", [-700.0, -3.5, 0.0, 0.25, 709.0])
def test_float64_exp_is_libm_exp(value):
    result = _compiled_exp(np.array([value]))
    assert result[0] == math.exp(value)
