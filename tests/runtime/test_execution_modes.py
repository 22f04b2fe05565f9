"""Sequential and parallel execution: same outputs, values released after their last reader, errors name
the node, concurrent runs stay correct."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow import zoo
from hetflow.runtime.executor import KernelError, compiled
from tests.helpers import make_model

FLOAT = TensorProto.FLOAT


def branching_model():
    """x -> four branches of different lengths -> concat, plus an intermediate output and an unread one."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a1"], name="a1"),
        helper.make_node("Mul", ["a1", "w"], ["a2"], name="a2"),
        helper.make_node("Sigmoid", ["x"], ["b1"], name="b1"),
        helper.make_node("Tanh", ["x"], ["c1"], name="c1"),
        helper.make_node("LeakyRelu", ["c1"], ["c2"], name="c2", alpha=0.5),
        helper.make_node("Mul", ["c2", "c2"], ["c3"], name="c3"),
        helper.make_node("MatMul", ["x", "m"], ["d1"], name="d1"),
        helper.make_node("Sigmoid", ["x"], ["unread"], name="dead_end"),
        helper.make_node("Concat", ["a2", "b1", "c3", "d1"], ["cat"], name="cat", axis=1),
        helper.make_node("Add", ["cat", "b1_wide"], ["y"], name="bad_add"),
    ]
    rng = np.random.default_rng(1)
    initializers = {
        "w": rng.standard_normal(5).astype(np.float32),
        "m": rng.standard_normal((5, 5)).astype(np.float32),
    }
    return make_model(
        nodes,
        [("x", FLOAT, ["N", 5]), ("b1_wide", FLOAT, ["M", 20])],
        [("y", FLOAT, ["N", 20]), ("c2", FLOAT, ["N", 5])],
        initializers,
    ), initializers


def _reference(x: np.ndarray, extra: np.ndarray, w: np.ndarray, m: np.ndarray) -> list[np.ndarray]:
    c1 = np.tanh(x)
    c2 = np.where(c1 > 0, c1, 0.5 * c1)
    cat = np.concatenate([np.maximum(x, 0) * w, 1 / (1 + np.exp(-x)), c2 * c2, x @ m], axis=1)
    return [cat + extra, c2]


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_branching_graph_matches_numpy(mode):
    model, weights = branching_model()
    session = hetflow.InferenceSession(model, threads=2, execution_mode=mode)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    extra = rng.standard_normal((3, 20)).astype(np.float32)
    results = session.run(None, {"x": x, "b1_wide": extra})
    for actual, expected in zip(results, _reference(x, extra, weights["w"], weights["m"])):
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("threads", [2, 4])
def test_parallel_run_releases_everything_but_outputs_and_weights(threads):
    model, weights = branching_model()
    session = hetflow.InferenceSession(model)
    program = compiled(session.plan, ("y",))
    assert program.branches
    feeds = {"x": np.ones((2, 5), np.float32), "b1_wide": np.ones((2, 20), np.float32)}
    for env in (program.run_parallel(feeds, threads), program.run(feeds)):
        alive = {name for name, slot in program.slots.items() if env[slot] is not None}
        assert alive == {"y", *weights}


def test_chain_graph_has_no_branches_to_overlap():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Tanh", ["a"], ["y"], name="t")],
        [("x", FLOAT, ["N", 3])],
        [("y", FLOAT, ["N", 3])],
    )
    session = hetflow.InferenceSession(model, execution_mode="parallel")
    assert not compiled(session.plan, ("y",)).branches


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_a_failing_node_is_named(mode):
    model, _ = branching_model()
    session = hetflow.InferenceSession(model, threads=2, execution_mode=mode)
    feeds = {"x": np.ones((3, 5), np.float32), "b1_wide": np.ones((4, 20), np.float32)}  # N=3 vs M=4
    with pytest.raises(KernelError, match=r"node 'bad_add' \(Add\).*\(3, 20\), \(4, 20\)"):
        session.run(None, feeds)
    # The session still works afterwards.
    feeds["b1_wide"] = np.ones((3, 20), np.float32)
    assert session.run(["y"], feeds)[0].shape == (3, 20)


def test_a_node_failing_while_another_branch_runs_raises(monkeypatch):
    """One branch fails while a step of another is still running: the run waits for that step, then
    raises (it had waited for a wake-up that never came)."""
    from hetflow.runtime import executor

    model = make_model(
        [helper.make_node("Relu", ["x"], ["slow"], name="slow"),
         helper.make_node("Add", ["x", "other"], ["bad"], name="bad"),
         helper.make_node("Concat", ["slow", "bad"], ["y"], name="cat", axis=0)],
        [("x", FLOAT, ["N", 5]), ("other", FLOAT, ["M", 5])],
        [("y", FLOAT, None)],
    )  # fmt: skip
    session = hetflow.InferenceSession(model, threads=2, execution_mode="parallel")
    run_op = executor._run_op
    started = threading.Event()

    def delayed(op, env, call):  # noqa: ANN001, ANN202
        if op.step.node.name == "slow":
            started.set()
            threading.Event().wait(0.3)  # still running when "bad" fails
        else:
            started.wait(5)
        return run_op(op, env, call)

    monkeypatch.setattr(executor, "_run_op", delayed)
    feeds = {"x": np.ones((3, 5), np.float32), "other": np.ones((4, 5), np.float32)}
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            session.run(None, feeds)
        except KernelError as error:
            outcome.append(error)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(30)
    assert not runner.is_alive(), "the run hung"
    assert len(outcome) == 1 and "'bad'" in str(outcome[0])


def test_runs_from_several_threads_in_parallel_mode():
    model, weights = branching_model()
    session = hetflow.InferenceSession(model, threads=2, execution_mode="parallel")
    rng = np.random.default_rng(3)
    cases = [(rng.standard_normal((b, 5)).astype(np.float32), rng.standard_normal((b, 20)).astype(np.float32))
             for b in (1, 2, 3, 4, 5, 6)]
    failures: list[str] = []

    def worker(x: np.ndarray, extra: np.ndarray) -> None:
        expected = _reference(x, extra, weights["w"], weights["m"])
        for _ in range(30):
            for actual, want in zip(session.run(None, {"x": x, "b1_wide": extra}), expected):
                if not np.allclose(actual, want, rtol=1e-6, atol=1e-6):
                    failures.append(f"batch {len(x)} differs")

    threads = [threading.Thread(target=worker, args=case) for case in cases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


@pytest.fixture(scope="module")
def googlenet_path(zoo_home: Path) -> Path:
    return zoo.model_path("googlenet")


def test_googlenet_parallel_equals_sequential(googlenet_path):
    x = np.random.default_rng(4).standard_normal((2, 3, 224, 224)).astype(np.float32)
    sequential = hetflow.InferenceSession(googlenet_path, threads=2)
    parallel = hetflow.InferenceSession(googlenet_path, threads=2, execution_mode="parallel")
    assert compiled(parallel.plan, tuple(parallel.graph.outputs)).branches
    feeds = {parallel.get_inputs()[0].name: x}
    expected = sequential.run(None, feeds)
    for _ in range(2):
        for actual, want in zip(parallel.run(None, feeds), expected):
            np.testing.assert_array_equal(actual, want)
