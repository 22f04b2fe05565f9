"""One column's LSTM gates from W and R packed in panels of 16 hidden units (``jit_gate_panels``)."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu.kernels.jit_gate_panels import (
    PANEL_COLUMNS,
    UNITS,
    packed_bytes,
    packed_gates,
    panel_count,
    share_gates,
)


def _operands(hidden: int, inputs: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((4 * hidden, hidden)).astype(np.float32)
    w = rng.standard_normal((4 * hidden, inputs)).astype(np.float32)
    h = rng.standard_normal(hidden).astype(np.float32)
    x = rng.standard_normal(inputs).astype(np.float32)
    bias = rng.standard_normal(4 * hidden).astype(np.float32)
    return r, w, h, x, bias


@pytest.mark.parametrize(("hidden", "depth"), [(16, 5), (13, 13), (40, 7), (3, 1)])
def test_a_panels_column_is_one_unit_of_one_gate_and_zero_past_the_last_unit(hidden, depth):
    m = np.arange(4 * hidden * depth, dtype=np.float32).reshape(4 * hidden, depth) + 1
    panels = packed_gates(m)
    assert panels.shape == (panel_count(hidden) * depth, PANEL_COLUMNS)
    assert panels.nbytes == packed_bytes(hidden, depth)
    by_panel = panels.reshape(panel_count(hidden), depth, 4, UNITS)
    for unit in range(panel_count(hidden) * UNITS):
        panel, lane = divmod(unit, UNITS)
        for gate in range(4):
            column = by_panel[panel, :, gate, lane]
            if unit < hidden:
                np.testing.assert_array_equal(column, m[gate * hidden + unit])
            else:
                assert not column.any()


def test_packing_refuses_a_matrix_that_is_not_four_gates():
    with pytest.raises(ValueError, match="4 x hidden"):
        packed_gates(np.zeros((10, 3), np.float32))


@pytest.mark.parametrize(("hidden", "inputs"), [(16, 6), (13, 5), (40, 1), (512, 6), (3, 2)])
def test_every_gate_is_the_bias_plus_both_products(hidden, inputs):
    r, w, h, x, bias = _operands(hidden, inputs)
    expected = bias.astype(np.float64) + w.astype(np.float64) @ x + r.astype(np.float64) @ h
    gates = np.full(4 * hidden, np.nan, np.float32)
    share_gates(packed_gates(r).reshape(-1), packed_gates(w).reshape(-1), h, x, bias, gates, 0, panel_count(hidden))
    np.testing.assert_allclose(gates, expected, rtol=1e-5, atol=1e-4 * np.sqrt(hidden))


def test_a_share_writes_only_its_units_of_each_gate_and_nothing_past_the_gates():
    hidden, inputs = 40, 3  # three panels, the last of 8 units
    r, w, h, x, bias = _operands(hidden, inputs, seed=1)
    r_panels, w_panels = packed_gates(r).reshape(-1), packed_gates(w).reshape(-1)
    room = np.full(4 * hidden + 32, np.nan, np.float32)  # the gates, then floats that must stay untouched
    gates = room[: 4 * hidden]
    share_gates(r_panels, w_panels, h, x, bias, gates, 2, 3)  # units 32..39 only
    written = ~np.isnan(room)
    expected = np.zeros_like(written)
    for gate in range(4):
        expected[gate * hidden + 32 : gate * hidden + 40] = True
    np.testing.assert_array_equal(written, expected)
    share_gates(r_panels, w_panels, h, x, bias, gates, 0, 2)
    assert not np.isnan(gates).any() and np.isnan(room[4 * hidden :]).all()
    full = bias.astype(np.float64) + w.astype(np.float64) @ x + r.astype(np.float64) @ h
    np.testing.assert_allclose(gates, full, rtol=1e-5, atol=1e-4)


def test_nan_in_the_state_reaches_every_gate_it_multiplies():
    r, w, h, x, bias = _operands(20, 4, seed=2)
    h[7] = np.nan
    gates = np.zeros(80, np.float32)
    share_gates(packed_gates(r).reshape(-1), packed_gates(w).reshape(-1), h, x, bias, gates, 0, 2)
    assert np.isnan(gates).all()
