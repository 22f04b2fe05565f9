"""Winograd's transforms with the tiles in the vector lanes (``jit_winograd_lanes``) against float64 numpy:
the matrices, the tile table, the input transform's padding, partial groups and batches, the output
transform's bias, activations, cropping and Concat slices, and LLVM's generic gathers."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from hetflow.devices.cpu.kernels import jit_winograd_lanes as wl
from hetflow.devices.cpu.kernels import winograd

RNG = np.random.default_rng(31)
RELU, CLIP, LEAKY, NONE = ([1, 0, np.inf], [1, -0.5, 0.75], [0.1, -np.inf, np.inf], [1, -np.inf, np.inf])


@pytest.mark.parametrize("m", [2, 4])
def test_the_compiled_matrices_are_cook_toom(m):
    found = winograd.transforms(m)
    np.testing.assert_array_equal(np.array(wl.INPUT_MATRICES[m]), found.bt)
    np.testing.assert_array_equal(np.array(wl.OUTPUT_MATRICES[m]), found.at)


def test_the_tile_table_gives_offsets_rows_and_columns_padded_to_groups():
    table = wl.tile_table(2, (2, 3), 4, (-1, -1), 10, 500).reshape(3, -1)
    assert table.shape == (3, 16)  # 12 tiles, one group
    np.testing.assert_array_equal(table[1, :6], [-1, -1, -1, 3, 3, 3])
    np.testing.assert_array_equal(table[2, :6], [-1, 3, 7, -1, 3, 7])
    assert table[0, 6] == 500 + (-1) * 10 + (-1)  # the second image's first tile
    assert (table[1:, 12:] < -(2**29)).all()  # past the last tile: every tap outside


def _input_reference(x: np.ndarray, m: int, pads: tuple[int, int], tiles: tuple[int, int]) -> np.ndarray:
    a = m + 2
    bt = winograd.transforms(m).bt
    batch, channels, height, width = x.shape
    padded = np.zeros((batch, channels, tiles[0] * m + 2, tiles[1] * m + 2))
    rows, cols = min(height, padded.shape[2] - pads[0]), min(width, padded.shape[3] - pads[1])
    padded[:, :, pads[0] : pads[0] + rows, pads[1] : pads[1] + cols] = x[:, :, :rows, :cols]
    v = np.zeros((a, a, channels, batch, *tiles))
    for i in range(tiles[0]):
        for j in range(tiles[1]):
            d = padded[:, :, i * m : i * m + a, j * m : j * m + a]  # [N, C, a, a]
            v[:, :, :, :, i, j] = np.einsum("pr,ncrq,sq->psCn".replace("C", "c"), bt, d, bt).transpose(0, 1, 2, 3)
    return v.reshape(a * a, channels, -1)


def _tiles(height: int, width: int, pads: tuple[int, int, int, int], m: int) -> tuple[int, int]:
    out_h, out_w = height + pads[0] + pads[2] - 2, width + pads[1] + pads[3] - 2
    return -(-out_h // m), -(-out_w // m)


INPUT_CASES = [
    ((1, 64, 16, 16), (1, 1, 1, 1)),  # MentorNet's 16x16: one group of tiles a channel
    ((3, 5, 9, 11), (1, 1, 1, 1)),  # a batch: groups across images, a partial last one
    ((1, 3, 12, 10), (1, 0, 0, 1)),  # asymmetric pads: the last tiles read past X
    ((2, 4, 3, 3), (2, 2, 2, 2)),  # padding wider than one
    ((1, 2, 40, 6), (0, 0, 0, 0)),  # tall and thin, no padding
]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("x_shape", "pads"), INPUT_CASES)
def test_the_input_transform_matches_float64(m, x_shape, pads):
    x = RNG.standard_normal(x_shape).astype(np.float32)
    tiles = _tiles(*x_shape[2:], pads, m)
    expected = _input_reference(x.astype(np.float64), m, pads[:2], tiles)
    v = np.full(expected.shape, np.nan, np.float32)
    wl.input_transform(x, m, pads[:2], tiles, v)
    np.testing.assert_allclose(v, expected, rtol=1e-5, atol=1e-4)


def _output_reference(products: np.ndarray, m: int, bias: np.ndarray, shape: tuple[int, ...],
                      tiles: tuple[int, int], constants: list[float]) -> np.ndarray:  # fmt: skip
    a = m + 2
    at = winograd.transforms(m).at
    batch, kernels, out_h, out_w = shape
    full = np.zeros((batch, kernels, tiles[0] * m, tiles[1] * m))
    blocks = products.astype(np.float64).reshape(a, a, kernels, batch, *tiles)
    for i in range(tiles[0]):
        for j in range(tiles[1]):
            tile = np.einsum("ir,rskn,js->nkij", at, blocks[:, :, :, :, i, j], at)
            full[:, :, i * m : (i + 1) * m, j * m : (j + 1) * m] = tile
    y = full[:, :, :out_h, :out_w] + bias[None, :, None, None]
    slope, low, high = constants
    y = np.where(y < 0, y * slope, y)
    return np.clip(y, low, high)


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("constants", [NONE, RELU, CLIP, LEAKY], ids=["none", "relu", "clip", "leaky"])
@pytest.mark.parametrize("shape", [(1, 64, 16, 16), (3, 5, 7, 9), (2, 3, 5, 5)])
def test_the_output_transform_matches_float64(m, constants, shape):
    tiles = (-(-shape[2] // m), -(-shape[3] // m))
    count = shape[0] * tiles[0] * tiles[1]
    products = RNG.standard_normal(((m + 2) ** 2, shape[1], count)).astype(np.float32)
    bias = RNG.standard_normal(shape[1]).astype(np.float32)
    y = np.full(shape, np.nan, np.float32)
    activation = np.array(constants, np.float32)
    table = wl.tile_table(shape[0], tiles, m, (0, 0), shape[3], shape[1] * shape[2] * shape[3])
    wl.output_kernels(products.reshape(-1), table, count, shape[1], shape[2], shape[3], y.reshape(-1), bias,
                      activation, 0, shape[1], m)  # fmt: skip
    expected = _output_reference(products, m, bias.astype(np.float64), shape, tiles, constants)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-4)


def test_the_output_writes_a_concat_slice_and_nothing_around_it():
    m, shape = 4, (3, 4, 6, 7)
    tiles = (2, 2)
    products = RNG.standard_normal((36, 4, 3 * 4)).astype(np.float32)
    concat = np.full((3, 9, 6, 7), np.nan, np.float32)
    flat = concat.reshape(-1)[2 * 42 :]  # from the slice's first element; images 9 planes apart
    assert wl.output_transform(products, np.zeros(4, np.float32), (flat, 9 * 42), shape, tiles, None)
    expected = _output_reference(products, m, np.zeros(4), shape, tiles, NONE)
    np.testing.assert_allclose(concat[:, 2:6], expected, rtol=1e-5, atol=1e-4)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 6:]).all()


def test_nan_passes_through_both_transforms():
    x = np.ones((1, 1, 8, 8), np.float32)
    x[0, 0, 1, 1] = np.nan  # read by the first tile only (tile rows and columns -1..4, 3..8)
    v = np.zeros((36, 1, 4), np.float32)
    wl.input_transform(x, 4, (1, 1), (2, 2), v)
    assert np.isnan(v[:, 0, 0]).any() and not np.isnan(v[:, 0, 3]).any()  # the first tile reads it, the last not
    y = np.zeros((1, 1, 8, 8), np.float32)
    assert wl.output_transform(v, np.zeros(1, np.float32), (y.reshape(-1), 64), y.shape, (2, 2), None)
    assert np.isnan(y[0, 0, :4, :4]).any() and not np.isnan(y[0, 0, 4:, 4:]).any()


def test_an_activation_the_store_lacks_is_left_to_the_caller():
    from hetflow.ops.activation import FusedActivation

    products = np.zeros((16, 1, 1), np.float32)
    y = np.zeros((1, 1, 2, 2), np.float32)
    flat = (y.reshape(-1), 4)
    assert wl.output_job(products, np.zeros(1, np.float32), flat, y.shape, (1, 1), FusedActivation("Sigmoid")) is None
    assert not wl.output_transform(products, np.zeros(1, np.float32), flat, y.shape, (1, 1), FusedActivation("Sigmoid"))


def test_llvm_generic_gathers_give_the_same_transforms(monkeypatch):
    """Without AVX-512 the IR uses LLVM's generic masked gather and scatter (compiled afresh here)."""
    monkeypatch.setattr(wl, "_x86_gathers", lambda: False)
    inputs = numba.njit(wl.input_channels.py_func)
    outputs = numba.njit(wl.output_kernels.py_func)
    x = RNG.standard_normal((2, 3, 9, 10)).astype(np.float32)
    tiles, m = _tiles(9, 10, (1, 1, 1, 1), 4), 4
    count = 2 * tiles[0] * tiles[1]
    v = np.full((36, 3, count), np.nan, np.float32)
    inputs(x.reshape(-1), wl.tile_table(2, tiles, m, (-1, -1), 10, 270), count, 3, 9, 10, v.reshape(-1), 0, 3, m)
    np.testing.assert_allclose(v, _input_reference(x.astype(np.float64), m, (1, 1), tiles), rtol=1e-5, atol=1e-4)
    y = np.full((2, 3, 9, 10), np.nan, np.float32)
    bias = np.arange(3, dtype=np.float32)
    outputs(v.reshape(-1), wl.tile_table(2, tiles, m, (0, 0), 10, 270), count, 3, 9, 10, y.reshape(-1), bias,
            np.array(RELU, np.float32), 0, 3, m)  # fmt: skip
    expected = _output_reference(v, m, bias.astype(np.float64), y.shape, tiles, RELU)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-3)
