"""Captured runs (``hetflow.runtime.replay``): a replayed run computes what a plain run computes, on
every new feed, from any thread; it owns no memory it hands back; and what cannot be captured is still
called, its values guarded where captured steps read them."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow import zoo
from hetflow.devices.cpu import spin_pool
from hetflow.devices.cpu.spin_pool import Job, float32_1d, job_arguments
from hetflow.graph import Node
from hetflow.runtime import executor, replay
from hetflow.runtime.replay import Replay, StepFailed
from tests.helpers import make_model, prelu_softmax_model


def _session(name: str, threads: int = 2) -> hetflow.InferenceSession:
    return hetflow.InferenceSession(str(zoo.model_path(name)), threads=threads)


def _feeds(session: hetflow.InferenceSession, batch: int, count: int) -> list[dict[str, np.ndarray]]:
    value = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in value.shape]
    rng = np.random.default_rng(batch)
    return [{value.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(count)]


def _plain(session: hetflow.InferenceSession, feeds: list[dict[str, np.ndarray]], monkeypatch) -> list[np.ndarray]:  # noqa: ANN001
    with monkeypatch.context() as patch:
        patch.setattr(executor, "REPLAYS", False)
        return [session.run(None, feed)[0] for feed in feeds]


def _replays(session: hetflow.InferenceSession) -> list[Replay | None]:
    """Every replay the session's arenas hold (None where an arrangement captured nothing)."""
    found = []
    for plan in session._accepted.values():
        for program in plan.programs.values():
            for arena in program.sequential_arenas():
                found += list(arena.replays.values())
    return found


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("name", ["lenet", "cifar10-quick", "mentee"])
def test_replayed_runs_equal_plain_runs_on_every_feed(name, batch, threads, monkeypatch):
    session = _session(name, threads)
    feeds = _feeds(session, batch, 3)
    expected = _plain(session, feeds, monkeypatch)
    for _ in range(2):  # the first pass captures, the second replays
        for feed, want in zip(feeds, expected):
            np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-5, atol=1e-6)
    replays = [found for found in _replays(session) if found is not None]
    assert replays and all(found.jobs > 0 for found in replays)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet", "mobilenetv2", "densenet121", "googlenet"])
def test_replayed_runs_of_large_networks_equal_plain_runs(name, batch, monkeypatch):
    """Pointwise, depthwise and Winograd Convs, Concats in place, BatchNormalizations and pools replayed,
    the rest (some im2col, LRN) called between the segments."""
    session = _session(name)
    feeds = _feeds(session, batch, 2)
    expected = _plain(session, feeds, monkeypatch)
    for _ in range(2):
        for feed, want in zip(feeds, expected):
            np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-4, atol=1e-6)
    (found,) = _replays(session)
    assert found is not None and found.jobs > found.called


@pytest.mark.parametrize(("name", "most_called"), [("mobilenetv2", 2), ("squeezenet", 2), ("densenet121", 1)])
def test_batch_1_replays_nearly_every_layer(name, most_called):
    """Which layers still run from Python at batch 1: the first Conv (im2col), the final pool."""
    session = _session(name)
    session.run(None, _feeds(session, 1, 1)[0])
    (found,) = _replays(session)
    assert found is not None and found.called <= most_called


def test_googlenets_convolutions_all_replay_at_batch_1():
    """Its 3x3 Convs (Winograd) replay as their transforms' and products' jobs: only the LRNs and the
    final pool are called. (At a batch, the branches' Ys are slices of their Concat's output that are not
    C-contiguous: their Winograd layers are called.)"""
    session = _session("googlenet")
    session.run(None, _feeds(session, 1, 1)[0])
    (found,) = _replays(session)
    ops = {node.name: node.op_type for node in session.graph.nodes}
    assert found is not None and {ops[name] for name in found.called_nodes} <= {"LRN", "AveragePool"}


def test_every_step_of_lenet_replays_from_compiled_code_at_batch_1():
    session = _session("lenet")
    feed = _feeds(session, 1, 1)[0]
    session.run(None, feed)
    (found,) = _replays(session)
    assert found is not None and found.called == 0
    assert found.jobs >= len(session.plan.steps) - 1  # Flatten is a view: no job


def test_a_stamped_replay_times_each_job_and_names_its_node(monkeypatch):
    """``spin_pool.replay_stamped`` (``benchmarks/replay_timeline.py``): one positive cycle count per job,
    the replay's results those of a plain run, and each job owned by a replayed node, in run order."""
    session = _session("lenet")
    feed = _feeds(session, 1, 1)[0]
    expected = _plain(session, [feed], monkeypatch)[0]
    session.run(None, feed)
    (found,) = _replays(session)
    assert found is not None
    owners = [owner for _, names in found.scripts for owner in names]
    assert len(owners) == found.jobs and set(owners) <= set(found.replayed_nodes)
    assert owners == sorted(owners, key=found.replayed_nodes.index)  # in run order
    rate = spin_pool.cycles_per_second(0.01)
    assert rate > 1e6
    for pool in (None, spin_pool.SpinPool(1)):
        for script, names in found.scripts:
            cycles = spin_pool.replay_stamped(script, pool)
            assert cycles.shape == (len(names),) and (cycles > 0).all()
            assert cycles.sum() / rate < 0.1  # LeNet's jobs take microseconds
        if pool is not None:
            pool.close()
    # The stamped replays ran the jobs on the arena's buffers: a run after them is still right.
    np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-5, atol=1e-6)


def test_the_session_reports_what_its_runs_replay():
    session = _session("lenet")
    assert session.replay_report() == {"replayed": [], "called": []}  # nothing captured before a run
    session.run(None, _feeds(session, 1, 1)[0])
    report = session.replay_report()
    assert report["replayed"] == [step.node.name for step in session.plan.steps] and report["called"] == []


def test_returned_outputs_survive_the_next_run():
    session = _session("lenet")
    first, second = _feeds(session, 1, 2)
    for _ in range(2):
        session.run(None, first)
    kept = session.run(None, first)[0]
    copy = kept.copy()
    session.run(None, second)
    np.testing.assert_array_equal(kept, copy)


def test_a_strided_feed_is_read_as_a_contiguous_one(monkeypatch):
    session = _session("lenet")
    wide = np.random.default_rng(0).standard_normal((1, 1, 28, 56)).astype(np.float32)
    strided = {session.get_inputs()[0].name: wide[..., ::2]}
    (expected,) = _plain(session, [{k: np.ascontiguousarray(v) for k, v in strided.items()}], monkeypatch)
    for _ in range(3):
        np.testing.assert_allclose(session.run(None, strided)[0], expected, rtol=1e-5, atol=1e-6)


def _feed_pointers(found: Replay) -> set[int]:
    """The addresses the replay's jobs now read its one feed at (each pointer less its offset)."""
    (feed,) = found._feeds
    return {int(address) for array, indices, offsets in feed.place.pointers for address in array[indices] - offsets}


@pytest.mark.parametrize("name", ["squeezenet", "lenet"])
def test_a_contiguous_feed_is_read_where_it_lies_and_left_as_it_was(name, monkeypatch):
    session = _session(name)
    feeds = _feeds(session, 1, 3)
    originals = [dict((k, v.copy()) for k, v in feed.items()) for feed in feeds]
    expected = _plain(session, feeds, monkeypatch)
    session.run(None, feeds[0])  # the capture: on the feed's copy
    (found,) = _replays(session)
    assert found is not None
    (buffer_address,) = _feed_pointers(found)
    for feed, want in zip(feeds, expected):
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-4, atol=1e-6)
        (array,) = feed.values()
        assert _feed_pointers(found) == {array.ctypes.data} != {buffer_address}
    for feed, original in zip(feeds, originals):  # read, never written
        np.testing.assert_array_equal(*feed.values(), *original.values())
    # A strided array is copied into the buffer, and the jobs read the buffer again.
    (name_, array), = feeds[1].items()
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), np.float32)
    wide[..., ::2] = array
    np.testing.assert_allclose(session.run(None, {name_: wide[..., ::2]})[0], expected[1], rtol=1e-4, atol=1e-6)
    assert _feed_pointers(found) == {buffer_address}
    # What a compiled package saves: the jobs pointed back at the buffer.
    session.run(None, feeds[2])
    found.rest()
    assert [slot_buffer[1].ctypes.data for slot_buffer in found.feeds] == [buffer_address]
    assert _feed_pointers(found) == {buffer_address}


def _direct(session: hetflow.InferenceSession) -> replay.DirectReplay | None:
    (steady,) = session._steady.values()
    return steady._direct


def test_a_steady_run_replays_directly_and_hands_back_fresh_outputs(monkeypatch):
    """After the capture, a session's steady runs of a network replayed whole from compiled code skip
    the executor (``DirectReplay``): the same results as a plain run, a new array every time, and a feed
    changed in place read as it now is (the same array object comes back)."""
    from hetflow.devices.cpu.kernels import jit_gemm

    if not jit_gemm.available():
        pytest.skip("no spinning runs without jit_gemm (numba's CBLAS binding)")
    session = _session("lenet")
    feeds = _feeds(session, 1, 3)
    expected = _plain(session, feeds, monkeypatch)
    session.run(None, feeds[0])
    session.run(None, feeds[0])
    direct = _direct(session)
    assert direct is not None and direct.pool is not None
    assert [found.whole_script for _, found in session.captured_runs()] == [direct.script]
    seen = []
    for feed, want in zip(feeds, expected):
        (y,) = session.run(None, feed)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
        seen.append(y)
    assert not any(np.shares_memory(a, b) for a, b in zip(seen, seen[1:]))
    seen[-1][:] = np.nan  # the caller's copy: the next run does not see it
    np.testing.assert_allclose(session.run(None, feeds[2])[0], expected[2], rtol=1e-5, atol=1e-6)
    (array,) = feeds[0].values()
    array[:] = next(iter(feeds[1].values()))  # the same array object, new contents
    np.testing.assert_allclose(session.run(None, feeds[0])[0], expected[1], rtol=1e-5, atol=1e-6)


def test_a_run_that_calls_steps_from_python_takes_no_direct_replay():
    """A Mul between two Convs has no compiled job: the replay calls it, so no direct replay is made,
    and the runs stay right."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((4, c, 3, 3)).astype(np.float32) for c in (2, 4))
    model = make_model(
        [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("Mul", ["a", "a"], ["b"], name="square"),
         helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])],
        [("x", TensorProto.FLOAT, [1, 2, 8, 8])], [("y", TensorProto.FLOAT, [1, 4, 8, 8])], {"w1": w1, "w2": w2},
    )  # fmt: skip
    session = hetflow.InferenceSession(model, threads=2)
    feed = {"x": rng.standard_normal((1, 2, 8, 8)).astype(np.float32)}
    expected = hetflow.InferenceSession(model, threads=1).run(None, feed)[0]
    for _ in range(4):
        np.testing.assert_allclose(session.run(None, feed)[0], expected, rtol=1e-5, atol=1e-5)
    (found,) = [found for found in _replays(session) if found is not None]
    assert found.calls_blas and _direct(session) is None and found.whole_script is None


def _idle_job(args, chunk, chunks):  # noqa: ANN001, ANN202
    args[chunk] += 1


def test_a_replay_knows_whether_its_jobs_call_blas():
    """``jit_gemm``'s CBLAS parts run inside jobs (``Job.calls_blas``): a run replaying one holds BLAS at
    its arrangement's count, where one whose jobs call none leaves it alone. A float32 one-row product
    (a classifier at batch 1) runs compiled loops; a float64 one and any GEMM call CBLAS."""
    from hetflow.devices.cpu.kernels import jit_gemm

    address = spin_pool.job(_idle_job)
    block, out = np.zeros(4, np.int64), np.zeros(3, np.float32)
    for blas in (False, True):
        segment = replay._Segment(spin_pool.JobScript([Job(address, block, 2, (block,), blas)]), ((5, out),), (),
                                  ("n",))  # fmt: skip
        assert Replay((), (segment,), frozenset({5}), ("n",)).calls_blas is blas
    if not jit_gemm.available():
        return  # no CBLAS binding: no product jobs
    for dtype, rows, blas in ((np.float32, 1, False), (np.float64, 1, True), (np.float32, 8, True)):
        a, b = np.ones((rows, 64), dtype), np.ones((64, 32), dtype)
        made = jit_gemm.product_job(a, b, np.zeros((rows, 32), dtype), 2)
        assert made is not None and made.calls_blas is blas


def test_a_direct_replay_holds_blas_where_its_jobs_call_it_and_the_arrangement_holds_it(monkeypatch):
    """LeNet's fully connected layers split into CBLAS parts: a direct replay of them under an arrangement
    that holds BLAS at one thread (a large network's) sets BLAS to one around the call and back."""
    from hetflow.devices.cpu.kernels import jit_gemm
    from hetflow.devices.cpu.threads import BLAS

    if not jit_gemm.available():
        pytest.skip("no spinning runs without jit_gemm (numba's CBLAS binding)")
    session = _session("lenet")
    feed = _feeds(session, 1, 1)[0]
    (expected,) = _plain(session, [feed], monkeypatch)
    for _ in range(3):
        session.run(None, feed)
    (found,) = _replays(session)
    (steady,) = session._steady.values()
    assert not steady.arrangement.hold_blas and _direct(session).blas_threads is None  # small: BLAS as it is
    program = steady.program
    held = replay.DirectReplay.of(found, _direct(session).pool, program.slots, program.output_slots, 1)
    assert held is not None and held.blas_threads == (1 if found.calls_blas else None)
    counts: list[int] = []
    real_set = BLAS.set
    monkeypatch.setattr(BLAS, "set", lambda count: (counts.append(count), real_set(count)))
    before = BLAS.get()
    np.testing.assert_allclose(held.run(feed)[0], expected, rtol=1e-5, atol=1e-6)
    assert BLAS.get() == before and counts == ([1, before] if found.calls_blas and before != 1 else [])


def test_a_feed_taken_in_place_is_known_again_by_identity():
    from hetflow_lite.feeds import InPlaceFeed

    buffer = np.zeros(8, np.float32)
    holder = np.array([buffer.ctypes.data + 4], np.int64)  # a job's pointer to the buffer's second float
    feed = InPlaceFeed(buffer, [(holder, np.array([0]), np.array([4]))])
    array = np.arange(8, dtype=np.float32)
    assert feed.take(array) is array and holder[0] == array.ctypes.data + 4
    holder[0] = 0  # a second take of the same array rewrites nothing...
    assert feed.take(array) is array and holder[0] == 0
    other = np.arange(8, dtype=np.float32)
    assert feed.take(other) is other and holder[0] == other.ctypes.data + 4  # ...a new array re-points
    strided = np.arange(16, dtype=np.float32)[::2]
    assert feed.take(strided) is buffer and holder[0] == buffer.ctypes.data + 4  # copied in
    np.testing.assert_array_equal(buffer, strided)
    assert feed.take(other) is other and holder[0] == other.ctypes.data + 4  # known no more: re-pointed


def test_runs_from_two_threads_at_once_each_get_their_own_results(monkeypatch):
    """Concurrent runs take separate arenas (each with its replay); the one that finds the spinning pool
    busy replays on its own thread."""
    session = _session("cifar10-quick")
    feeds = _feeds(session, 1, 4)
    expected = _plain(session, feeds, monkeypatch)
    failures: list[int] = []

    def worker(offset: int) -> None:
        for round_ in range(40):
            index = (round_ + offset) % len(feeds)
            got = session.run(None, feeds[index])[0]
            if not np.allclose(got, expected[index], rtol=1e-5, atol=1e-6):
                failures.append(index)

    workers = [threading.Thread(target=worker, args=(offset,)) for offset in range(2)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert failures == []


def test_a_memory_budgeted_session_never_replays():
    session = hetflow.InferenceSession(str(zoo.model_path("lenet")), threads=2, memory_budget="64MB")
    feed = _feeds(session, 1, 1)[0]
    for _ in range(2):
        session.run(None, feed)
    assert _replays(session) == []


def test_a_value_a_called_step_makes_afresh_is_copied_where_a_captured_step_reads_it(monkeypatch):
    """PRelu (no capture) returns a new array every run; the Softmax after it captures and reads the
    array PRelu returned at capture, so each replay copies the new one in."""
    session = hetflow.InferenceSession(prelu_softmax_model(), threads=1)  # one thread: runs replay (no spinning pool here)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((2, 3, 8)).astype(np.float32)} for _ in range(3)]
    for _ in range(2):
        for feed in feeds:
            t = np.where(feed["x"] > 0, feed["x"], 0.25 * feed["x"])
            e = np.exp(t - t.max(-1, keepdims=True))
            np.testing.assert_allclose(session.run(None, feed)[0], e / e.sum(-1, keepdims=True), rtol=1e-5)
    (found,) = _replays(session)
    assert found is not None and found.called == 1 and found.jobs == 1
    assert session.replay_report() == {"replayed": ["softmax"], "called": ["prelu"]}


def test_a_float64_network_replays_what_it_can_and_matches_numpy():
    """float64: a product without bias or activation captures (BLAS's GEMV in a job); the Softmax, its
    float32-only job aside, is called between (the Gemm with a bias would be called too)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((30, 20))
    model = make_model(
        [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc", transB=1),
         helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1)],  # fmt: skip
        [("x", TensorProto.DOUBLE, [1, 20])],
        [("y", TensorProto.DOUBLE, [1, 30])],
        {"w": w},
    )
    session = hetflow.InferenceSession(model, threads=1)
    for _ in range(3):
        x = rng.standard_normal((1, 20))
        h = x @ w.T
        e = np.exp(h - h.max())
        np.testing.assert_allclose(session.run(None, {"x": x})[0], e / e.sum(), rtol=1e-12)
    (found,) = _replays(session)
    assert found is not None and found.jobs == 1 and found.called == 1


# -- the capture itself, on steps made up for the test ------------------------------------------------
def _double(args, chunk, chunks):  # noqa: ANN001, ANN202
    """y = 2 x over the chunk's range (a job for the tests)."""
    x, y = float32_1d(args, 0), float32_1d(args, 2)
    for i in range(x.shape[0] * chunk // chunks, x.shape[0] * (chunk + 1) // chunks):
        y[i] = 2 * x[i]


DOUBLE = spin_pool.job(_double)


def _doubling_step(name: str, source: int, target: int, y: np.ndarray) -> replay.HotStep:
    """A step ``y = 2 * env[source]`` that captures as the DOUBLE job; called, it records that it was."""

    def call(inputs):  # noqa: ANN001, ANN202
        calls.append(name)
        np.multiply(inputs[0], 2, out=y)
        return [y]

    def capture(inputs):  # noqa: ANN001, ANN202
        x = inputs[0]
        return [y], [Job(DOUBLE, job_arguments([x, y]), 2, (x, y))]

    call.capture = capture  # type: ignore[attr-defined]
    return call, Node("Relu", name, ["a"], ["b"]), (source,), (target,), ()


calls: list[str] = []


def test_capture_runs_the_steps_and_a_replay_repeats_them_without_calling_them():
    calls.clear()
    middle, last = np.zeros(4, np.float32), np.zeros(4, np.float32)
    steps = [_doubling_step("first", 1, 2, middle), _doubling_step("second", 2, 3, last)]
    env = [None, np.arange(4, dtype=np.float32), None, None]
    found = replay.capture(steps, env, feeds=(1,), stable={0}, pool=None)
    assert found is not None and found.jobs == 2 and found.called == 0
    np.testing.assert_array_equal(env[3], 4 * np.arange(4))
    env = [None, np.full(4, 5, np.float32), None, None]
    found.run(env, None)
    np.testing.assert_array_equal(env[3], np.full(4, 20))
    assert calls == []  # captured steps are never called


def test_a_step_that_fails_in_a_capture_names_its_node():
    def failing(inputs):  # noqa: ANN001, ANN202
        raise RuntimeError("broken kernel")

    node = Node("Relu", "bad", ["a"], ["b"])
    env = [None, np.ones(4, np.float32), None]
    with pytest.raises(StepFailed) as raised:
        replay.capture([(failing, node, (1,), (2,), ())], env, feeds=(1,), stable={0}, pool=None)
    assert raised.value.node is node and isinstance(raised.value.__cause__, RuntimeError)


def test_a_kernel_error_in_a_replayed_run_names_the_node():
    """The executor turns a failing step of a captured run into its usual KernelError."""
    model = make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["t"], name="prelu"),
         helper.make_node("Softmax", ["t"], ["y"], name="softmax", axis=-1)],  # fmt: skip
        [("x", TensorProto.FLOAT, [2, 8])],
        [("y", TensorProto.FLOAT, [2, 8])],
        {"slope": np.full((8,), 0.25, np.float32)},
    )
    session = hetflow.InferenceSession(model, threads=1)  # one thread: runs replay (no spinning pool here)
    feed = {"x": np.ones((2, 8), np.float32)}
    session.run(None, feed)

    def broken(values):  # noqa: ANN001, ANN202
        raise FloatingPointError("broken")

    (found,) = _replays(session)
    entry = next(e for e in found.entries if isinstance(e, replay._Called))
    entry.step = (broken, *entry.step[1:])  # the called PRelu step now fails
    with pytest.raises(executor.KernelError, match="'prelu'.*broken"):
        session.run(None, feed)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_split_is_replayed_as_copies_of_its_rows(batch):
    """Split captures as one compiled copy per piece (``jit_copy``): at batch 1 each piece is one run of
    X's memory, at a batch one run per image."""
    model = make_model(
        [helper.make_node("Split", ["x", "sizes"], ["a", "b"], name="split", axis=1),
         helper.make_node("Relu", ["a"], ["ra"], name="relu_a"),
         helper.make_node("Sigmoid", ["b"], ["sb"], name="sigmoid_b"),
         helper.make_node("Concat", ["sb", "ra"], ["y"], name="concat", axis=1)],  # fmt: skip
        [("x", TensorProto.FLOAT, ["N", 6, 4, 4])],
        [("y", TensorProto.FLOAT, ["N", 6, 4, 4])],
        {"sizes": np.array([2, 4], np.int64)},
    )
    session = hetflow.InferenceSession(model, threads=1)
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((batch, 6, 4, 4)).astype(np.float32)
        expected = np.concatenate([1 / (1 + np.exp(-x[:, 2:])), np.maximum(x[:, :2], 0)], axis=1)
        np.testing.assert_allclose(session.run(None, {"x": x})[0], expected, rtol=1e-6, atol=1e-7)
    assert "split" in session.replay_report()["replayed"]


def test_a_batchs_strided_layers_on_small_maps_replay_their_blas_products(monkeypatch):
    """ResNet-50's stride-2 layers onto 7x7 maps multiply a chunk of images as one CBLAS product
    (``conv._WholeChunkCall``): captured as columns, product and a gathering pass (bias, the folded
    residual of its 1x1 projection, Relu), they replay to the outputs of a plain run."""
    session = _session("resnet50")
    feeds = _feeds(session, 2, 2)
    replayed = [session.run(None, feed)[0] for feed in feeds for _ in range(2)][1::2]
    report = session.replay_report()
    assert {"n143", "n148"} <= set(report["replayed"]) and report["called"] == []
    for got, want in zip(replayed, _plain(session, feeds, monkeypatch)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_a_batchs_per_image_blas_products_replay(monkeypatch):
    """ZFNet's 5x5 stride-2 layer at a batch multiplies each image's columns on BLAS (per image, its
    columns too large for a chunk of two): captured as columns, one product per image split in column
    blocks, and the finishing pass in place, it replays to the outputs of a plain run."""
    session = _session("zfnet512")
    feeds = _feeds(session, 2, 2)
    replayed = [session.run(None, feed)[0] for feed in feeds for _ in range(2)][1::2]
    report = session.replay_report()
    assert "n4" in report["replayed"] and report["called"] == []
    for got, want in zip(replayed, _plain(session, feeds, monkeypatch)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
