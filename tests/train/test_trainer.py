"""Tape, optimizers, Trainer, checkpoints and ONNX export on small models (real assertions, no timing)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from hetflow.frontends import load_model
from hetflow.train import (
    SGD,
    Adam,
    AdamW,
    Tape,
    Trainer,
    TrainingError,
    clip_by_global_norm,
    cosine,
    step_decay,
)
from hetflow.train.graph import parameter_names, training_graph
from hetflow.zoo.layers import LayerBuilder, Tensor
from tests.train.gradcheck import STEP, relative_error


def small_cnn(seed: int = 0, dropout: bool = True) -> onnx.ModelProto:
    """conv 3x3 -> BN -> ReLU -> maxpool -> conv (group 2, stride 2) -> LRN -> GAP -> FC -> Dropout -> FC
    -> Softmax on 3x9x9: every rule the zoo's CNNs use, at odd sizes."""
    b = LayerBuilder("small_cnn", seed)
    x = b.input("data", (3, 9, 9))
    x = b.relu(b.batch_norm(b.conv(x, 6, 3, pad=1)))
    x = b.max_pool(x, 2, 2)
    x = b.conv(x, 8, 3, 2, pad=1, group=2)
    (lrn,) = b.node("LRN", [x.name], "lrn", size=3, alpha=1e-2, beta=0.75, bias=1.0)
    x = b.flatten(b.global_avg_pool(Tensor(lrn, x.shape)))
    x = b.relu(b.fc(x, 12))
    if dropout:
        (dropped, _) = b.node("Dropout", [x.name], "dropout", num_outputs=2)
        x = Tensor(dropped, x.shape)
    x = b.fc(x, 4, gain=1.0)
    return b.model([b.softmax(x)])


def deep_cnn(seed: int = 0) -> onnx.ModelProto:
    """Four conv 3x3 + ReLU6 layers of one size, GAP, FC: the activations kept for backward peak at the
    end of the forward pass, where recomputing the ReLU6s (Clip) from the conv outputs pays.

    NOTE: ReLU6, not ReLU: the CPU trainer fuses a Relu into the Conv before it (``fuse_conv_relu``),
    which leaves no cheap activation to recompute."""
    b = LayerBuilder("deep_cnn", seed)
    x = b.input("data", (3, 9, 9))
    for _ in range(4):
        x = b.relu6(b.conv(x, 6, 3, pad=1))
    x = b.fc(b.flatten(b.global_avg_pool(x)), 4, gain=1.0)
    return b.model([b.softmax(x)])


def as_float64(model: onnx.ModelProto):
    graph = load_model(model)
    graph.initializers = {
        k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in graph.initializers.items()
    }
    for value in graph.values.values():
        if value.dtype == np.float32:
            value.dtype = np.dtype(np.float64)
    return graph


def test_tape_gradients_of_a_whole_network_match_finite_differences() -> None:
    graph = as_float64(small_cnn(dropout=False))
    train = training_graph(graph, reads_logits=True)
    params = parameter_names(train.graph)
    assert train.scores != graph.outputs[0]  # the loss reads the logits, not the Softmax
    tape = Tape(train.graph, params)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 3, 9, 9))
    weights = rng.standard_normal((3, 4))

    def loss() -> float:
        return float(np.sum(weights * tape.forward({"data": x}).values[train.scores]))

    grads = tape.backward(tape.forward({"data": x}), {train.scores: weights})
    assert set(grads) == set(params)
    noise = 8 * np.finfo(np.float64).eps * abs(loss()) / (2 * STEP)
    for name in params:
        array = train.graph.initializers[name]
        numeric = np.zeros_like(array)
        for flat in range(array.size):
            position = np.unravel_index(flat, array.shape)
            original = array[position]
            array[position] = original + STEP
            plus = loss()
            array[position] = original - STEP
            minus = loss()
            array[position] = original
            numeric[position] = (plus - minus) / (2 * STEP)
        if np.abs(numeric).max() <= noise:
            # A conv bias before training-mode BatchNormalization: the batch mean cancels it exactly, and
            # the differences are the loss's rounding (a few ULPs over 2 * STEP).
            assert np.abs(grads[name]).max() < 1e-9, name
            continue
        assert relative_error(grads[name], numeric) <= 1e-5, name


def test_tape_names_every_node_without_a_backward_rule() -> None:
    b = LayerBuilder("no_rule", 0)
    x = b.input("data", (4,))
    y = b.fc(x, 3)
    (cast,) = b.node("Cast", [y.name], "cast", to=onnx.TensorProto.FLOAT)
    graph = load_model(b.model([Tensor(cast, (3,))]))
    with pytest.raises(TrainingError, match="'cast' \\(Cast\\)"):
        Tape(graph, parameter_names(graph))
    # Nothing to differentiate behind it: no rule is needed.
    assert Tape(graph, []).kept_values() == set()


def quadratic_grads(params: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # loss = 0.5 * ||p - 3||^2 per parameter
    return {name: p - 3.0 for name, p in params.items()}


@pytest.mark.parametrize(
    "optimizer",
    [
        SGD(0.1),
        SGD(0.05, momentum=0.9),
        SGD(0.05, momentum=0.9, nesterov=True),
        Adam(0.1),
        AdamW(0.1, weight_decay=0.0),
    ],
    ids=["sgd", "momentum", "nesterov", "adam", "adamw"],
)
def test_optimizers_minimise_a_quadratic(optimizer) -> None:
    params = {"w": np.zeros(5), "b": np.full((2, 2), 10.0)}
    for _ in range(300):
        optimizer.step(params, quadratic_grads(params))
    for p in params.values():
        np.testing.assert_allclose(p, 3.0, atol=1e-3)


def test_weight_decay_pulls_towards_zero() -> None:
    for optimizer in (
        SGD(0.1, weight_decay=1.0),
        Adam(0.05, weight_decay=1.0),
        AdamW(0.05, weight_decay=1.0),
    ):
        params = {"w": np.zeros(3)}
        for _ in range(2000):
            optimizer.step(params, quadratic_grads(params))
        # SGD / Adam (coupled L2) settle at 3 / (1 + wd) = 1.5; AdamW shrinks the weight directly.
        assert 0.5 < params["w"][0] < 2.0, type(optimizer).__name__


def test_sgd_momentum_matches_the_recurrence() -> None:
    optimizer = SGD(0.1, momentum=0.5, nesterov=True)
    p = {"w": np.array([1.0])}
    optimizer.step(p, {"w": np.array([1.0])})  # v = 1, update g + 0.5 v = 1.5
    np.testing.assert_allclose(p["w"], [1.0 - 0.15])
    optimizer.step(p, {"w": np.array([2.0])})  # v = 0.5 + 2 = 2.5, update 2 + 1.25 = 3.25
    np.testing.assert_allclose(p["w"], [0.85 - 0.325])


def test_schedules_and_clipping() -> None:
    step = step_decay(10, 0.5)
    assert [step(s) for s in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    schedule = cosine(100, warmup=10, floor=0.1)
    assert schedule(0) == pytest.approx(0.1) and schedule(9) == pytest.approx(1.0)
    assert schedule(55) == pytest.approx(0.55) and schedule(100) == pytest.approx(0.1)
    optimizer = SGD(1.0, schedule=step_decay(1, 0.5))
    p = {"w": np.zeros(1)}
    optimizer.step(p, {"w": np.ones(1)})
    optimizer.step(p, {"w": np.ones(1)})
    np.testing.assert_allclose(p["w"], [-1.5])
    grads = {"a": np.array([3.0]), "b": np.array([4.0])}
    assert clip_by_global_norm(grads, 1.0) == pytest.approx(5.0)
    np.testing.assert_allclose(np.hypot(grads["a"], grads["b"]), [1.0])


def separable_data(seed: int = 0, count: int = 96) -> tuple[np.ndarray, np.ndarray]:
    """Four classes told apart by which quadrant of the 9x9 image is bright."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, count)
    x = rng.standard_normal((count, 3, 9, 9)).astype(np.float32) * 0.3
    for i, label in enumerate(y):
        row, col = divmod(int(label), 2)
        x[i, :, row * 5 : row * 5 + 4, col * 5 : col * 5 + 4] += 1.5
    return x, y


def test_fit_learns_and_updates_batchnorm_statistics() -> None:
    x, y = separable_data()
    trainer = Trainer(small_cnn(), optimizer=Adam(0.01), seed=1)
    bn_mean = next(name for name in trainer.buffers if "mean" in name)
    before = trainer.buffers[bn_mean].copy()
    start = trainer.evaluate(x, y)
    history = trainer.fit(x, y, epochs=8, batch_size=16, progress=False)
    end = trainer.evaluate(x, y)
    assert end["loss"] < start["loss"] * 0.5
    assert end["accuracy"] >= 0.9
    assert history.last.train_loss < history.epochs[0].train_loss
    assert not np.allclose(trainer.buffers[bn_mean], before)
    # The loaded graph's own weights are never written.
    assert np.array_equal(trainer.graph.initializers[bn_mean], before)


def test_frozen_parameters_stay_fixed_and_the_head_trains() -> None:
    x, y = separable_data()
    trainer = Trainer(small_cnn(), optimizer=SGD(0.1, momentum=0.9))
    head = trainer.train_only_head(1)
    assert head and all(name.startswith("fc") for name in head)
    frozen = {name: trainer.params[name].copy() for name in trainer.params if name not in head}
    heads = {name: trainer.params[name].copy() for name in head}
    trainer.fit(x, y, epochs=1, batch_size=32, progress=False)
    for name, array in frozen.items():
        assert np.array_equal(trainer.params[name], array), name
    assert all(not np.array_equal(trainer.params[name], array) for name, array in heads.items())
    # The first frozen layers need no gradient: no rule runs before the head.
    assert all(trainer.graph.nodes[i].op_type not in ("Conv",) for i in trainer.tape._wanted)


def test_checkpoint_round_trip_without_pickle(tmp_path) -> None:
    x, y = separable_data()
    trainer = Trainer(small_cnn(), optimizer=Adam(0.01))
    trainer.fit(x, y, epochs=1, batch_size=32, progress=False)
    path = tmp_path / "state.npz"
    trainer.save(path)
    with np.load(path, allow_pickle=False) as archive:  # readable with pickle off
        assert any(key.startswith("optim/") for key in archive.files)
    restored = Trainer(small_cnn(), optimizer=Adam(0.01))
    restored.load(path)
    np.testing.assert_array_equal(restored.predict(x), trainer.predict(x))
    # Both continue identically: the optimizer state came back too.
    trainer.train_step(x[:16], y[:16])
    restored.train_step(x[:16], y[:16])
    for name in trainer.params:
        np.testing.assert_allclose(restored.params[name], trainer.params[name], rtol=1e-6, atol=1e-7)


def test_export_matches_onnx_runtime(tmp_path) -> None:
    x, y = separable_data()
    trainer = Trainer(small_cnn(), optimizer=Adam(0.01))
    trainer.fit(x, y, epochs=2, batch_size=16, progress=False)
    path = tmp_path / "trained.onnx"
    trainer.export(path)
    model = onnx.load(str(path))
    bn = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert bn and all(len(n.output) == 1 for n in bn)
    assert all(a.name != "training_mode" for n in bn for a in n.attribute)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = trainer.predict(x)
    theirs = session.run(None, {"data": x})[0]
    np.testing.assert_allclose(theirs, ours, rtol=1e-4, atol=1e-4 * float(np.abs(ours).max()))
    # Trained, not the initial weights.
    initial = ort.InferenceSession(small_cnn().SerializeToString(), providers=["CPUExecutionProvider"])
    assert not np.allclose(initial.run(None, {"data": x})[0], theirs, atol=1e-3)


def test_dropout_masks_are_seeded_and_change_per_step() -> None:
    x, y = separable_data()
    first = Trainer(small_cnn(), optimizer=SGD(0.05), seed=3)
    second = Trainer(small_cnn(), optimizer=SGD(0.05), seed=3)
    for _ in range(2):
        assert first.train_step(x[:16], y[:16]) == second.train_step(x[:16], y[:16])
    for name in first.params:
        np.testing.assert_array_equal(first.params[name], second.params[name])


def test_memory_plan_matches_what_the_step_measures() -> None:
    x, y = separable_data()
    trainer = Trainer(small_cnn(), optimizer=Adam(0.01))
    report = trainer.memory_report(16)
    trainer.train_step(x[:16], y[:16])
    assert trainer.tape.peak_bytes == report["step_peak_bytes"]
    # Only what the rules read is kept: GlobalAveragePool's and Flatten's rules need shapes, not values.
    graph = trainer.training.graph
    kept = trainer.tape.kept_values()
    for op_type in ("LRN", "GlobalAveragePool"):
        (node,) = [n for n in graph.nodes if n.op_type == op_type]
        assert node.outputs[0] not in kept, op_type
    assert all(name in kept for name in graph.nodes[0].inputs if name not in graph.initializers)


def traced_step(trainer: Trainer, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """One step; returns (loss, peak bytes numpy allocated during it, measured by tracemalloc), on one
    thread: split over threads, the parts' scratch is alive at once or not, as they happen to overlap."""
    from hetflow.devices.cpu import threads

    gc.collect()  # what earlier tests left for the collector is not freed inside the traced step
    with threads.own_threads(1):
        tracemalloc.start()
        try:
            loss, _ = trainer.train_step(x, y)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    return loss, peak


def test_memory_budget_recomputes_cheap_activations_and_is_never_exceeded() -> None:
    x, y = separable_data()
    free = Trainer(deep_cnn(), optimizer=SGD(0.1, momentum=0.9), seed=2)
    report = free.memory_report(16)
    assert report["step_bound_bytes"] >= report["step_peak_bytes"]
    budget = report["fixed_bytes"] + report["step_bound_bytes"] - 1  # just below what liveness alone needs
    bounded = Trainer(deep_cnn(), optimizer=SGD(0.1, momentum=0.9), seed=2, memory_budget=budget)
    for step in range(3):
        batch = slice(16 * step, 16 * (step + 1))
        loss, _ = traced_step(free, x[batch], y[batch])
        bounded_loss, traced = traced_step(bounded, x[batch], y[batch])
        assert loss == pytest.approx(bounded_loss)
        assert bounded.tape.recompute, "the budget should force recomputation"
        # Every byte numpy allocated during the step (tracemalloc), plus what the step always holds.
        assert traced + bounded.fixed_bytes() <= budget, (traced, bounded.fixed_bytes(), budget)
    for name in free.params:
        np.testing.assert_array_equal(bounded.params[name], free.params[name])


def test_a_budget_that_cannot_fit_fails_before_the_step() -> None:
    from hetflow.errors import BudgetError

    x, y = separable_data()
    trainer = Trainer(small_cnn(), memory_budget="20KB")
    before = {name: array.copy() for name, array in trainer.params.items()}
    with pytest.raises(BudgetError, match="smaller batch"):
        trainer.train_step(x[:16], y[:16])
    for name, array in before.items():
        np.testing.assert_array_equal(trainer.params[name], array)


def test_devices_that_cannot_start_are_refused_by_name() -> None:
    from hetflow.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="unknown device 'tpu'"):
        Trainer(small_cnn(), device="tpu")
    with pytest.raises(DeviceUnavailableError, match="opencl:99"):
        Trainer(small_cnn(), device="opencl:99")


def test_auto_without_an_accelerator_trains_on_the_cpu_with_a_warning(monkeypatch) -> None:
    from hetflow.devices.opencl import OpenCLDevice

    monkeypatch.setattr(OpenCLDevice, "is_available", classmethod(lambda cls: "no platform (test)"))
    with pytest.warns(RuntimeWarning, match="training runs on the CPU"):
        trainer = Trainer(small_cnn(), device="auto")
    assert trainer.device == "cpu"
