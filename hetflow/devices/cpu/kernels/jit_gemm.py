"""Matrix products split over numba's threads, each part one single-threaded call of the OpenBLAS that
numpy loaded (its CBLAS ``sgemm``/``dgemm``, bound by symbol name); a float32 product of one row (a
GEMV) runs compiled loops instead (``_own_vector_block``).

Why: the second core of a small VM sleeps between calls, and waking it costs ~100 us, so a product split
over hetflow's Python pool gains nothing under a few hundred microseconds, and OpenBLAS's own threads
(which spin instead of sleeping) take the core that the compiled kernels' splits need next. With the
products split in numba's OpenMP pool, the GEMMs and the compiled kernels share one pool of spinning
threads, and BLAS stays at one thread.

``available()`` is False when numpy's BLAS is not an OpenBLAS with CBLAS symbols this module knows;
callers then keep ``np.matmul``.

Measured on the 2-core VM (process-level A/B, interleaved, minimums), every convolutional network on
this pool against OpenBLAS's own two threads at batch 1: cifar10-quick 1.09 -> 0.79 ms, mentee 2.37 ->
1.46, squeezenet 14.8 -> 12.5, lenet 0.33 -> 0.28, googlenet 50.9 -> 48.1, resnet50 102 -> 98,
shufflenet and mobilenetv2 within 3%; at batch 16 (against the Python pool, or OpenBLAS's threads for
the small networks): cifar10-quick 12.7 -> 9.4, mentee 27.9 -> 17.4, lenet 2.31 -> 2.19, shufflenet
and googlenet within 4%.

The drivers call the GEMMs through two fixed names (``hetflow_sgemm``, ``hetflow_dgemm``) that
``available()`` binds to the loaded library's symbols, so numba caches them on disk like the other
compiled kernels.
"""

from __future__ import annotations

import functools

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, SpinPool, float32_matrix, put_values
from hetflow_lite.blas import NAMINGS, ROUTINES

_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _gemm_type(scalar: types.Float) -> types.Function:
    """CBLAS ``?gemm`` with 64-bit integers (pointers passed as integers of their width)."""
    flag, size, pointer = types.int32, types.int64, types.uintp
    return types.void(flag, flag, flag, size, size, size, scalar, pointer, size, pointer, size, scalar, pointer, size)


def _gemv_type(scalar: types.Float) -> types.Function:
    """CBLAS ``?gemv`` with 64-bit integers (pointers passed as integers of their width)."""
    flag, size, pointer = types.int32, types.int64, types.uintp
    return types.void(flag, flag, size, size, scalar, pointer, size, pointer, size, scalar, pointer, size)


_sgemm = types.ExternalFunction("hetflow_sgemm", _gemm_type(types.float32))
_dgemm = types.ExternalFunction("hetflow_dgemm", _gemm_type(types.float64))
_sgemv = types.ExternalFunction("hetflow_sgemv", _gemv_type(types.float32))
_dgemv = types.ExternalFunction("hetflow_dgemv", _gemv_type(types.float64))
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


@functools.cache
def available() -> bool:
    """Whether products can be split here: numpy's BLAS is an OpenBLAS with 64-bit-integer CBLAS
    symbols, now bound to the names the drivers call."""
    from hetflow.devices.cpu.threads import BLAS

    for library in BLAS._libs():
        if getattr(library, "internal_api", "") != "openblas":
            continue
        llvm.load_library_permanently(library.filepath)
        for prefix, suffix in NAMINGS:
            addresses = [llvm.address_of_symbol(f"{prefix}{name}{suffix}") for name in ROUTINES]
            if all(addresses):
                for name, address in zip(ROUTINES, addresses):
                    llvm.add_symbol(f"hetflow_{name}", address)
                return True
    return False


@numba.njit(nogil=True, cache=True, inline="always")
def _layout(row_stride, column_stride, rows, columns, item):  # noqa: ANN001, ANN202
    """A 2-D operand's (CBLAS transpose flag, leading dimension) from its strides and shape (bytes, items),
    flag -1 when neither its rows nor its columns are contiguous: ``operand``, callable in compiled code."""
    if column_stride == item and row_stride % item == 0 and row_stride // item >= max(columns, 1):
        return _NO_TRANS, row_stride // item
    if row_stride == item and column_stride % item == 0 and column_stride // item >= max(rows, 1):
        return _TRANS, column_stride // item
    return -1, 0


def operand(array: np.ndarray) -> tuple[int, int] | None:
    """(transpose flag, leading dimension) of a 2-D operand as CBLAS row-major sees it, or None when
    neither its rows nor its columns are contiguous."""
    flag, leading = _layout(array.strides[0], array.strides[1], array.shape[0], array.shape[1], array.itemsize)
    return None if flag < 0 else (flag, leading)


def _one_float_dtype(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether the operands share one float dtype CBLAS takes, and CBLAS is bound (``available``)."""
    return a.dtype == b.dtype == out.dtype and out.dtype in _FLOATS and available()


def _fits(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> tuple[tuple[int, int], ...] | None:
    """The CBLAS layouts of one item's operands, or None when they do not fit (or the library is absent)."""
    if not _one_float_dtype(a, b, out):
        return None
    layouts = operand(a), operand(b), operand(out)
    if any(layout is None for layout in layouts) or layouts[2][0] != _NO_TRANS:  # type: ignore[index]
        return None
    return layouts  # type: ignore[return-value]


def split_product(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: int, pool: SpinPool | None = None) -> bool:
    """``out = a @ b`` (2-D, one float dtype) in ``parts`` blocks of columns, or of rows where A outweighs
    B (``_column_block``), one single-threaded GEMM each, run by numba's threads, or by ``pool``'s.
    Returns False, having done nothing, when the operands do not fit CBLAS."""
    if pool is not None:
        job = product_job(a, b, out, parts)
        if job is None:
            return False
        job.run(pool)
        return True
    layouts = _fits(a, b, out)
    if layouts is None:
        return False
    (trans_a, lda), (trans_b, ldb), (_, ldc) = layouts
    if a.shape[0] == 1:
        # One row (a fully connected layer at batch 1): GEMV, which reads B once without packing it.
        # NOTE: sgemm with M = 1 packs B first: AlexNet's 9216x4096 layer took 30 ms instead of ~12.
        step = 1 if trans_a == _NO_TRANS else lda
        _vector_columns(parts, b.shape[1], a.shape[1], a, step, b, trans_b, ldb, out)
    else:
        _columns(parts, a.shape[0], b.shape[1], a.shape[1], a, trans_a, lda, b, trans_b, ldb, out, ldc)
    return True


def product_job(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: int) -> Job | None:
    """``out = a @ b`` (2-D, one float dtype) as a spin-pool job in ``parts`` blocks of columns, or of rows
    where A outweighs B (``split_product``'s parts); None when the operands do not fit CBLAS."""
    if not _one_float_dtype(a, b, out):
        return None
    # NOTE: the layouts are worked out in compiled code with the block: ~2 us less than ``_fits``.
    block = np.zeros(_BLOCK_SLOTS, np.int64)
    job = _pack_product(block, a, b, out)
    if job < 0:
        return None
    # A float32 one-row product runs compiled loops (``_own_vector_block``); the rest call CBLAS.
    calls_blas = job != _VECTOR_JOB or out.dtype != np.float32
    return Job(_spin_jobs()[job], block, parts, (a, b, out), calls_blas)


def split_stack(a: np.ndarray, b: np.ndarray, out: np.ndarray, parts: int, pool: SpinPool | None = None) -> bool:
    """``out[i] = a[i] @ b[i]`` (``a`` or ``b`` may be one 2-D matrix for every item) over ``out``'s
    leading axis, in ``parts`` ranges of items, one single-threaded GEMM per item, run by numba's
    threads, or by ``pool``'s. Returns False, having done nothing, when the operands do not fit CBLAS."""
    if out.ndim != 3 or a.ndim not in (2, 3) or b.ndim not in (2, 3):
        return False
    first_a, first_b = (a[0] if a.ndim == 3 else a), (b[0] if b.ndim == 3 else b)
    layouts = _fits(first_a, first_b, out[0])
    if layouts is None:
        return False
    (trans_a, lda), (trans_b, ldb), (_, ldc) = layouts
    item = out.itemsize
    step_a = a.strides[0] // item if a.ndim == 3 else 0
    step_b = b.strides[0] // item if b.ndim == 3 else 0
    sizes = (out.shape[0], out.shape[1], out.shape[2], first_a.shape[1])
    if pool is None:
        _items(parts, *sizes, a, step_a, trans_a, lda, b, step_b, trans_b, ldb, out, out.strides[0] // item, ldc)
    else:
        block = np.zeros(_BLOCK_SLOTS, np.int64)
        _pack(block, sizes, a, (step_a, trans_a, lda), b, (step_b, trans_b, ldb), out, (out.strides[0] // item, ldc, item))
        pool.run(_spin_jobs()[2], block, parts)
    return True


@numba.njit(nogil=True, cache=True, inline="always")
def _gemm(single, m, n, k, a, trans_a, lda, b, trans_b, ldb, out, ldc):  # noqa: ANN001, ANN202
    """One single-threaded product on raw addresses (``a``, ``b``, ``out``): float32 if ``single``."""
    if single:
        _sgemm(_ROW_MAJOR, trans_a, trans_b, m, n, k, np.float32(1), a, lda, b, ldb, np.float32(0), out, ldc)
    else:
        _dgemm(_ROW_MAJOR, trans_a, trans_b, m, n, k, 1.0, a, lda, b, ldb, 0.0, out, ldc)


@numba.njit(parallel=True, nogil=True, cache=True)
def _columns(parts, m, n, k, a, trans_a, lda, b, trans_b, ldb, out, ldc):  # noqa: ANN001, ANN202
    """``out = a @ b`` by ``parts`` blocks of columns or rows (``_column_block``)."""
    for part in numba.prange(parts):
        _column_block(part, parts, m, n, k, a.ctypes.data, trans_a, lda, b.ctypes.data, trans_b, ldb,
                      out.ctypes.data, ldc, out.itemsize)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _column_block(part, parts, m, n, k, a, trans_a, lda, b, trans_b, ldb, out, ldc, item):  # noqa: ANN001, ANN202
    """Block ``part`` of ``parts`` of ``out = a @ b`` (raw addresses, elements ``item`` bytes): a block of
    columns, or of rows where A outweighs B (``m > n``): a part of columns reads all of A, one of rows
    all of B. AlexNet's conv3 at batch 1 (384 x 2304 weights, 169 columns) split by columns read its
    3.4 MB of weights once per thread."""
    if m > n:
        first, last = m * part // parts, m * (part + 1) // parts
        if last > first:
            offset = first * lda if trans_a == _NO_TRANS else first
            _gemm(item == 4, last - first, n, k, a + offset * item, trans_a, lda, b, trans_b, ldb,
                  out + first * ldc * item, ldc)  # fmt: skip
        return
    first, last = n * part // parts, n * (part + 1) // parts
    # Column ``first`` of B: its element offset, by the layout B is read in.
    offset = first if trans_b == _NO_TRANS else first * ldb
    _gemm(item == 4, m, last - first, k, a, trans_a, lda, b + offset * item, trans_b, ldb, out + first * item, ldc)


@numba.njit(parallel=True, nogil=True, cache=True)
def _items(parts, count, m, n, k, a, step_a, trans_a, lda, b, step_b, trans_b, ldb, out, step_out, ldc):  # noqa: ANN001, ANN202
    """``out[i] = a[i] @ b[i]`` by ``parts`` ranges of items (a step of 0: one matrix for every item)."""
    for part in numba.prange(parts):
        _item_range(part, parts, count, m, n, k, a.ctypes.data, step_a, trans_a, lda, b.ctypes.data, step_b,
                    trans_b, ldb, out.ctypes.data, step_out, ldc, out.itemsize)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _item_range(part, parts, count, m, n, k, a, step_a, trans_a, lda, b, step_b, trans_b, ldb, out, step_out, ldc,
                item):  # noqa: ANN001, ANN202
    """Range ``part`` of ``parts`` of the items of ``out[i] = a[i] @ b[i]`` (raw addresses)."""
    for index in range(count * part // parts, count * (part + 1) // parts):
        _gemm(item == 4, m, n, k, a + index * step_a * item, trans_a, lda, b + index * step_b * item, trans_b, ldb,
              out + index * step_out * item, ldc)  # fmt: skip


@numba.njit(parallel=True, nogil=True, cache=True)
def _vector_columns(parts, n, k, x, step_x, b, trans_b, ldb, out):  # noqa: ANN001, ANN202
    """``out[0] = x[0] @ b`` (``x`` one row of ``k``, elements ``step_x`` apart) by ``parts`` column blocks."""
    for part in numba.prange(parts):
        _vector_block(part, parts, n, k, x.ctypes.data, step_x, b.ctypes.data, trans_b, ldb, out.ctypes.data,
                      out.itemsize)  # fmt: skip


@numba.njit(nogil=True, cache=True)
def _vector_block(part, parts, n, k, x, step_x, b, trans_b, ldb, out, item):  # noqa: ANN001, ANN202
    """Column block ``part`` of ``parts`` of ``out[0] = x[0] @ b`` (raw addresses, elements ``item`` bytes)."""
    first, last = n * part // parts, n * (part + 1) // parts
    y = out + first * item
    if item == 4:
        _own_vector_block(first, last, k, x, step_x, b, trans_b, ldb, y)
    elif trans_b == _NO_TRANS:
        # float64 by BLAS. B [k, n] row-major: y = B[:, first:last]^T x.
        _gemv(False, _TRANS, k, last - first, b + first * item, ldb, x, step_x, y)
    else:
        # float64 by BLAS. B is W^T, W [n, k] row-major: y = W[first:last] x.
        _gemv(False, _NO_TRANS, last - first, k, b + first * ldb * item, ldb, x, step_x, y)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _own_vector_block(first, last, k, x, step_x, b, trans_b, ldb, y):  # noqa: ANN001, ANN202
    """Columns ``first:last`` of ``x @ B`` (float32, raw addresses) by compiled loops, not BLAS: a spin-pool
    job runs beside the caller, and a GEMV there that OpenBLAS splits over its own threads waits for
    workers that the spinning threads keep off the cores (mentee's 2048 -> 512 layer took 3.5 ms instead
    of 0.09)."""
    width = last - first
    result = float32_matrix(y, 1, width)[0]
    # NOTE: a contiguous x gets its own (C-layout) view, so that the loops vectorise.
    if trans_b == _NO_TRANS:
        rows = float32_matrix(b + first * 4, k, ldb)
        if step_x == 1:
            _combine_rows(rows, float32_matrix(x, 1, k)[0], result)
        else:
            _combine_rows(rows, float32_matrix(x, k, step_x)[:, 0], result)
    else:
        rows = float32_matrix(b + first * ldb * 4, width, ldb)
        if step_x == 1:
            _rows_times(rows, float32_matrix(x, 1, k)[0], result)
        else:
            _rows_times(rows, float32_matrix(x, k, step_x)[:, 0], result)


@numba.njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _combine_rows(rows, vector, result):  # noqa: ANN001, ANN202
    """``result = vector @ rows[:, :result.size]`` (B [k, n] row-major), one row of B at a time."""
    result[:] = 0
    for index in range(vector.shape[0]):
        scale, row = vector[index], rows[index]
        for column in range(result.shape[0]):
            result[column] += scale * row[column]


@numba.njit(nogil=True, cache=True, fastmath=True, error_model="numpy")
def _rows_times(rows, vector, result):  # noqa: ANN001, ANN202
    """``result = rows[:, :k] @ vector`` (W [n, k] row-major), four rows at a time: each element of
    ``vector`` is loaded once per four rows."""
    width, k = result.shape[0], vector.shape[0]
    row = 0
    while row + 4 <= width:
        first, second, third, fourth = rows[row], rows[row + 1], rows[row + 2], rows[row + 3]
        a0 = a1 = a2 = a3 = np.float32(0)
        for index in range(k):
            value = vector[index]
            a0 += first[index] * value
            a1 += second[index] * value
            a2 += third[index] * value
            a3 += fourth[index] * value
        result[row], result[row + 1], result[row + 2], result[row + 3] = a0, a1, a2, a3
        row += 4
    for rest in range(row, width):
        total = np.float32(0)
        for index in range(k):
            total += rows[rest, index] * vector[index]
        result[rest] = total


#: Slots of a product job's argument block (``_pack``).
_BLOCK_SLOTS = 16


@numba.njit(nogil=True, cache=True)
def _pack(block, head, a, after_a, b, after_b, out, tail):  # noqa: ANN001, ANN202
    """A product job's argument block: ``head``, A's address, ``after_a``, B's, ``after_b``, Y's, ``tail``
    (the jobs below read them in that order)."""
    slot = put_values(block, 0, head)
    slot = put_values(block, slot, (np.int64(a.ctypes.data), *after_a))
    slot = put_values(block, slot, (np.int64(b.ctypes.data), *after_b))
    put_values(block, slot, (np.int64(out.ctypes.data), *tail))


@numba.njit(nogil=True, cache=True)
def _pack_product(block, a, b, out):  # noqa: ANN001, ANN202
    """The argument block of ``out = a @ b`` (2-D, one dtype) for a spin-pool job; returns the job's
    index in ``_spin_jobs()`` (0: column or row blocks of a GEMM, 1: of a one-row product, ``_vector_job``),
    or -1 when an operand does not fit CBLAS."""
    item = out.itemsize
    trans_a, lda = _layout(a.strides[0], a.strides[1], a.shape[0], a.shape[1], item)
    trans_b, ldb = _layout(b.strides[0], b.strides[1], b.shape[0], b.shape[1], item)
    trans_out, ldc = _layout(out.strides[0], out.strides[1], out.shape[0], out.shape[1], item)
    if trans_a < 0 or trans_b < 0 or trans_out != _NO_TRANS:
        return -1
    if a.shape[0] == 1:  # one row: the GEMV job, as in ``split_product``
        step = 1 if trans_a == _NO_TRANS else lda
        _pack(block, (b.shape[1], a.shape[1]), a, (step,), b, (trans_b, ldb), out, (item,))
        return 1
    _pack(block, (a.shape[0], b.shape[1], a.shape[1]), a, (trans_a, lda), b, (trans_b, ldb), out, (ldc, item))
    return 0


def _column_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_column_block`` as a spin-pool job (``split_product``'s argument block)."""
    _column_block(chunk, chunks, args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8],
                  args[9], args[10], args[11])  # fmt: skip


def _item_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_item_range`` as a spin-pool job (``split_stack``'s argument block)."""
    _item_range(chunk, chunks, args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8],
                args[9], args[10], args[11], args[12], args[13], args[14], args[15])  # fmt: skip


def _vector_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    """``_vector_block`` as a spin-pool job (``split_product``'s argument block)."""
    _vector_block(chunk, chunks, args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8])


#: ``_spin_jobs()``'s index of the one-row product's job (``_vector_job``).
_VECTOR_JOB = 1


@functools.cache
def _spin_jobs() -> tuple[int, int, int]:
    """The addresses of the column, vector and item jobs (compiled once ``available`` bound BLAS's
    symbols)."""
    return spin_pool.job(_column_job), spin_pool.job(_vector_job), spin_pool.job(_item_job)


@numba.njit(nogil=True, cache=True, inline="always")
def _gemv(single, trans, m, n, a, lda, x, step_x, y, step_y=1):  # noqa: ANN001, ANN202
    """``y = op(A) x`` on raw addresses, A ``[m, n]`` row-major, the vectors' elements ``step_x`` and
    ``step_y`` apart: float32 if ``single``."""
    if single:
        _sgemv(_ROW_MAJOR, trans, m, n, np.float32(1), a, lda, x, step_x, np.float32(0), y, step_y)
    else:
        _dgemv(_ROW_MAJOR, trans, m, n, 1.0, a, lda, x, step_x, 0.0, y, step_y)
