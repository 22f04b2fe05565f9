"""The session's thread count is the BLAS pool size during its runs; parallel_for shares work safely."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from threadpoolctl import threadpool_info

import hetflow
from hetflow.devices.cpu import threads
from hetflow.devices.cpu.threads import BLAS, available_cores, intra_op_threads, parallel_for
from tests.helpers import add_relu_model, make_model


def _blas_threads_now() -> int:
    """numpy's BLAS pool size (the one hetflow's kernels run on), read through threadpoolctl itself, not
    through hetflow's cached controller. NOTE: by filepath: scipy's own OpenBLAS, loaded by other tests
    (scikit-learn's digits), can come first in threadpool_info."""
    return next(
        info["num_threads"]
        for info in threadpool_info()
        if info["user_api"] == "blas" and "numpy" in info["filepath"]
    )


@pytest.fixture
def blas_at_two():
    previous = BLAS.get()
    BLAS.set(2)
    yield
    BLAS.set(previous)


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("batch", [1, 2])
def test_threads_set_the_blas_pool_during_run_and_restore_it(blas_at_two, threads, mode, batch, monkeypatch):
    from hetflow.runtime import executor

    monkeypatch.setattr(executor, "OWN_THREADS_MIN_CONV_MACS", 0)  # no Conv: the threshold does not apply
    session = hetflow.InferenceSession(add_relu_model(), threads=threads, execution_mode=mode)
    seen: list[tuple[int, int]] = []
    session.run(None, {"x": np.ones((batch, 3), np.float32)},
                observer=lambda step, seconds: seen.append((_blas_threads_now(), intra_op_threads())))
    # A network without convolutions keeps OpenBLAS's threads at the session's count.
    assert seen == [(threads, threads)] * len(session.plan.steps)
    assert _blas_threads_now() == 2


def _conv_model() -> onnx.ModelProto:
    """y = relu(conv(x, w)) with x: float32 [N, 2, 6, 6], w: [3, 2, 3, 3]."""
    w = np.random.default_rng(0).standard_normal((3, 2, 3, 3)).astype(np.float32)
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["t"], name="conv"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
        [("x", TensorProto.FLOAT, ["N", 2, 6, 6])],
        [("y", TensorProto.FLOAT, ["N", 3, 4, 4])],
        {"w": w},
    )


@pytest.mark.parametrize("numba_pool", [False, True])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_convolutional_network_runs_on_own_threads_in_numbas_pool_when_asked(
    blas_at_two, batch, numba_pool, monkeypatch
):
    from hetflow.devices.cpu.kernels import jit_gemm
    from hetflow.runtime import executor

    monkeypatch.setattr(executor, "NUMBA_POOL", numba_pool)
    session = hetflow.InferenceSession(_conv_model(), threads=3)
    seen: list[tuple[int, int, bool]] = []
    session.run(None, {"x": np.ones((batch, 2, 6, 6), np.float32)},
                observer=lambda step, seconds: seen.append(
                    (_blas_threads_now(), intra_op_threads(), threads._numba_pool)))
    # In numba's pool: BLAS at one thread, hetflow splitting over the session's three. Otherwise this
    # tiny network spins, one example or a batch, and keeps BLAS's threads; without a spinning pool a
    # batch splits on hetflow's threads (BLAS at one), as its one Conv runs the direct kernel.
    pooled = numba_pool and jit_gemm.available()
    own = batch > 1 and not jit_gemm.available()
    assert set(seen) == ({(1, 3, True)} if pooled else {(1, 3, False)} if own else {(3, 3, False)})
    assert _blas_threads_now() == 2 and not threads._numba_pool


@pytest.mark.parametrize("batch", [1, 2])
def test_a_small_convolutional_network_runs_on_spinning_threads(blas_at_two, batch):
    from hetflow.devices.cpu.kernels import jit_gemm

    session = hetflow.InferenceSession(_conv_model(), threads=2)
    seen: list[tuple[int, bool]] = []
    (y,) = session.run(None, {"x": np.ones((batch, 2, 6, 6), np.float32)},
                       observer=lambda step, seconds: seen.append((_blas_threads_now(), threads.spinning() is not None)))
    # One example spins (BLAS keeps its count), and so does a batch of a network this small (without a
    # spinning pool, its direct Conv holds BLAS at one thread and splits on the Python pool); nothing
    # spins once the run is over.
    spins = jit_gemm.available()
    assert set(seen) == ({(2, spins)} if spins or batch == 1 else {(1, False)})
    assert threads.spinning() is None
    (alone,) = hetflow.InferenceSession(_conv_model(), threads=1).run(None, {"x": np.ones((batch, 2, 6, 6), np.float32)})
    np.testing.assert_allclose(y, alone, rtol=1e-6)


def test_a_spinning_run_uses_at_most_spin_max_threads(blas_at_two, monkeypatch):
    """On a many-core machine every core spinning left OpenBLAS's own workers (each part of a product is
    a CBLAS call) waiting for the scheduler's tick: a spinning run caps its threads, BLAS's too."""
    from hetflow.devices.cpu.kernels import jit_gemm
    from hetflow.runtime import executor

    if not jit_gemm.available():
        pytest.skip("no spinning runs without jit_gemm (numba's CBLAS binding)")
    monkeypatch.setattr(executor, "SPIN_MAX_THREADS", 3)
    session = hetflow.InferenceSession(_conv_model(), threads=6)
    seen: list[tuple[int, int]] = []

    def observe(step, seconds):
        pool = threads.spinning()
        seen.append((_blas_threads_now(), pool.workers if pool is not None else -1))

    session.run(None, {"x": np.ones((1, 2, 6, 6), np.float32)}, observer=observe)
    assert set(seen) == {(3, 2)}  # three threads: the caller and two spinning workers


def test_a_batch_of_a_small_network_keeps_blas_threads(blas_at_two):
    session = hetflow.InferenceSession(add_relu_model(), threads=3)
    seen: list[tuple[int, int]] = []
    session.run(None, {"x": np.ones((4, 3), np.float32)},
                observer=lambda step, seconds: seen.append((_blas_threads_now(), intra_op_threads())))
    assert set(seen) == {(3, 3)}


def test_default_is_every_available_core(blas_at_two, monkeypatch):
    from hetflow.runtime import executor

    monkeypatch.setattr(executor, "OWN_THREADS_MIN_CONV_MACS", 0)
    session = hetflow.InferenceSession(add_relu_model())
    seen: list[int] = []
    session.run(None, {"x": np.ones((1, 3), np.float32)}, observer=lambda step, seconds: seen.append(BLAS.get()))
    assert set(seen) == {available_cores()}
    seen.clear()
    session.run(None, {"x": np.ones((2, 3), np.float32)}, observer=lambda step, seconds: seen.append(intra_op_threads()))
    assert set(seen) == {available_cores()}


@pytest.mark.parametrize("threads", [0, -2, 1.5, "2", True])
def test_bad_thread_counts_are_rejected(threads):
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        hetflow.InferenceSession(add_relu_model(), threads=threads)


def test_bad_execution_mode_is_rejected():
    with pytest.raises(ValueError, match="execution_mode must be one of"):
        hetflow.InferenceSession(add_relu_model(), execution_mode="async")


def test_hold_is_a_no_op_when_the_count_already_matches(blas_at_two):
    assert BLAS.hold(2) is None
    previous = BLAS.hold(1)
    assert previous == 2 and BLAS.get() == 1
    BLAS.restore(previous)
    assert BLAS.get() == 2


def test_a_deferred_hold_sets_blas_only_when_asked_and_restores_it(blas_at_two):
    with threads.blas_threads(1, deferred=True):
        assert BLAS.get() == 2 and intra_op_threads() == 1
        threads.hold_deferred_blas()
        assert BLAS.get() == 1
        threads.hold_deferred_blas()  # once only
        assert BLAS.get() == 1
    assert BLAS.get() == 2
    with threads.blas_threads(1, deferred=True):
        pass  # never asked: BLAS never touched
    assert BLAS.get() == 2
    threads.hold_deferred_blas()  # outside any hold: nothing to do
    assert BLAS.get() == 2


def test_a_replayed_run_leaves_blas_alone_where_a_called_run_holds_it(blas_at_two, monkeypatch):
    """A spinning run of a large network holds BLAS at one thread (``SPIN_BLAS_MAX_CONV_MACS``), but a
    replay that calls no step from Python calls no BLAS: setting OpenBLAS's count and back there only
    cost time (~40 us a MobileNet v2 run)."""
    from hetflow.devices.cpu.kernels import jit_gemm
    from hetflow.runtime import executor

    if not jit_gemm.available():
        pytest.skip("no spinning runs without jit_gemm (numba's CBLAS binding)")
    monkeypatch.setattr(executor, "SPIN_BLAS_MAX_CONV_MACS", 0)
    counts: list[int] = []
    real_set = BLAS.set
    monkeypatch.setattr(BLAS, "set", lambda count: (counts.append(count), real_set(count)))
    session = hetflow.InferenceSession(_conv_model(), threads=2)
    feed = {"x": np.ones((1, 2, 6, 6), np.float32)}
    (first,) = session.run(None, feed)  # the capture calls every step: BLAS held at one, then restored
    assert counts == [1, 2]
    counts.clear()
    for _ in range(3):
        (again,) = session.run(None, feed)
    assert counts == [] and BLAS.get() == 2
    np.testing.assert_array_equal(again, first)
    seen: list[int] = []
    session.run(None, feed, observer=lambda step, seconds: seen.append(_blas_threads_now()))
    assert set(seen) == {1} and BLAS.get() == 2  # steps called one by one: held


def test_parallel_for_runs_every_item_once():
    seen: list[int] = []
    lock = threading.Lock()

    def body(index: int) -> None:
        with lock:
            seen.append(index)

    parallel_for(body, 50, threads=2)
    assert sorted(seen) == list(range(50))


def test_parallel_for_reraises_the_first_error():
    def body(index: int) -> None:
        if index == 7:
            raise RuntimeError("item 7 broke")

    with pytest.raises(RuntimeError, match="item 7 broke"):
        parallel_for(body, 20, threads=2)


def test_nested_parallel_for_from_pool_threads_does_not_deadlock():
    totals = np.zeros(8)

    def outer(index: int) -> None:
        def inner(j: int) -> None:
            totals[index] += 0  # touch
        parallel_for(inner, 4, threads=2)
        totals[index] = index

    parallel_for(outer, 8, threads=4)
    np.testing.assert_array_equal(totals, np.arange(8))


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((6, 40), (3, 40, 900)),  # pointwise: W @ X[n] per image
     ((5, 6, 40), (5, 40, 900)),  # Winograd: U[e] @ V[e] per tile element
     ((2, 3, 40), (3, 2, 40, 900)),  # grouped: W[g] @ X[n, g] per image
     ((16, 300), (300, 120))],  # a single GEMM (an FC layer): split by columns
    ids=["stacked-x", "stacked-both", "grouped", "columns"],
)  # fmt: skip
def test_split_matmul_equals_one_matmul(a_shape, b_shape, monkeypatch):
    from hetflow.devices.cpu import threads

    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    expected = np.matmul(a, b)
    monkeypatch.setattr(threads, "MIN_MACS_PER_SPLIT", 1)
    with threads.own_threads(2):
        assert intra_op_threads() == 2 and _blas_threads_now() == 1
        out = np.full(expected.shape, np.nan)
        got = threads.split_matmul(a, b, out=out)
    assert got is out
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_a_batch_on_two_threads_equals_one_thread():
    session_one = hetflow.InferenceSession("zoo:squeezenet", threads=1)
    session_two = hetflow.InferenceSession("zoo:squeezenet", threads=2)
    x = np.random.default_rng(6).standard_normal((3, 3, 224, 224)).astype(np.float32)
    name = session_one.get_inputs()[0].name
    [one], [two] = session_one.run(None, {name: x}), session_two.run(None, {name: x})
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


def test_intra_op_threads_reads_the_held_count_without_asking_blas(blas_at_two, monkeypatch):
    with threads.blas_threads(3):
        with monkeypatch.context() as patched:
            patched.setattr(BLAS, "get", lambda: pytest.fail("intra_op_threads queried the BLAS library"))
            assert intra_op_threads() == 3
        with threads.blas_threads(1):
            assert intra_op_threads() == 1
        assert intra_op_threads() == 3
    assert getattr(threads._held, "count", None) is None
    assert intra_op_threads() == 2


def test_plane_ranges_go_to_the_python_pool_beside_blas_threads_only_when_large(blas_at_two):
    """A run that leaves BLAS its threads keeps a mid-sized per-plane loop on the calling thread
    (OpenBLAS's spinning workers would hold the core it hands a range to), and so does a run on spinning
    threads; a run on its own Python-pool threads splits it."""
    calls: list[tuple[int, int]] = []
    planes, per_plane = 100, 1000  # 100 000 output elements

    def body(first: int, last: int) -> None:
        calls.append((first, last))

    with threads.blas_threads(2):
        threads.parallel_planes(body, planes, per_plane)
        assert calls == [(0, planes)]
        assert threads.split_ranges(planes, per_plane) == 1
        calls.clear()
        threads.parallel_planes(body, planes, threads.MIN_ELEMENTS_BESIDE_BLAS_THREADS)
        assert sorted(calls) == [(0, 50), (50, 100)]
    calls.clear()
    with threads.own_threads(2):
        threads.parallel_planes(body, planes, per_plane)
        assert sorted(calls) == [(0, 50), (50, 100)]
        assert threads.split_ranges(planes, per_plane) == 2
    calls.clear()
    with threads.own_threads(2, spin=True):  # the Python pool's thread would wait beside a spinning worker
        threads.parallel_planes(body, planes, per_plane)
        assert calls == [(0, planes)]
        assert threads.split_ranges(planes, per_plane) == 1


@pytest.mark.parametrize(("planes", "outputs", "threads", "shares"), [
    (96, 56 * 56, 2, 4),  # two shares a thread
    (3, 56 * 56, 2, 3),  # no more shares than planes
    (40, 100, 2, 1),  # 4,000 outputs: one share's worth, run on the caller
    (96, 56 * 56, 1, 1),  # one thread
])  # fmt: skip
def test_spin_plane_shares(planes, outputs, threads, shares):
    from hetflow.devices.cpu.threads import spin_plane_shares

    assert spin_plane_shares(planes, outputs, threads) == shares
