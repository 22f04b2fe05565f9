"""InferenceSession: ONNX Runtime's surface, feed validation, thread safety."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.errors import DeviceUnavailableError, FeedError
from tests.helpers import add_relu_model, make_model


@pytest.fixture(scope="module")
def session():
    return hetflow.InferenceSession(add_relu_model())


def test_run_with_all_outputs_and_by_name(session):
    x = np.array([[-5.0, -1.0, 2.0], [0.5, -0.5, 1.0]], np.float32)
    expected = np.maximum(x + 1, 0)
    (all_outputs,) = session.run(None, {"x": x})
    (named,) = session.run(["y"], {"x": x})
    np.testing.assert_array_equal(all_outputs, expected)
    np.testing.assert_array_equal(named, expected)


def test_wrong_feed_name_says_what_was_expected(session):
    with pytest.raises(FeedError, match=r"\['z'\].*'x' \(tensor\(float\) \[N, 3\]\)"):
        session.run(None, {"z": np.zeros((1, 3), np.float32)})


def test_missing_feed(session):
    with pytest.raises(FeedError, match="missing input.*'x'"):
        session.run(None, {})


def test_wrong_dtype_says_what_was_expected(session):
    with pytest.raises(FeedError, match=r"tensor\(double\); expected tensor\(float\)"):
        session.run(None, {"x": np.zeros((1, 3), np.float64)})


@pytest.mark.parametrize("shape", [(1, 4), (3,), (1, 3, 1)])
def test_wrong_shape_says_what_was_expected(session, shape):
    with pytest.raises(FeedError, match=r"expected \[N, 3\]"):
        session.run(None, {"x": np.zeros(shape, np.float32)})


def test_inconsistent_symbolic_dimension_across_inputs():
    model = make_model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [("a", TensorProto.FLOAT, ["N", 2]), ("b", TensorProto.FLOAT, ["N", 2])],
        [("y", TensorProto.FLOAT, ["N", 2])],
    )
    session = hetflow.InferenceSession(model)
    with pytest.raises(FeedError, match="'N'"):
        session.run(None, {"a": np.zeros((2, 2), np.float32), "b": np.zeros((3, 2), np.float32)})


def test_feeds_are_checked_again_after_a_run_fed_alike():
    """A run fed like an earlier one skips the checks; any other feed is still checked."""
    session = hetflow.InferenceSession(add_relu_model())
    x = np.array([[-2.0, 0.0, 3.0]], np.float32)
    for _ in range(2):
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x + 1, 0))
    with pytest.raises(FeedError, match="expected tensor"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(FeedError, match=r"expected \[N, 3\]"):
        session.run(None, {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(FeedError, match="unknown input"):
        session.run(None, {"x": x, "z": x})
    (batch,) = session.run(None, {"x": np.ones((5, 3), np.float32)})
    np.testing.assert_array_equal(batch, np.full((5, 3), 2, np.float32))


def test_unknown_output_name(session):
    with pytest.raises(FeedError, match="unknown output"):
        session.run(["nope"], {"x": np.zeros((1, 3), np.float32)})


def test_unknown_device_is_refused():
    with pytest.raises(DeviceUnavailableError):
        hetflow.InferenceSession(add_relu_model(), device="tpu")


def test_unknown_option_is_refused():
    with pytest.raises(TypeError, match="frobnicate"):
        hetflow.InferenceSession(add_relu_model(), frobnicate=True)


def test_run_is_safe_from_several_threads(session):
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((batch, 3)).astype(np.float32) for batch in range(1, 17)]
    expected = [np.maximum(x + 1, 0) for x in feeds]
    failures: list[str] = []

    def worker(offset: int) -> None:
        for repeat in range(50):
            index = (offset + repeat) % len(feeds)
            (y,) = session.run(None, {"x": feeds[index]})
            if not np.array_equal(y, expected[index]):
                failures.append(f"thread {offset} run {repeat}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_a_deleted_session_frees_its_weights():
    import gc
    import weakref

    session = hetflow.InferenceSession(add_relu_model())
    session.run(None, {"x": np.ones((2, 3), np.float32)})
    weights = weakref.ref(next(iter(session.graph.initializers.values())))
    plan = weakref.ref(session.plan_for({"N": 2}))
    del session
    gc.collect()
    assert plan() is None and weights() is None


# -- later runs of one signature (``executor.SteadyRun``) ----------------------------------------------
def _two_outputs_model():  # noqa: ANN202
    """y = relu(x + 1) and z = x * 2, x: float32 [N, 3]."""
    return make_model(
        [
            helper.make_node("Add", ["x", "b"], ["t"], name="add"),
            helper.make_node("Relu", ["t"], ["y"], name="relu"),
            helper.make_node("Mul", ["x", "two"], ["z"], name="mul"),
        ],
        [("x", TensorProto.FLOAT, ["N", 3])],
        [("y", TensorProto.FLOAT, ["N", 3]), ("z", TensorProto.FLOAT, ["N", 3])],
        {"b": np.ones(3, np.float32), "two": np.full(3, 2, np.float32)},
    )


def _count_executes(monkeypatch) -> list[int]:  # noqa: ANN001
    """Calls to ``execute`` (the whole path) from the session module, recorded."""
    from hetflow.runtime import session as session_module

    calls: list[int] = []
    original = session_module.execute

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(session_module, "execute", counted)
    return calls


def test_later_runs_of_one_signature_skip_the_whole_path_and_compute_each_feed(monkeypatch):
    session = hetflow.InferenceSession(_two_outputs_model())
    calls = _count_executes(monkeypatch)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        y, z = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.maximum(x + 1, 0))
        np.testing.assert_array_equal(z, x * 2)
    assert len(calls) == 1  # the first run only
    for names, want in ((["z"], ["z"]), (["z", "y"], ["z", "y"]), (("y",), ["y"])):
        x = rng.standard_normal((2, 3)).astype(np.float32)
        expected = {"y": np.maximum(x + 1, 0), "z": x * 2}
        for _ in range(2):  # its first run takes the whole path, the second the steady one
            results = session.run(names, {"x": x})
            assert len(results) == len(want)
            for name, result in zip(want, results):
                np.testing.assert_array_equal(result, expected[name])
    assert len(calls) == 4


def test_a_steady_session_still_checks_other_feeds_and_observes(monkeypatch):
    session = hetflow.InferenceSession(_two_outputs_model())
    x = np.ones((1, 3), np.float32)
    for _ in range(3):
        session.run(None, {"x": x})
    with pytest.raises(FeedError, match="expected tensor"):
        session.run(None, {"x": x.astype(np.float64)})
    with pytest.raises(FeedError, match="unknown output"):
        session.run(["nope"], {"x": x})
    with pytest.raises(FeedError, match="missing"):
        session.run(None, {})
    seen: list[str] = []
    session.run(None, {"x": x}, observer=lambda step, seconds: seen.append(step.node.name))
    assert sorted(seen) == ["add", "mul"]  # the Relu fused into the Add


def test_a_parallel_session_with_branches_runs_whole_every_time(monkeypatch):
    session = hetflow.InferenceSession(_two_outputs_model(), execution_mode="parallel", threads=2)
    calls = _count_executes(monkeypatch)
    x = np.full((2, 3), -3, np.float32)
    for _ in range(3):
        y, z = session.run(None, {"x": x})
        np.testing.assert_array_equal(y, np.zeros((2, 3), np.float32))
        np.testing.assert_array_equal(z, x * 2)
    assert len(calls) == 3
