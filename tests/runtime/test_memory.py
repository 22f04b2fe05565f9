"""The memory plan: arena layout by liveness, Concat without copies, in-place Add, and the runs on it."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices.host_memory import PAGE
from hetflow.runtime.executor import memory_plan
from hetflow.runtime.memory import ALIGNMENT, MemoryPlan, plan_memory
from hetflow.runtime.plan import Plan
from tests.helpers import make_model, run_onnxruntime

FLOAT = TensorProto.FLOAT
pytestmark = pytest.mark.usefixtures("zoo_home")


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)


def _conv(name: str, x: str, y: str, w: str, **attrs: object) -> object:
    return helper.make_node("Conv", [x, w], [y], name=name, **attrs)


def inception_model() -> object:
    """Two branches (1x1 conv, 3x3 conv) concatenated on channels, then a 1x1 conv and a flatten."""
    rng = np.random.default_rng(0)
    nodes = [
        _conv("stem", "x", "s", "w0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["s"], ["sr"], name="stem_relu"),
        _conv("left", "sr", "a", "w1"),
        _conv("right", "sr", "b", "w2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b"], ["br"], name="right_relu"),
        helper.make_node("MaxPool", ["sr"], ["c"], name="pool", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["a", "br", "c"], ["cat"], name="cat", axis=1),
        _conv("head", "cat", "h", "w3"),
        helper.make_node("Flatten", ["h"], ["y"], name="flat"),
    ]
    weights = {
        "w0": _weights(rng, 8, 3, 3, 3),
        "w1": _weights(rng, 4, 8, 1, 1),
        "w2": _weights(rng, 6, 8, 3, 3),
        "w3": _weights(rng, 5, 18, 1, 1),
    }
    return make_model(nodes, [("x", FLOAT, ["N", 3, 9, 7])], [("y", FLOAT, None)], weights)


def residual_model() -> object:
    """conv -> relu -> conv, added back to the first relu's output (a residual block), then a conv."""
    rng = np.random.default_rng(1)
    nodes = [
        _conv("c1", "x", "a", "w1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"], name="r1"),
        _conv("c2", "ar", "b", "w2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["ar", "b"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["sr"], name="r2"),
        _conv("c3", "sr", "y", "w3"),
    ]
    weights = {"w1": _weights(rng, 6, 3, 3, 3), "w2": _weights(rng, 6, 6, 3, 3), "w3": _weights(rng, 2, 6, 1, 1)}
    return make_model(nodes, [("x", FLOAT, ["N", 3, 8, 8])], [("y", FLOAT, None)], weights)


def _bound(session: hetflow.InferenceSession, batch: int) -> Plan:
    symbols = {d for v in session.get_inputs() for d in v.shape if isinstance(d, str)}
    return session.plan_for(dict.fromkeys(symbols, batch))


def _feed(session: hetflow.InferenceSession, batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    arg = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in arg.shape]
    return {arg.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


# -- the layout ------------------------------------------------------------------------------------
def _live_ranges(plan: Plan, memory: MemoryPlan) -> dict[str, tuple[int, int]]:
    """Arena value -> (producing step, last step touching it or a view of it), computed independently."""
    producer: dict[str, int] = {}
    last: dict[str, int] = {}
    roots: dict[str, set[str]] = {}
    for index, step in enumerate(plan.steps):
        read: set[str] = set()
        for name in step.node.present_inputs():
            read |= roots.get(name, set())
        for name in read:
            last[name] = index
        for name in step.node.present_outputs():
            if name in memory.placements:
                producer[name] = last[name] = index
                roots[name] = {name}
            elif not step.kernel.writes_out:
                roots[name] = set(read)
    return {name: (producer[name], last[name]) for name in producer}


def _assert_no_overlap(plan: Plan, memory: MemoryPlan) -> None:
    """At every step, the memory of values alive together (and of the step's workspace) is disjoint,
    except a Concat part inside its Concat and an in-place output over the input it replaces."""
    arena = memory.new_arena()
    views = memory.views(arena)
    ranges = _live_ranges(plan, memory)
    allowed = {frozenset(pair) for pair in memory.inplace.items()}
    allowed |= {frozenset(pair) for pair in memory.concat_parts.items()}
    names = sorted(ranges)
    for step in range(len(plan.steps)):
        alive = [n for n in names if ranges[n][0] <= step <= ranges[n][1]]
        for i, a in enumerate(alive):
            for b in alive[i + 1 :]:
                if frozenset((a, b)) not in allowed:
                    assert not np.shares_memory(views[a], views[b]), (step, a, b)
            workspace = memory.workspace(arena, step)
            if workspace is not None:
                assert not np.shares_memory(views[a], workspace), (step, a)
    for region in memory.workspaces.values():
        assert region.offset % ALIGNMENT == 0
    for placement in memory.placements.values():
        assert placement.offset % ALIGNMENT == 0
    # The offsets count from the arena's start, so it must start aligned too: numpy starts an array on
    # any 16 bytes, and a session whose buffers all sat 16 bytes off a cache line ran 11% slower.
    assert arena.ctypes.data % PAGE == 0
    for name, view in views.items():
        if name not in memory.concat_parts:  # a Concat's part starts where its slice does
            assert view.ctypes.data % ALIGNMENT == 0, name


@pytest.mark.parametrize("model", [inception_model, residual_model])
@pytest.mark.parametrize("batch", [1, 3])
def test_buffers_alive_together_never_overlap(model, batch):
    session = hetflow.InferenceSession(model())
    plan = _bound(session, batch)
    memory = memory_plan(plan)
    assert memory is not None
    _assert_no_overlap(plan, memory)


@pytest.mark.parametrize("name", ["googlenet", "resnet50", "squeezenet"])
def test_zoo_layouts_reuse_memory_without_overlap(name):
    session = hetflow.InferenceSession(f"zoo:{name}")
    plan = _bound(session, 1)
    memory = memory_plan(plan)
    assert memory is not None
    _assert_no_overlap(plan, memory)
    # Reuse happens: the arena is a fraction of every buffer side by side.
    assert memory.activation_bytes <= memory.arena_bytes <= memory.naive_bytes
    assert memory.arena_bytes < memory.naive_bytes / 2


def test_a_chain_reuses_two_buffers():
    """conv -> conv -> conv -> conv: each output only needs to outlive its reader, so two buffers do."""
    rng = np.random.default_rng(2)
    nodes = [_conv(f"c{i}", f"t{i}", f"t{i + 1}", f"w{i}", pads=[1, 1, 1, 1]) for i in range(4)]
    nodes[0].input[0] = "x"
    nodes[-1].output[0] = "y"
    weights = {f"w{i}": _weights(rng, 4, 4, 3, 3) for i in range(4)}
    model = make_model(nodes, [("x", FLOAT, [1, 4, 8, 8])], [("y", FLOAT, None)], weights)
    session = hetflow.InferenceSession(model)
    memory = plan_memory(session.plan)
    one = 4 * 8 * 8 * 4
    assert memory.activation_bytes == 2 * one
    assert memory.naive_bytes - sum(r.nbytes for r in memory.workspaces.values()) == 3 * one
    _assert_no_overlap(session.plan, memory)


def _accesses(plan: Plan, memory: MemoryPlan) -> dict[str, set[int]]:
    """Arena value -> every step touching it or a view of it (its producer first)."""
    touched: dict[str, set[int]] = {}
    roots: dict[str, set[str]] = {}
    for index, step in enumerate(plan.steps):
        read: set[str] = set()
        for name in step.node.present_inputs():
            read |= roots.get(name, set())
        for name in read:
            touched[name].add(index)
        for name in step.node.present_outputs():
            if name in memory.placements:
                touched[name] = {index}
                roots[name] = {name}
            elif not step.kernel.writes_out:
                roots[name] = set(read)
    return touched


def _ancestors(plan: Plan) -> list[set[int]]:
    producer: dict[str, int] = {}
    ancestors: list[set[int]] = []
    for index, step in enumerate(plan.steps):
        mine: set[int] = set()
        for name in step.node.present_inputs():
            if name in producer:
                mine |= {producer[name]} | ancestors[producer[name]]
        ancestors.append(mine)
        for name in step.node.present_outputs():
            producer[name] = index
    return ancestors


def _assert_parallel_safe(plan: Plan, memory: MemoryPlan) -> None:
    """Values sharing memory are ordered by the dependencies: one's every access precedes the other's
    production (whatever order the parallel executor picks)."""
    views = memory.views(memory.new_arena())
    touched = _accesses(plan, memory)
    ancestors = _ancestors(plan)
    allowed = {frozenset(pair) for pair in memory.inplace.items()}
    allowed |= {frozenset(pair) for pair in memory.concat_parts.items()}
    names = sorted(touched)

    def before(a: str, b: str) -> bool:
        born = min(touched[b])
        return all(step in ancestors[born] for step in touched[a])

    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if frozenset((a, b)) in allowed or not np.shares_memory(views[a], views[b]):
                continue
            if memory.inplace.get(a) or memory.inplace.get(b):
                continue  # chains of in-place values share by design (checked sequentially)
            assert before(a, b) or before(b, a), (a, b)


def test_parallel_order_keeps_independent_branches_apart():
    session = hetflow.InferenceSession(inception_model())
    plan = _bound(session, 2)
    memory = plan_memory(plan, order="parallel")
    views = memory.views(memory.new_arena())
    # The branches may run in any order: their outputs never share memory with what they all read.
    stem = session.graph.node("left").inputs[0]
    assert len(memory.concat_parts) == 3
    for part in memory.concat_parts:
        assert not np.shares_memory(views[part], views[stem])
    _assert_parallel_safe(plan, memory)


def test_parallel_zoo_layout_is_safe_in_any_order():
    session = hetflow.InferenceSession("zoo:googlenet")
    plan = _bound(session, 1)
    memory = plan_memory(plan, order="parallel")
    _assert_parallel_safe(plan, memory)
    assert memory.arena_bytes < memory.naive_bytes / 2


# -- planning decisions ---------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1, 2])
def test_concat_inputs_are_written_into_their_slices(batch):
    model = inception_model()
    session = hetflow.InferenceSession(model)
    memory = memory_plan(_bound(session, batch))
    assert memory is not None
    assert {name for name, concat in memory.concat_parts.items() if concat == "cat"} == {"a", "br", "c"}
    views = memory.views(memory.new_arena())
    cat = views["cat"]
    assert np.shares_memory(views["a"], cat[:, :4]) and np.shares_memory(views["c"], cat[:, 10:])
    feed = _feed(session, batch)
    [got] = session.run(None, feed)
    [expected] = run_onnxruntime(model, feed)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def dense_block_model() -> object:
    """DenseNet's pattern: each layer reads the running Concat (through a BatchNormalization and a Relu)
    and its output is concatenated onto it, three times."""
    rng = np.random.default_rng(4)
    nodes, weights, features, channels = [], {}, "x", 3
    for layer in range(3):
        prefix = f"l{layer}"
        nodes += [
            helper.make_node("BatchNormalization", [features, f"{prefix}_s", f"{prefix}_b", f"{prefix}_m",
                                                    f"{prefix}_v"], [f"{prefix}_bn"], name=f"{prefix}_bn"),
            helper.make_node("Relu", [f"{prefix}_bn"], [f"{prefix}_r"], name=f"{prefix}_relu"),
            _conv(f"{prefix}_conv", f"{prefix}_r", f"{prefix}_new", f"{prefix}_w", pads=[1, 1, 1, 1]),
            helper.make_node("Concat", [features, f"{prefix}_new"], [f"{prefix}_cat"], name=f"{prefix}_cat", axis=1),
        ]
        weights.update({
            f"{prefix}_s": _weights(rng, channels) + 1, f"{prefix}_b": _weights(rng, channels),
            f"{prefix}_m": _weights(rng, channels), f"{prefix}_v": np.abs(_weights(rng, channels)) + 0.5,
            f"{prefix}_w": _weights(rng, 2, channels, 3, 3),
        })  # fmt: skip
        features, channels = f"{prefix}_cat", channels + 2
    nodes.append(_conv("head", features, "y", "wh"))
    weights["wh"] = _weights(rng, 4, channels, 1, 1)
    return make_model(nodes, [("x", FLOAT, ["N", 3, 6, 5])], [("y", FLOAT, None)], weights)


@pytest.mark.parametrize("order", ["sequential", "parallel"])
@pytest.mark.parametrize("batch", [1, 3])
def test_a_chain_of_concats_shares_the_last_ones_buffer(batch, order):
    model = dense_block_model()
    session = hetflow.InferenceSession(model, execution_mode=order)
    plan = _bound(session, batch)
    memory = plan_memory(plan, order=order)
    # The first two Concats are parts of the next one; every new layer output is a part of its Concat.
    assert memory.concat_parts["l0_cat"] == "l1_cat" and memory.concat_parts["l1_cat"] == "l2_cat"
    assert {memory.concat_parts[f"l{i}_new"] for i in range(3)} == {"l0_cat", "l1_cat", "l2_cat"}
    views = memory.views(memory.new_arena())
    last = views["l2_cat"]
    assert np.shares_memory(views["l0_cat"], last[:, :5]) and np.shares_memory(views["l1_new"], last[:, 5:7])
    assert not np.shares_memory(views["l0_new"], last[:, 5:])  # l0's output sits at channels 3-4
    if order == "parallel":
        _assert_parallel_safe(plan, memory)
    feed = _feed(session, batch)
    for _ in range(2):  # the second run reuses the arena
        [got] = session.run(None, feed)
        [expected] = run_onnxruntime(model, feed)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_residual_add_runs_in_place():
    model = residual_model()
    session = hetflow.InferenceSession(model, optimize=False)
    memory = memory_plan(_bound(session, 2))
    assert memory is not None
    assert memory.inplace.get("s") in ("ar", "b")
    assert memory.inplace.get("sr") == "s"  # the Relu after it too
    feed = _feed(session, 2)
    [got] = session.run(None, feed)
    [expected] = run_onnxruntime(model, feed)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_conv_stores_over_its_folded_residual_unless_it_reads_that_memory_as_x():
    """c3 folds the Add of b: its sum may go over b, which dies there. In ``residual_model`` c2 folds an
    Add whose shortcut is its own X: that memory is read whole for every output, so it gets its own."""
    rng = np.random.default_rng(2)
    nodes = [
        _conv("c1", "x", "a", "w1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["ar"], name="r1"),
        _conv("c2", "ar", "b", "w2", pads=[1, 1, 1, 1]),
        _conv("c3", "ar", "c", "w3"),
        helper.make_node("Add", ["b", "c"], ["s"], name="residual"),
        _conv("c4", "s", "y", "w4"),
    ]
    weights = {"w1": _weights(rng, 6, 3, 3, 3), "w2": _weights(rng, 6, 6, 3, 3), "w3": _weights(rng, 6, 6, 1, 1),
               "w4": _weights(rng, 2, 6, 1, 1)}  # fmt: skip
    model = make_model(nodes, [("x", FLOAT, ["N", 3, 8, 8])], [("y", FLOAT, None)], weights)
    for proto, over in ((model, {"b"}), (residual_model(), set())):
        session = hetflow.InferenceSession(proto)
        plan = _bound(session, 2)
        folded = [step.node for step in plan.steps if step.node.op_type == "Conv" and step.node.attrs.residual]
        assert len(folded) == 1
        for order in ("sequential", "parallel"):
            memory = plan_memory(plan, order=order)
            assert {memory.inplace.get(folded[0].outputs[0])} - {None} == over, order
            _assert_no_overlap(plan, memory)
        feed = _feed(session, 2)
        for _ in range(2):
            np.testing.assert_allclose(session.run(None, feed)[0], run_onnxruntime(proto, feed)[0], rtol=1e-4,
                                       atol=1e-5)  # fmt: skip


def test_in_place_waits_for_the_last_reader():
    """``ar`` is read again after the residual Add, so the Add may only overwrite ``b``; in both orders."""
    model = residual_model()
    graph = model.graph
    graph.node[-1].input[0] = "z"
    graph.node.insert(len(graph.node) - 1, helper.make_node("Add", ["sr", "ar"], ["z"], name="again"))
    session = hetflow.InferenceSession(model, optimize=False)
    plan = _bound(session, 1)
    for order in ("sequential", "parallel"):
        memory = plan_memory(plan, order=order)
        assert memory.inplace["s"] == "b", order
        assert memory.inplace["z"] in ("sr", "ar"), order  # its inputs die there
        _assert_no_overlap(plan, memory)
    feed = _feed(session, 2)
    np.testing.assert_allclose(session.run(None, feed)[0], run_onnxruntime(model, feed)[0], rtol=1e-4, atol=1e-5)


def test_returned_values_never_live_in_the_arena():
    session = hetflow.InferenceSession(inception_model())
    memory = memory_plan(_bound(session, 1))
    assert memory is not None
    assert "y" not in memory.placements
    # y is a Flatten (a view) of h: h is pinned to a fresh array per run, so nothing is copied out.
    assert "h" not in memory.placements or "y" in memory.copy_out


# -- runs on the arena ----------------------------------------------------------------------------
def test_repeated_runs_return_independent_outputs():
    session = hetflow.InferenceSession(inception_model())
    first_feed, second_feed = _feed(session, 2, seed=1), _feed(session, 2, seed=2)
    [first] = session.run(None, first_feed)
    kept = first.copy()
    [second] = session.run(None, second_feed)
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second)
    [again] = session.run(None, first_feed)
    np.testing.assert_array_equal(again, kept)


def test_outputs_that_are_views_of_the_arena_are_copied_out():
    """squeezenet's output is a view (Reshape/Flatten) of arena memory: it must survive the next run."""
    session = hetflow.InferenceSession("zoo:squeezenet")
    memory = memory_plan(_bound(session, 1))
    assert memory is not None and memory.copy_out
    [first] = session.run(None, _feed(session, 1, seed=1))
    kept = first.copy()
    session.run(None, _feed(session, 1, seed=2))
    np.testing.assert_array_equal(first, kept)


def test_concurrent_runs_from_two_threads_are_correct():
    session = hetflow.InferenceSession(inception_model(), threads=1)
    feeds = [_feed(session, 2, seed=s) for s in (3, 4)]
    expected = [session.run(None, feed)[0] for feed in feeds]
    errors: list[str] = []
    barrier = threading.Barrier(2)

    def worker(index: int) -> None:
        barrier.wait()
        for _ in range(200):
            [got] = session.run(None, feeds[index])
            if not np.array_equal(got, expected[index]):
                errors.append(f"thread {index} got a wrong result")
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors


def test_parallel_mode_matches_sequential_on_the_arena():
    model = inception_model()
    sequential = hetflow.InferenceSession(model, threads=2)
    parallel = hetflow.InferenceSession(model, threads=2, execution_mode="parallel")
    for seed in range(5):
        feed = _feed(sequential, 3, seed)
        np.testing.assert_array_equal(parallel.run(None, feed)[0], sequential.run(None, feed)[0])


@pytest.mark.parametrize("name", ["googlenet", "squeezenet"])
def test_a_steady_state_run_allocates_no_large_arrays(name, ci_cores):
    session = hetflow.InferenceSession(f"zoo:{name}")
    feed = _feed(session, 1)
    memory = memory_plan(_bound(session, 1))
    assert memory is not None
    session.run(None, feed)  # warm: Winograd weight transforms, geometry caches
    tracemalloc.start()
    try:
        session.run(None, feed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Only small things remain: the returned probabilities, per-channel factors, Python objects.
    assert peak < memory.activation_bytes / 20, (peak, memory.activation_bytes)


def test_a_replayed_lstm_batch_allocates_nothing_per_step(ci_cores):
    """lstm-gesture at batch 16 runs 100 steps of tile-GEMM products on the spinning pool: a steady run
    allocates its outputs and a few Python objects, not a buffer a step (its GEMM's zero bias for later
    depth chunks was made on every call: 4.5 KB a step)."""
    from hetflow.devices.cpu.kernels import jit_gemm

    if not jit_gemm.available():
        pytest.skip("no spinning runs without jit_gemm (numba's CBLAS binding)")
    session = hetflow.InferenceSession("zoo:lstm-gesture", threads=2)
    feed = _feed(session, 16)
    for _ in range(3):  # captured, then replayed directly
        outputs = session.run(None, feed)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        session.run(None, feed)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < sum(y.nbytes for y in outputs) + 2048, peak


def test_info_memory_reports_weights_arena_and_workspace(capsys):
    from hetflow.cli import main

    assert main(["info", "zoo:squeezenet", "--memory", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "memory  (batch 2)" in out
    for label in ("weights", "arena", "activation peak", "largest workspace", "without reuse"):
        assert label in out
    report = hetflow.InferenceSession("zoo:squeezenet").memory_report(2)
    assert f"{report.arena_bytes / 2**20:10.2f} MiB" in out
    assert 0 < report.activation_bytes <= report.arena_bytes < report.naive_bytes


def test_concat_copies_what_it_cannot_place():
    """A feed and a weight cannot be produced into the Concat's slices: they are copied, the rest is not."""
    rng = np.random.default_rng(3)
    nodes = [
        _conv("c", "x", "a", "w", pads=[1, 1, 1, 1]),
        helper.make_node("Concat", ["x", "a", "k", "a2"], ["cat"], name="cat", axis=1),
        _conv("c2", "x", "a2", "w2"),
        _conv("head", "cat", "y", "w3"),
    ]
    nodes = [nodes[0], nodes[2], nodes[1], nodes[3]]
    weights = {
        "w": _weights(rng, 4, 3, 3, 3),
        "w2": _weights(rng, 2, 3, 1, 1),
        "k": _weights(rng, 1, 1, 5, 5),
        "w3": _weights(rng, 3, 10, 1, 1),
    }
    model = make_model(nodes, [("x", FLOAT, [1, 3, 5, 5])], [("y", FLOAT, None)], weights)
    session = hetflow.InferenceSession(model, optimize=False)
    memory = memory_plan(session.plan)
    assert memory is not None
    assert set(memory.concat_parts) == {"a", "a2"}
    feed = {"x": rng.standard_normal((1, 3, 5, 5)).astype(np.float32)}
    np.testing.assert_allclose(session.run(None, feed)[0], run_onnxruntime(model, feed)[0], rtol=1e-4, atol=1e-5)
