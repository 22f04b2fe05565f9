"""A batch run as runs of fewer images (``hetflow.runtime.sub_batch``): which graphs may be split, that a
split run computes what the whole one does, and that the choice is measured, recorded and read back."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from hetflow import InferenceSession, load_model
from hetflow.options import HOME_ENV
from hetflow.runtime import session as session_module
from hetflow.runtime.sub_batch import SUB_BATCH_OP, batch_symbol, candidates, fastest, run_in_parts
from tests.helpers import add_relu_model, make_model

RNG = np.random.default_rng(5)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    """Every test gets its own empty HETFLOW_HOME (tuning cache, zoo builds): the user's is never read."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))


def _lenet_feeds(batch: int) -> dict[str, np.ndarray]:
    return {"data": RNG.standard_normal((batch, 1, 28, 28)).astype(np.float32)}


def _lenet(**options) -> InferenceSession:  # noqa: ANN003
    session = InferenceSession("zoo:lenet", threads=1, **options)
    assert session.get_inputs()[0].name == "data"
    return session


def test_zoo_cnns_compute_their_images_apart_and_an_lstm_does_not() -> None:
    assert batch_symbol(InferenceSession("zoo:lenet").graph) == "N"
    assert batch_symbol(InferenceSession("zoo:lstm-gesture").graph) is None  # sequences first, then the batch


@pytest.mark.parametrize(
    ("node", "out_shape"),
    [(helper.make_node("Concat", ["x", "x"], ["y"], axis=0), ["M", 3]),
     (helper.make_node("Softmax", ["x"], ["y"], axis=0), ["N", 3]),
     (helper.make_node("Softmax", ["x"], ["y"], axis=-2), ["N", 3]),
     (helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), [3, "N"])],
    ids=["concat-batch", "softmax-batch", "softmax-negative-batch", "transpose"],
)  # fmt: skip
def test_ops_that_mix_images_keep_the_batch_whole(node, out_shape) -> None:  # noqa: ANN001
    model = make_model([node], [("x", TensorProto.FLOAT, ["N", 3])], [("y", TensorProto.FLOAT, out_shape)])
    assert batch_symbol(load_model(model)) is None


def test_a_reshape_keeps_the_batch_only_when_it_leaves_the_first_dimension() -> None:
    def reshaped(target: list[int]) -> str | None:
        model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])], [("x", TensorProto.FLOAT, ["N", 2, 3])],
                           [("y", TensorProto.FLOAT, None)], {"shape": np.array(target, np.int64)})  # fmt: skip
        return batch_symbol(load_model(model))

    assert reshaped([0, 6]) == "N"
    assert reshaped([-1, 6]) == "N"
    assert reshaped([-1]) is None  # the images end to end in one row
    assert reshaped([2, -1]) is None


def test_a_split_run_computes_what_the_whole_batch_does() -> None:
    feeds = _lenet_feeds(5)
    [whole] = _lenet().run(None, feeds)
    split = _lenet(sub_batch=2)
    assert split.images_per_run(5) == 2
    [parts] = split.run(None, feeds)  # 2 + 2 + 1 images
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-6)


def test_a_split_run_calls_the_whole_run_once_per_part(monkeypatch) -> None:  # noqa: ANN001
    session = _lenet(sub_batch=3)
    batches = []
    original = InferenceSession._run_whole
    monkeypatch.setattr(InferenceSession, "_run_whole",
                        lambda self, names, feeds, observer: batches.append(feeds["data"].shape[0])
                        or original(self, names, feeds, observer))  # fmt: skip
    session.run(None, _lenet_feeds(7))
    assert batches == [3, 3, 1]
    batches.clear()
    session.run(None, _lenet_feeds(3))  # no more images than a part: whole
    assert batches == [3]


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4"])
def test_sub_batch_must_be_a_positive_int(bad) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="sub_batch"):
        _lenet(sub_batch=bad)


def test_a_graph_that_mixes_images_is_never_split() -> None:
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=0)], [("x", TensorProto.FLOAT, ["N", 3])],
                       [("y", TensorProto.FLOAT, ["N", 3])])  # fmt: skip
    with pytest.warns(UserWarning, match="sub_batch is ignored"):
        session = InferenceSession(model, sub_batch=1)
    assert session.images_per_run(4) is None
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    [y] = session.run(None, {"x": x})
    np.testing.assert_allclose(y.sum(axis=0), np.ones(3), rtol=1e-5)  # one softmax over all four


def test_run_in_parts_joins_each_outputs_parts() -> None:
    feeds = {"a": np.arange(10.0).reshape(5, 2), "b": np.arange(5.0)}
    results = run_in_parts(lambda part: [part["a"] * 2, part["b"] + 1], feeds, 2)
    np.testing.assert_array_equal(results[0], feeds["a"] * 2)
    np.testing.assert_array_equal(results[1], feeds["b"] + 1)


def test_candidates_divide_the_batch_and_the_fastest_wins_ties_with_more_images() -> None:
    assert candidates(16) == [2, 4, 8]
    assert candidates(6) == [2]
    assert candidates(2) == []
    assert fastest({16: 3.0, 4: 2.0, 2: 2.0}) == 4


def test_a_tuning_session_measures_and_records_the_split_and_later_sessions_read_it(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(session_module, "MEASURED_RUNS", 1)
    cache = tmp_path / "records.jsonl"
    tuning = _lenet(tune=True, tuning_cache=cache)
    chosen = tuning.images_per_run(4)
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    [record] = [r for r in records if r["op"] == SUB_BATCH_OP]
    assert record["workload"]["batch"] == 4 and set(record["candidates"]) == {"4", "2"}
    assert chosen == (None if record["chosen"] == "4" else 2)
    assert _lenet(tuning_cache=cache).images_per_run(4) == chosen
    assert _lenet(tuning_cache=tmp_path / "none.jsonl").images_per_run(4) is None  # no record: whole


def test_a_recorded_split_is_used(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A record that chose 2 images per run (times rewritten so): the next session splits."""
    monkeypatch.setattr(session_module, "MEASURED_RUNS", 1)
    cache = tmp_path / "records.jsonl"
    _lenet(tune=True, tuning_cache=cache).images_per_run(4)
    lines = []
    for line in cache.read_text().splitlines():
        record = json.loads(line)
        if record["op"] == SUB_BATCH_OP:
            record["candidates"], record["chosen"] = {"4": 2.0, "2": 1.0}, "2"
        lines.append(json.dumps(record))
    cache.write_text("\n".join(lines) + "\n")
    assert _lenet(tuning_cache=cache).images_per_run(4) == 2
    assert InferenceSession(add_relu_model(), tuning_cache=cache).images_per_run(4) is None  # another model


def test_the_tune_command_measures_the_split_of_a_batch(capsys, monkeypatch) -> None:  # noqa: ANN001
    from hetflow.cli import main
    from hetflow.devices.cpu import CPUDevice
    from hetflow.tuning.cache import TuningCache, cache_path

    monkeypatch.setattr(session_module, "MEASURED_RUNS", 1)
    assert main(["tune", "zoo:lenet", "--batch", "4", "--threads", "1"]) == 0
    assert "images per run (a batch of 4): 4 " in capsys.readouterr().out
    records = TuningCache(cache_path(), CPUDevice().fingerprint()).records()
    [split] = [r for r in records if r.workload.op == SUB_BATCH_OP]
    assert set(split.candidates) == {"4", "2"} and split.workload.params["threads"].split("+")[0].endswith(":1")


def test_measuring_keeps_only_the_plan_of_the_chosen_size(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The whole batch's plan and those of the sizes not chosen hold arenas: dropped after measuring."""
    monkeypatch.setattr(session_module, "MEASURED_RUNS", 1)
    session = _lenet(tune=True, tuning_cache=tmp_path / "records.jsonl")
    chosen = session.images_per_run(8) or 8
    bound = {dict(key)["N"] for key in session._bound_plans}  # noqa: SLF001  (what the session holds)
    assert bound == {chosen}
    [y] = session.run(None, _lenet_feeds(8))
    assert y.shape == (8, 10)


MIB = 1 << 20


@pytest.mark.parametrize(("model", "batch", "expected"), [
    ("squeezenet", 16, 4),  # 4.7 MB of weights; 3.7 MB a layer an image: 60 MB at 16, 15 at 4
    ("mobilenetv2", 16, 4),  # 13 MB of weights; 5.7 MB an image: 92 MB at 16, 23 at 4
    ("mobilenetv2", 8, 4),
    ("squeezenet", 8, None),  # 30 MB at 8: fits the 32 MB cache
    ("shufflenet", 16, None),  # 28 MB at 16
    ("resnet50", 16, None),  # 97 MB of weights, read again by every run
    ("lenet", 16, None),
])  # fmt: skip
def test_the_cost_model_splits_a_batch_whose_layers_outgrow_the_cache(model, batch, expected) -> None:  # noqa: ANN001
    from hetflow.runtime.sub_batch import default_images

    graph = InferenceSession(f"zoo:{model}").graph
    assert default_images(graph, batch, 32 * MIB) == expected
    assert default_images(graph, batch, 0) is None  # a cache the system does not report: never split


def test_the_largest_layer_counts_one_images_inputs_and_outputs() -> None:
    from hetflow.runtime.sub_batch import largest_layer_bytes

    # lenet's largest: pool1 reads conv1's 20x24x24 and writes 20x12x12 (floats).
    assert largest_layer_bytes(InferenceSession("zoo:lenet").graph) == (20 * 24 * 24 + 20 * 12 * 12) * 4
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ["N", "C"])],
                       [("y", TensorProto.FLOAT, ["N", "C"])])  # fmt: skip
    assert largest_layer_bytes(load_model(model)) == 0  # an unknown extent: no rule


def test_a_default_session_runs_a_large_batch_in_parts_unless_told_otherwise(monkeypatch) -> None:  # noqa: ANN001
    """Without a record or an option, the cost model's choice (here on a 32 MB cache); ``sub_batch`` of the
    batch runs it whole, and both compute the same."""
    monkeypatch.setattr(session_module, "last_level_cache_bytes", lambda: 32 * MIB)
    session = InferenceSession("zoo:squeezenet")
    whole = InferenceSession("zoo:squeezenet", sub_batch=8)
    assert session.images_per_run(8) is None and session.images_per_run(16) == 4
    assert whole.images_per_run(8) is None and whole.images_per_run(16) == 8
    feeds = {session.get_inputs()[0].name: RNG.standard_normal((8, 3, 224, 224)).astype(np.float32)}
    np.testing.assert_allclose(session.run(None, feeds)[0], whole.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    assert InferenceSession("zoo:squeezenet", sub_batch=16).images_per_run(16) is None
