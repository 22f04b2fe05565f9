"""Products split over numba's threads through numpy's OpenBLAS (``jit_gemm``), against numpy's matmul,
and ``split_matmul`` routing to them under ``own_threads``."""

from __future__ import annotations

import numpy as np
import pytest

from hetflow.devices.cpu import threads
from hetflow.devices.cpu.kernels import jit_gemm

pytestmark = pytest.mark.skipif(not jit_gemm.available(), reason="numpy's BLAS is not an OpenBLAS with CBLAS")
RNG = np.random.default_rng(3)


def _pool(spinning: bool) -> threads.SpinPool | None:
    """The spinning pool the products split on, or None for numba's threads."""
    return threads.spin_pool(2) if spinning else None


def _matrix(shape: tuple[int, int], dtype: type, transposed: bool) -> np.ndarray:
    """A matrix of ``shape`` stored row-major, or as the transpose of a row-major one."""
    if transposed:
        return np.ascontiguousarray(RNG.standard_normal(shape[::-1]).astype(dtype)).T
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("spinning", [False, True])
@pytest.mark.parametrize(("rows", "columns"), [(7, 29), (29, 7), (2, 3)], ids=["by-columns", "by-rows", "rows-under-parts"])
def test_split_product_matches_matmul(
    dtype: type, trans_a: bool, trans_b: bool, parts: int, spinning: bool, rows: int, columns: int
) -> None:
    """Blocks of columns, or of rows where A outweighs B (more rows than columns)."""
    a, b = _matrix((rows, 13), dtype, trans_a), _matrix((13, columns), dtype, trans_b)
    out = np.full((rows, columns), np.nan, dtype)
    assert jit_gemm.split_product(a, b, out, parts, _pool(spinning))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spinning", [False, True])
def test_split_product_writes_a_row_strided_slice_only(spinning: bool) -> None:
    a, b = _matrix((5, 8), np.float32, False), _matrix((8, 12), np.float32, True)
    wide = np.full((5, 20), np.nan, np.float32)
    assert jit_gemm.split_product(a, b, wide[:, 4:16], 2, _pool(spinning))
    np.testing.assert_allclose(wide[:, 4:16], a @ b, rtol=1e-5, atol=1e-5)
    assert np.isnan(wide[:, :4]).all() and np.isnan(wide[:, 16:]).all()


def test_one_images_grouped_product_splits_over_its_groups_on_the_spinning_pool() -> None:
    """``[1, groups, rows, columns]`` (a grouped im2col Conv at batch 1) splits on the spinning pool, not
    on the Python pool, whose thread would share a core with a spinning one."""
    w = RNG.standard_normal((2, 48, 90)).astype(np.float32)
    columns = RNG.standard_normal((1, 2, 90, 900)).astype(np.float32)
    out = np.full((1, 2, 48, 900), np.nan, np.float32)
    handoffs = threads.pool_handoffs()
    with threads.own_threads(2, spin=True):
        threads.split_matmul(w, columns, out=out)
    assert threads.pool_handoffs() == handoffs
    np.testing.assert_allclose(out, np.matmul(w, columns), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shared", ["a", "b", None])
def test_split_stack_matches_matmul(shared: str | None) -> None:
    a = RNG.standard_normal((6, 9) if shared == "a" else (5, 6, 9)).astype(np.float32)
    b = RNG.standard_normal((9, 11) if shared == "b" else (5, 9, 11)).astype(np.float32)
    out = np.full((11, 5, 6), np.nan, np.float32).transpose(1, 2, 0)  # items apart, columns strided
    assert not jit_gemm.split_stack(a, b, out, 2)  # the output's rows are not contiguous
    out = np.full((5, 6, 11), np.nan, np.float32)
    assert jit_gemm.split_stack(a, b, out, 2)
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spinning", [False, True])
def test_operands_that_cblas_cannot_read_are_refused(spinning: bool) -> None:
    pool = _pool(spinning)
    a = RNG.standard_normal((8, 10)).astype(np.float32)[:, ::2]  # neither rows nor columns contiguous
    b = RNG.standard_normal((5, 4)).astype(np.float32)
    out = np.zeros((8, 4), np.float32)
    assert not jit_gemm.split_product(a, b, out, 2, pool)
    assert not jit_gemm.split_product(a.astype(np.int32), b.astype(np.int32), out.astype(np.int32), 2, pool)
    assert not jit_gemm.split_product(a[:1], b, out[:1], 2, pool)  # a one-row product too
    assert not jit_gemm.split_product(np.ascontiguousarray(a), b, out.T.copy().T, 2, pool)  # column-major out
    assert not jit_gemm.split_product(np.ascontiguousarray(a), b.astype(np.float64), out, 2, pool)
    assert (out == 0).all()


def test_split_matmul_uses_numba_pool_when_own_threads_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    original = jit_gemm.split_product
    monkeypatch.setattr(
        jit_gemm, "split_product", lambda a, b, out, parts, pool: calls.append(parts) or original(a, b, out, parts, pool)
    )
    a = RNG.standard_normal((40, 300)).astype(np.float32)
    b = RNG.standard_normal((1, 300, 200)).astype(np.float32)  # one image of a stack
    out = np.empty((1, 40, 200), np.float32)
    with threads.own_threads(2, numba_pool=True):
        threads.split_matmul(a, b, out)
    assert calls == [2]
    calls.clear()
    with threads.own_threads(2):  # the Python pool
        threads.split_matmul(a, b, out)
    assert calls == []
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-4, atol=1e-4)
    out[:] = np.nan
    with threads.own_threads(2, spin=True):  # the spinning pool
        threads.split_matmul(a, b, out)
    assert calls == [2]
    np.testing.assert_allclose(out, np.matmul(a, b), rtol=1e-4, atol=1e-4)
    calls.clear()
    threads.split_matmul(a, b, out)  # outside own_threads: one numpy call
    assert calls == []


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("strided_row", [False, True])
@pytest.mark.parametrize("spinning", [False, True])
def test_one_row_products_take_gemv(dtype: type, trans_b: bool, strided_row: bool, spinning: bool) -> None:
    # A fully connected layer at batch 1; its row may be a column of a wider array (elements lda apart).
    # On the spinning pool, float32 parts run compiled loops instead of BLAS (53 columns in two parts:
    # the four-row loop and its remainder).
    source = RNG.standard_normal((37, 3) if strided_row else (1, 37)).astype(dtype)
    a = source[:, :1].T if strided_row else source
    b = _matrix((37, 53), dtype, trans_b)
    out = np.full((1, 53), np.nan, dtype)
    assert jit_gemm.split_product(a, b, out, 2, _pool(spinning))
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_small_products_bind_numpy_and_larger_ones_the_splitting_product() -> None:
    smallest = min(threads.MIN_MACS_PER_NATIVE_SPLIT, threads.MIN_MACS_PER_SPLIT)
    assert threads.matmul_for(smallest - 1) is np.matmul
    assert threads.matmul_for(smallest) is threads.split_matmul
