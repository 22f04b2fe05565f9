"""The spinning pool (``hetflow.devices.cpu.spin_pool``): every chunk of a job runs exactly once, from
the caller and the workers, and the products split on it match numpy."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.kernels import jit_gemm
from hetflow.devices.cpu.spin_pool import SpinPool, float32_1d, float32_2d, int64_1d, job_arguments


def _count_chunk(args, chunk, chunks):  # noqa: ANN001, ANN202
    """Add 1 to counts[chunk] and record ``chunks`` (a job for the tests)."""
    counts = int64_1d(args, 0)
    counts[chunk] += 1
    seen = int64_1d(args, 2)
    seen[0] = chunks


def _scale_chunk(args, chunk, chunks):  # noqa: ANN001, ANN202
    """y[range of chunk] = 2 * x[range of chunk] (a job that touches float arrays)."""
    x = float32_1d(args, 0)
    y = float32_1d(args, 2)
    first, last = x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks
    for i in range(first, last):
        y[i] = 2 * x[i]


def _shift_chunk(args, chunk, chunks):  # noqa: ANN001, ANN202
    """One step of a recurrence: ``rows[s + 1][i] = rows[s][i + 1 (wrapping)] + 1`` on the chunk's range of
    i, ``s`` the step in ``args[3]``; each chunk reads a value of the next chunk's range from the step
    before, so a step that began before the last one ended would read a stale value."""
    rows = float32_2d(args, 0)
    step, width = args[3], rows.shape[1]
    first, last = width * chunk // chunks, width * (chunk + 1) // chunks
    for i in range(first, last):
        rows[step + 1, i] = rows[step, (i + 1) % width] + 1


def _order_chunk(args, chunk, chunks):  # noqa: ANN001, ANN202
    """Record in order[chunk] how many chunks ran before this one (a job for one thread at a time)."""
    order = int64_1d(args, 0)
    ran = int64_1d(args, 2)
    order[chunk] = ran[0]
    ran[0] += 1


COUNT = spin_pool.job(_count_chunk)
SCALE = spin_pool.job(_scale_chunk)
SHIFT = spin_pool.job(_shift_chunk)
ORDER = spin_pool.job(_order_chunk)


@pytest.fixture
def pool():
    pool = SpinPool(1, grace=1_000)
    pool.spin()
    yield pool
    pool.rest()
    pool.close()


@pytest.mark.parametrize("chunks", [1, 2, 7, 64])
def test_every_chunk_runs_exactly_once(pool, chunks):
    for _ in range(300):
        counts, seen = np.zeros(chunks, np.int64), np.zeros(1, np.int64)
        pool.run(COUNT, job_arguments([counts, seen]), chunks)
        assert counts.tolist() == [1] * chunks
        assert seen[0] == chunks


@pytest.mark.parametrize("alone", [False, True])
def test_steps_run_in_order_each_after_the_last(pool, alone):
    steps, width = 200, 4096
    rows = np.zeros((steps + 1, width), np.float32)
    rows[0] = np.arange(width)
    args = job_arguments([rows, 0])  # slot 3: the step
    (SpinPool(0) if alone else pool).run_steps(SHIFT, args, 8, steps, 3)
    np.testing.assert_array_equal(rows[steps], (np.arange(width) + steps) % width + steps)


def test_a_job_starts_the_worker_and_completes(pool):
    x = np.arange(1 << 20, dtype=np.float32)
    y = np.zeros_like(x)
    pool.run(SCALE, job_arguments([x, y]), 2)
    np.testing.assert_array_equal(y, 2 * x)
    assert len(pool._threads) == 1 and pool._threads[0].is_alive()


def test_a_job_completes_after_the_workers_went_to_sleep(pool):
    pool.run(SCALE, job_arguments([np.ones(8, np.float32), np.zeros(8, np.float32)]), 2)
    pool.rest()
    time.sleep(0.05)  # past the grace: the worker sleeps
    x = np.arange(1000, dtype=np.float32)
    y = np.zeros_like(x)
    pool.run(SCALE, job_arguments([x, y]), 4)
    np.testing.assert_array_equal(y, 2 * x)
    pool.spin()


def test_concurrent_callers_each_get_every_chunk(pool):
    """A caller that finds the pool busy runs its chunks alone: no chunk is lost or run twice."""
    failures = []

    def caller() -> None:
        for _ in range(200):
            counts, seen = np.zeros(5, np.int64), np.zeros(1, np.int64)
            pool.run(COUNT, job_arguments([counts, seen]), 5)
            if counts.tolist() != [1] * 5:
                failures.append(counts.tolist())

    callers = [threading.Thread(target=caller) for _ in range(3)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join()
    assert failures == []


def test_bad_requests_raise(pool):
    with pytest.raises(ValueError, match="at most"):
        pool.run(COUNT, job_arguments([np.zeros(1, np.int64), np.zeros(1, np.int64)]), spin_pool.MAX_CHUNKS + 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        job_arguments([np.zeros((4, 4), np.float32)[:, ::2]])


@pytest.mark.parametrize("alone", [False, True])
def test_a_script_runs_its_jobs_in_order_each_after_the_last(pool, alone):
    """A replayed script is the jobs run one after the other: each step reads what the one before wrote."""
    steps, width = 50, 4096
    rows = np.zeros((steps + 1, width), np.float32)
    rows[0] = np.arange(width)
    jobs = [spin_pool.Job(SHIFT, job_arguments([rows, step]), 8, (rows,)) for step in range(steps)]
    script = spin_pool.JobScript(jobs)
    for _ in range(3):  # a script replays as often as asked, on the same blocks
        rows[1:] = -1
        spin_pool.replay_on(script, None if alone else pool)
        np.testing.assert_array_equal(rows[steps], (np.arange(width) + steps) % width + steps)
    assert len(script) == steps


def test_a_script_runs_every_chunk_of_every_job_once(pool):
    counts = [np.zeros(chunks, np.int64) for chunks in (1, 2, 5)]
    seen = [np.zeros(1, np.int64) for _ in counts]
    script = spin_pool.JobScript(
        [spin_pool.Job(COUNT, job_arguments([c, s]), c.size, (c, s)) for c, s in zip(counts, seen)]
    )
    for _ in range(100):
        pool.replay(script)
    assert [c.tolist() for c in counts] == [[100], [100, 100], [100] * 5]
    assert [int(s[0]) for s in seen] == [1, 2, 5]


def test_back_to_back_jobs_never_run_a_chunk_of_the_next_job_twice(pool):
    """A worker late to a job must not claim, with that job's word, a chunk of the next one whose
    parameters the caller is writing: jobs of 2 then 7 chunks, back to back from compiled code."""
    counts = [np.zeros(2 if index % 2 == 0 else 7, np.int64) for index in range(200)]
    seen = [np.zeros(1, np.int64) for _ in counts]
    script = spin_pool.JobScript(
        [spin_pool.Job(COUNT, job_arguments([c, s]), c.size, (c, s)) for c, s in zip(counts, seen)]
    )
    for _ in range(50):
        pool.replay(script)
    assert all(c.tolist() == [50] * c.size for c in counts)


@pytest.mark.parametrize("from_back", [False, True])
def test_the_caller_claims_from_the_first_chunk_and_a_worker_from_the_last(from_back):
    """The claiming loop alone on one thread: as the caller it runs a job's chunks first to last, as a
    worker last to first, so that two threads keep to their ends of every job (each writes the same part
    of an output, run after run)."""
    chunks = 6
    order, ran = np.full(chunks, -1, np.int64), np.zeros(1, np.int64)
    block = job_arguments([order, ran])
    state = np.zeros(spin_pool._STATE_SLOTS, np.int64)
    state[spin_pool._JOB], state[spin_pool._ARGS], state[spin_pool._CHUNKS] = ORDER, block.ctypes.data, chunks
    word = 5 << spin_pool._SEQUENCE_SHIFT
    state[spin_pool._WORD] = word
    spin_pool._work_on(state, word, from_back)
    expected = np.arange(chunks)[::-1] if from_back else np.arange(chunks)
    np.testing.assert_array_equal(order, expected)
    assert state[spin_pool._DONE] == chunks


def test_a_job_has_one_chunk_at_least():
    with pytest.raises(ValueError, match="1 to"):
        spin_pool.Job(COUNT, np.zeros(4, np.int64), 0)


def test_a_job_runs_alone_or_on_the_pool(pool):
    x = np.arange(1000, dtype=np.float32)
    for target in (None, pool):
        y = np.zeros_like(x)
        spin_pool.Job(SCALE, job_arguments([x, y]), 3, (x, y)).run(target)
        np.testing.assert_array_equal(y, 2 * x)


def test_close_stops_the_workers(pool):
    pool.run(SCALE, job_arguments([np.ones(8, np.float32), np.zeros(8, np.float32)]), 2)
    threads = list(pool._threads)
    pool.close()
    assert threads and not any(thread.is_alive() for thread in threads)


needs_cblas = pytest.mark.skipif(not jit_gemm.available(), reason="numpy's BLAS is not an OpenBLAS with CBLAS")


@needs_cblas
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("m", "k", "n", "trans_b"), [(1, 800, 500, True), (1, 33, 70, False), (7, 40, 90, True),
                                                     (16, 64, 33, False)])  # fmt: skip
def test_products_split_on_the_pool_match_numpy(pool, dtype, m, k, n, trans_b):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((n, k)).astype(dtype).T if trans_b else rng.standard_normal((k, n)).astype(dtype)
    out = np.full((m, n), np.nan, dtype)
    assert jit_gemm.split_product(a, b, out, 2, pool)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4)


@needs_cblas
def test_stacked_products_split_on_the_pool_match_numpy(pool):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((5, 6, 7)).astype(np.float32)
    b = rng.standard_normal((7, 9)).astype(np.float32)
    out = np.full((5, 6, 9), np.nan, np.float32)
    assert jit_gemm.split_stack(a, b, out, 2, pool)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
