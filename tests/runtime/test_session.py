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
