"""How runs differ from layers timed alone: GEMMs split over hetflow's own threads (the one-thread GEMM
model, which runs split), and the nearest-sample correction. (What a run loses to data out of cache:
tests/estimate/test_cache.py.)"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hetflow import InferenceSession
from hetflow.devices.cpu.kernels import jit_gemm
from hetflow.devices.cpu.threads import MIN_MACS_PER_SPLIT
from hetflow.estimate.calibrate import FULL, QUICK, _gemm_grid, one_thread_grid
from hetflow.estimate.models import (
    NEIGHBOUR_PRIOR,
    gemm_seconds,
    neighbour_factor,
    neighbour_point,
    split_gemm_seconds,
    stacked_gemm_seconds,
)
from hetflow.estimate.predict import batch_bindings, estimate, split_threads
from hetflow.estimate.profile import GemmModel
from hetflow.ops.base import GemmDims, TensorInfo
from hetflow.ops.conv import DIRECT_FMA
from hetflow.passes.infer_shapes import bind_batch
from hetflow.runtime import executor
from hetflow.runtime.executor import (
    OWN_THREADS_MIN_CONV_MACS,
    OWN_THREADS_MIN_DIRECT_SHARE,
    SPIN_BLAS_MAX_CONV_MACS,
    ThreadArrangement,
    plan_conv_macs,
    splits_gemms,
    thread_arrangement,
)

#: One BLAS thread: 50 GFLOP/s, 2 us a call, no small-matrix terms (residuals zero).
ONE_THREAD = GemmModel(peak_gflops=50.0, overhead_s=2e-6)


def test_a_single_large_product_splits_by_columns():
    dims = GemmDims(n=256, m=3136, k=1152)
    assert split_gemm_seconds(ONE_THREAD, dims, 2) == pytest.approx(gemm_seconds(ONE_THREAD, 256, 1568, 1152))
    assert split_gemm_seconds(ONE_THREAD, dims, 2) < 0.6 * gemm_seconds(ONE_THREAD, 256, 3136, 1152)


def test_a_stack_splits_by_products_rounding_up():
    dims = GemmDims(n=64, m=196, k=576, count=5)
    expected = stacked_gemm_seconds(ONE_THREAD, dataclasses.replace(dims, count=3))
    assert split_gemm_seconds(ONE_THREAD, dims, 2) == pytest.approx(expected)


def test_products_too_small_to_split_run_whole_on_one_thread():
    dims = GemmDims(n=16, m=49, k=27, count=2)
    assert dims.n * dims.m * dims.k * dims.count < MIN_MACS_PER_SPLIT
    assert split_gemm_seconds(ONE_THREAD, dims, 2) == pytest.approx(stacked_gemm_seconds(ONE_THREAD, dims))
    big = GemmDims(n=512, m=784, k=4608)
    assert split_gemm_seconds(ONE_THREAD, big, 1) == pytest.approx(gemm_seconds(ONE_THREAD, 512, 784, 4608))


def test_a_stack_pays_the_call_overhead_once():
    dims = GemmDims(n=64, m=196, k=576, count=4)
    single = gemm_seconds(ONE_THREAD, 64, 196, 576)
    assert stacked_gemm_seconds(ONE_THREAD, dims) == pytest.approx(single + 3 * (single - ONE_THREAD.overhead_s))


def test_the_one_thread_grid_holds_only_the_sizes_a_split_part_can_have():
    grid = _gemm_grid(FULL)
    points = one_thread_grid(FULL, grid, 2)
    assert points and len(points) < len(grid)
    assert all(n * m * k * 2 >= MIN_MACS_PER_SPLIT for n, m, k in points)
    assert one_thread_grid(QUICK, _gemm_grid(QUICK), 2) == _gemm_grid(QUICK)


def test_the_profile_has_a_one_thread_model_exactly_when_its_runs_can_split(quick_profile):
    # Only the model's presence is checked: comparing its peak with all threads' is a claim about the
    # machine, which fails where other processes share the cores (an H100 host's 14 test workers).
    assert (quick_profile.gemm_one_thread is not None) == (quick_profile.threads > 1)


SMALL = OWN_THREADS_MIN_CONV_MACS // 10
#: Whether a batch splits on hetflow's own threads here (no spinning pool for it: ``executor.BATCHES_SPIN``).
BATCHES_OWN = not (executor.BATCHES_SPIN and jit_gemm.available())


@pytest.mark.parametrize(
    ("conv_macs", "direct_macs", "batched", "threads", "expected"),
    [
        (OWN_THREADS_MIN_CONV_MACS, 0, True, 2, BATCHES_OWN),  # a batch of a big conv net, unless it spins
        (OWN_THREADS_MIN_CONV_MACS, 0, True, 1, False),  # one thread: nothing to split over
        (SMALL, 0, True, 2, False),  # a batch of a small net spins, or keeps BLAS's threads
        (SMALL, SMALL // 2, True, 2, not jit_gemm.available()),  # its direct Convs spin where they can
        (SMALL, SMALL, False, 2, False),  # one example: not a batch
        (0, 0, True, 2, False),  # no Conv: recurrent nets keep OpenBLAS's threads
    ],
)
def test_which_runs_split_their_gemms(conv_macs, direct_macs, batched, threads, expected):
    assert splits_gemms(conv_macs, batched, threads, direct_macs) is expected


@pytest.mark.parametrize("model", ["zoo:vgg19", "zoo:cifar10-quick"])
def test_the_estimate_splits_exactly_when_the_run_does(quick_profile, model):
    session = InferenceSession(model)
    can_split = quick_profile.gemm_one_thread is not None
    for batch in (1, 16):
        plan = session.plan_for(batch_bindings(session.graph, batch))
        direct = plan_conv_macs(plan, DIRECT_FMA)
        expected = can_split and splits_gemms(plan_conv_macs(plan), batch > 1, quick_profile.threads, direct)
        assert (split_threads(quick_profile, plan, batch, None) > 0) is expected
    assert split_threads(quick_profile, session.plan_for(batch_bindings(session.graph, 16)), 16, 1) == 0


def test_a_batch_of_a_network_of_direct_convs_spins_or_splits_on_its_own_threads():
    session = InferenceSession("zoo:cifar10-quick", threads=2)
    plan = session.plan_for(batch_bindings(session.graph, 16))
    conv_macs, direct = plan_conv_macs(plan), plan_conv_macs(plan, DIRECT_FMA)
    assert 0 < direct <= conv_macs < OWN_THREADS_MIN_CONV_MACS
    arrangement = thread_arrangement(conv_macs, True, 2, direct)
    if jit_gemm.available():
        assert arrangement == ThreadArrangement("spin", 2, hold_blas=conv_macs >= SPIN_BLAS_MAX_CONV_MACS)
    else:
        assert arrangement.kind == ("own" if direct >= OWN_THREADS_MIN_DIRECT_SHARE * conv_macs else "blas")


@pytest.mark.parametrize(("conv_macs", "batched", "expected"), [
    (OWN_THREADS_MIN_CONV_MACS // 10, False, "spin"),  # one example of any network spins
    (OWN_THREADS_MIN_CONV_MACS * 10, False, "spin"),
    (OWN_THREADS_MIN_CONV_MACS // 10, True, "spin"),  # so does a batch of a small one
    (OWN_THREADS_MIN_CONV_MACS, True, "own" if BATCHES_OWN else "spin"),  # a large one (``BATCHES_SPIN``)
    (0, True, "blas"),  # no Conv: BLAS's threads
])  # fmt: skip
def test_the_thread_arrangement_of_a_run(conv_macs, batched, expected):
    if not jit_gemm.available():  # no spinning pool: a large batch splits on own threads, the rest keep BLAS's
        expected = "own" if batched and conv_macs >= OWN_THREADS_MIN_CONV_MACS else "blas" if expected == "spin" else expected
    assert thread_arrangement(conv_macs, batched, 2).kind == expected
    assert thread_arrangement(conv_macs, batched, 1).kind == "blas"  # one thread: nothing to arrange


@pytest.mark.parametrize("batches_spin", [False, True])
def test_batches_spin_decides_where_a_large_batch_splits(monkeypatch, batches_spin):
    monkeypatch.setattr(executor, "BATCHES_SPIN", batches_spin)
    spinning = "spin" if jit_gemm.available() else None
    assert thread_arrangement(OWN_THREADS_MIN_CONV_MACS, True, 2).kind == ((batches_spin and spinning) or "own")
    assert thread_arrangement(OWN_THREADS_MIN_CONV_MACS // 10, True, 2).kind == (spinning or "blas")


def test_a_layer_at_a_calibration_sample_takes_most_of_its_residual():
    features = np.array([1.0, 2e-4, 1e-6, 3e-5, 0.0, 0.0, 1e-6])
    residual = math.log(2.0)
    neighbours = [[*neighbour_point(features), residual]]
    assert neighbour_factor([], features) == 1.0
    assert neighbour_factor(neighbours, features) == pytest.approx(math.exp(residual / (1 + NEIGHBOUR_PRIOR)))
    far = features * np.array([1, 8, 1, 8, 1, 1, 1])  # GEMM and memory terms 8x larger: another shape
    assert neighbour_factor(neighbours, far) == pytest.approx(1.0, abs=1e-3)


def _peak_of_a_warm_call(kernel, node, inputs, threads) -> int:  # noqa: ANN001
    """Bytes allocated at the peak of one call of ``kernel``, inside the ``threads`` arrangement, after a
    first call has compiled it."""
    import tracemalloc

    with threads:
        kernel.fn(node, inputs)
        tracemalloc.start()
        try:
            kernel.fn(node, inputs)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_the_compiled_lstm_scratch_is_what_the_kernel_allocates(batch):
    """The estimator's LSTM workspace is the compiled cell's buffers, not the op's projection of every
    step (13 MB where the kernel allocates 0.6 MB: lstm-gesture's peak was 52% over): the spinning
    pool's driver's at every batch here (the kernel called in the threads a run holds; at batch 1 on W
    and R packed once, which the plan counts with the weights)."""

    from hetflow.devices.cpu import CPUDevice
    from hetflow.devices.cpu.kernels.rnn import compiled_lstm_scratch_bytes, spinning_lstm_batch
    from hetflow.passes.infer_shapes import bind_batch
    from hetflow.runtime.executor import run_threads
    from hetflow.runtime.planner import input_infos

    session = InferenceSession("zoo:lstm-gesture")
    graph = bind_batch(session.graph, {"N": batch})
    node = next(n for n in graph.nodes if n.op_type == "LSTM")
    infos = input_infos(graph, node)
    recurrent_batch = spinning_lstm_batch(node, infos)
    assert recurrent_batch == batch
    scratch = compiled_lstm_scratch_bytes(node, infos, pool_held=True)
    assert scratch is not None
    kernel = CPUDevice().kernels.lookup(node, infos)
    x = np.random.default_rng(0).standard_normal((100, batch, 6)).astype(np.float32)
    inputs = [x] + [graph.initializers[name] for name in node.inputs[1:]]
    allocated = _peak_of_a_warm_call(kernel, node, inputs, run_threads(0, batch > 1, 2, 0, recurrent_batch))
    # The peak is the scratch, and the final H's copy (an output, 2 KB, made from the scratch's states).
    assert scratch == pytest.approx(allocated, rel=0.05, abs=2 * 512 * 4)
    peephole = dataclasses.replace(node, inputs=[*node.inputs, "", "", "", "p"])
    peephole_info = TensorInfo((1, 3 * 512), np.dtype(np.float32))
    assert compiled_lstm_scratch_bytes(peephole, [*input_infos(graph, node), None, None, None, peephole_info]) is None


@pytest.mark.parametrize(
    ("batch", "pool_held", "y", "states"),
    [(3, False, True, False), (16, False, False, True), (32, False, True, False), (32, True, True, True),
     (24, True, False, False)],
)
def test_the_compiled_lstm_scratch_counts_every_driver_and_output(batch, pool_held, y, states):
    """Every driver's buffers (the compiled sequence, the stepwise one, the spinning pool's), Y's
    transposed steps and the initial states' copies: within 5% of what the kernel allocates."""

    from onnx import TensorProto, helper

    from hetflow.devices.cpu import CPUDevice
    from hetflow.devices.cpu.kernels.rnn import compiled_lstm_scratch_bytes
    from hetflow.devices.cpu.threads import own_threads
    from hetflow.runtime.executor import spin_threads

    seq, features, hidden = 20, 5, 128
    rng = np.random.default_rng(1)
    initial = [rng.standard_normal((1, batch, hidden)).astype(np.float32) for _ in range(2)] if states else []
    outputs = ["y" if y else "", "y_h"]
    node_inputs = ["x", "w", "r", "b", "", *(["h0", "c0"] if states else [])]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, features])]
    graph_inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, batch, hidden]) for n in ("h0", "c0")
                     if states]  # fmt: skip
    weights = {"w": (1, 4 * hidden, features), "r": (1, 4 * hidden, hidden), "b": (1, 8 * hidden)}
    model = helper.make_model(helper.make_graph(
        [helper.make_node("LSTM", node_inputs, outputs, hidden_size=hidden)], "lstm", graph_inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n],
        [helper.make_tensor(n, TensorProto.FLOAT, shape, rng.standard_normal(shape).astype(np.float32).ravel())
         for n, shape in weights.items()]))  # fmt: skip
    session = InferenceSession(model)
    graph = session.graph
    node = graph.nodes[0]
    from hetflow.runtime.planner import input_infos

    infos = input_infos(graph, node)
    scratch = compiled_lstm_scratch_bytes(node, infos, pool_held=pool_held)
    kernel = CPUDevice().kernels.lookup(node, infos)
    x = rng.standard_normal((seq, batch, features)).astype(np.float32)
    values = {"x": x, **dict(zip(("h0", "c0"), initial)), **graph.initializers}
    inputs = [values[name] if name else None for name in node.inputs]
    context = own_threads(spin_threads(2), spin=True, hold_blas=True) if pool_held else own_threads(1)
    allocated = _peak_of_a_warm_call(kernel, node, inputs, context)
    # Y is made before the scan (its steps copied in after it), so the peak holds it beside the scratch.
    y_bytes = seq * batch * hidden * 4 if y else 0
    assert scratch + y_bytes == pytest.approx(allocated, rel=0.05)


def test_layers_a_spinning_run_splits_have_keys_of_their_own(quick_profile):
    """lenet spins (``executor.spins``) at batch 1 and 16. At batch 1 its direct Convs, pools and fully
    connected layers are predicted from the ``@spin`` models; at 16 its direct Convs (each image a share)
    and pools from the ``@spin-batch`` ones, and its fully connected layers run the dense kernel, shared
    out on the pool (``@own-spin``; ``@own`` where a run does not spin)."""
    from hetflow.estimate.predict import (
        DENSE_SPIN_MARK,
        OWN_GEMM_MARK,
        SPIN_BATCH_MARK,
        SPIN_MARK,
        key_algorithm,
        spin_run,
        unmarked,
    )
    from hetflow.runtime.executor import spins

    session = InferenceSession("zoo:lenet")
    expected = {
        1: {"Conv/direct_fma@spin", "MaxPool/default@spin", "Gemm/default@spin"},
        16: {"Conv/direct_fma@spin-batch", "MaxPool/default@spin-batch", "Gemm/default@own-spin"},
    }
    for batch in (1, 16):
        plan = session.plan_for(batch_bindings(session.graph, batch))
        spinning = spins(plan_conv_macs(plan), batch > 1, quick_profile.threads)
        assert spin_run(quick_profile, plan, batch, None) is spinning
        report = estimate(session, quick_profile, batch)
        assert all("@" not in layer.algorithm for layer in report.layers)  # reports name algorithms
        marks = (SPIN_MARK, SPIN_BATCH_MARK, OWN_GEMM_MARK, DENSE_SPIN_MARK)
        keys = {key for key in _keys(session, quick_profile, batch) if key.endswith(marks)}
        if spinning:
            assert keys == expected[batch]
        else:
            assert not any(key.endswith((SPIN_MARK, SPIN_BATCH_MARK, DENSE_SPIN_MARK)) for key in keys)
    assert key_algorithm("Conv/direct_fma" + SPIN_MARK) == "direct_fma"
    assert unmarked("Gemm/default" + DENSE_SPIN_MARK) == "Gemm/default"
    assert key_algorithm("Conv/direct_fma" + SPIN_BATCH_MARK) == "direct_fma"


def test_a_batch_stem_on_phase_planes_has_a_key_of_its_own(quick_profile):
    """GoogLeNet at batch 16: its 7x7/2 stem runs the direct kernel on phase planes and is predicted
    from the ``@phases`` model, its stride-1 direct Convs (if any) from the plain one."""
    from hetflow.estimate.predict import PHASES_MARK, key_algorithm

    session = InferenceSession("zoo:googlenet")
    keys = _keys(session, quick_profile, 16)
    assert keys[0] == "Conv/direct_fma" + PHASES_MARK
    assert all(not key.endswith(PHASES_MARK) for key in keys[1:])
    assert key_algorithm(keys[0]) == "direct_fma"


def _keys(session, profile, batch):  # noqa: ANN001, ANN202
    from hetflow.estimate.predict import layer_key, spin_run

    bindings = batch_bindings(session.graph, batch)
    graph = bind_batch(session.graph, bindings)
    plan = session.plan_for(bindings)
    spinning = spin_run(profile, plan, batch, None)
    by_name = {node.name: node for node in graph.nodes}
    return [layer_key(by_name[step.node.name], step.kernel, graph, spinning) for step in plan.steps]


@pytest.mark.parametrize(("batch", "key", "columns"), [(1, "LSTM/sequence", 1), (3, "LSTM/sequence", 1),
                                                       (16, "LSTM/sequence", 16), (64, "LSTM/default", 64)])
def test_the_lstm_is_costed_as_its_driver_runs_it(batch, key, columns):
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import kernel_cost, layer_key
    from hetflow.ops.cost import node_costs
    from hetflow.runtime.planner import input_infos

    session = InferenceSession("zoo:lstm-gesture")
    graph = bind_batch(session.graph, {"N": batch})
    node = next(n for n in graph.nodes if n.op_type == "LSTM")
    kernel = CPUDevice().kernels.lookup(node, input_infos(graph, node))
    assert layer_key(node, kernel, graph) == key
    raw = dict((n.name, c) for n, c in node_costs(graph))[node.name]
    cost = kernel_cost(node, raw, key, graph)
    # Up to four columns the recurrent product is a GEMV per column: one-column products, batch x steps.
    assert cost.gemm.m == columns and cost.gemm.count * cost.gemm.m == raw.gemm.count * raw.gemm.m


@pytest.mark.parametrize(("batch", "spinning"), [(1, True), (8, False), (16, True), (64, True)])
def test_an_lstm_batch_a_run_spins_for_has_a_spin_key(quick_profile, batch, spinning):
    """One column, and from ``jit_lstm.SPIN_MIN_BATCH`` columns, a 2-thread run spins for its LSTM
    (``spins_recurrent``): the estimate knows (``spin_run``) and prices the LSTM from the ``@spin``
    probes (one column's from its own, ``LSTM/vector@spin``)."""
    from hetflow.estimate.predict import SPIN_MARK, spin_run

    session = InferenceSession("zoo:lstm-gesture")
    plan = session.plan_for(batch_bindings(session.graph, batch))
    assert spin_run(quick_profile, plan, batch, 2) is spinning
    assert spin_run(quick_profile, plan, batch, 1) is False
    lstm_keys = [key for key in _keys(session, quick_profile, batch) if key.startswith("LSTM/")]
    spin_key = ("LSTM/vector" if batch == 1 else "LSTM/default") + SPIN_MARK
    assert lstm_keys == ([spin_key] if spinning and quick_profile.threads > 1 else lstm_keys)
    if spinning and quick_profile.threads > 1:
        assert spin_key in quick_profile.ops


def test_a_folded_residual_costs_an_add_and_a_read_on_the_add_model(quick_profile):
    """The Conv's models are fitted on Convs without a residual: the folded one adds, on the Add model,
    one add per element and one tensor read, less than the whole Add it replaced."""
    from hetflow.estimate.predict import predict_seconds, residual_seconds
    from hetflow.ops.base import Cost
    from tests.passes.test_fuse_residual import residual_block

    folded = InferenceSession(residual_block(activation=False))
    unfolded = InferenceSession(residual_block(activation=False), optimize=False)
    [conv] = folded.graph.nodes
    assert conv.attrs.residual
    graph = bind_batch(folded.graph, {"N": 2})
    elements = int(np.prod(graph.values[conv.outputs[0]].shape))
    expected = predict_seconds(quick_profile, "Add/default", Cost(flops=elements, bytes_read=4 * elements))
    assert residual_seconds(conv, graph, quick_profile) == pytest.approx(expected) and expected > 0
    [layer] = estimate(folded, quick_profile, 2).layers
    conv_alone, add = (la.predicted_ms for la in estimate(unfolded, quick_profile, 2).layers)
    assert layer.predicted_ms == pytest.approx(conv_alone + expected * 1e3, rel=0.05)  # its cost reads R too
    assert layer.predicted_ms < conv_alone + add


def _conv_graph(kernels: int, channels: int, kernel: int, batch: int, side: int, stride: int = 1):
    """A one-layer graph: a ``kernel`` x ``kernel`` Conv of ``channels`` -> ``kernels`` over a ``side`` x
    ``side`` map at ``stride``, padded by ``kernel // 2``, zero weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from hetflow.frontends import load_model

    w = numpy_helper.from_array(np.zeros((kernels, channels, kernel, kernel), np.float32), "w")
    out = (side + 2 * (kernel // 2) - kernel) // stride + 1
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                            pads=[kernel // 2] * 4)  # fmt: skip
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, channels, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, kernels, out, out])], initializer=[w],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return load_model(model)


@pytest.mark.parametrize(("channels", "side"), [(64, 28), (512, 14), (512, 7)])
def test_pointwise_layers_on_the_own_gemm_have_a_key_of_their_own(channels, side):
    """In a run on its own threads, a pointwise Conv hetflow's own GEMM takes (``kernels.own_gemm``: every
    float32 one) is keyed ``@own`` (its epilogue is in its product); beside BLAS's threads, not."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import OWN_GEMM_MARK, key_algorithm, layer_key
    from hetflow.runtime.planner import input_infos

    graph = _conv_graph(32, channels, 1, 4, side)
    node = graph.nodes[0]
    kernel = CPUDevice().kernels.lookup(node, input_infos(graph, node))
    split_key = layer_key(node, kernel, graph, split=True)
    assert split_key == "Conv/pointwise" + OWN_GEMM_MARK
    assert layer_key(node, kernel, graph, spinning=True) == split_key
    assert layer_key(node, kernel, graph) == "Conv/pointwise"
    assert key_algorithm(split_key) == "pointwise"


def test_a_batch_on_the_dense_kernel_is_keyed_by_whether_the_run_spins():
    """A fully connected layer at batch 16 runs on the dense kernel: a spinning run shares its columns out
    at any size (``@own-spin``); elsewhere LeNet's 800 -> 500 runs on one thread (``@own``)."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import DENSE_SPIN_MARK, OWN_GEMM_MARK, layer_key
    from hetflow.estimate.probes import fully_connected
    from hetflow.frontends import load_model
    from hetflow.passes.manager import optimize
    from hetflow.runtime.planner import input_infos

    graph = optimize(load_model(fully_connected(16, 800, 500, relu=True)()))
    node = graph.nodes[0]
    kernel = CPUDevice().kernels.lookup(node, input_infos(graph, node))
    assert layer_key(node, kernel, graph, spinning=True) == "Gemm/default" + DENSE_SPIN_MARK
    assert layer_key(node, kernel, graph) == "Gemm/default" + OWN_GEMM_MARK
    assert layer_key(node, kernel, graph, split=True) == "Gemm/default" + OWN_GEMM_MARK


@pytest.mark.parametrize(("kernels", "channels", "kernel", "batch", "mark"), [
    (32, 3, 3, 1, "@own"),  # MobileNet v2's first layer: in bands
    (32, 3, 3, 2, "@spin-batch"),  # a batch: im2col split, a batch's key
    (32, 64, 3, 1, "@columns"),  # 576 column rows: past own_gemm.MAX_DEPTH, whole columns (590 KB)
    (32, 256, 5, 1, "@columns"),  # 6.5 MB of columns, whole
    (32, 700, 5, 1, "@spin"),  # 17.9 MB of columns: past own_gemm.COLUMNS_MAX_BYTES, on BLAS
])  # fmt: skip
def test_one_images_im2col_on_the_tiles_has_a_key_of_its_own(kernels, channels, kernel, batch, mark) -> None:  # noqa: ANN001
    """A spinning run multiplies one image's im2col Conv on the tile GEMM, in bands (keyed ``@own``) or as
    whole columns (``@columns``); any other im2col it splits (``@spin``, a batch's ``@spin-batch``); plain
    elsewhere."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import key_algorithm, layer_key
    from hetflow.ops.conv import IM2COL
    from hetflow.runtime.planner import input_infos

    graph = _conv_graph(kernels, channels, kernel, batch, 32, stride=2)
    conv = graph.nodes[0]
    kernel_ = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == IM2COL)
    assert kernel_.reason_unsupported(conv, input_infos(graph, conv)) is None
    assert layer_key(conv, kernel_, graph, spinning=True) == "Conv/im2col" + mark
    assert key_algorithm("Conv/im2col" + mark) == IM2COL
    assert layer_key(conv, kernel_, graph) == "Conv/im2col"


def test_batch_1_conv_probes_are_timed_spinning_as_batch_1_runs_are() -> None:
    """Every batch-1 run of a convolutional network spins (``executor.spins``): its Conv probes are timed
    so, BLAS held at one thread for a large network's layers; batches keep BLAS's threads or split, but
    the small networks' direct Convs at batch 16, which spin as their runs do (``SPIN_BATCH_CONVS``)."""
    from hetflow.estimate import probes

    catalogue = probes.catalogue()
    convs = [p for p in catalogue if p.name.startswith("conv ")]
    spinning_batches = {probes._conv_label(args, kwargs) + " spin" for args, kwargs, _ in probes.SPIN_BATCH_CONVS}
    assert len(spinning_batches) == len(probes.SPIN_BATCH_CONVS) > 0
    for probe in convs:
        batched = "batch=" in probe.name
        assert probe.spin is ((not batched and not probe.split) or probe.name in spinning_batches), probe.name
        assert not (probe.hold_blas and not probe.spin), probe.name
    by_name = {p.name: p for p in convs}
    assert by_name["conv 64x56x56 -> 64 k3 spin"].hold_blas  # 115 M multiply-adds: a large network's
    assert not by_name["conv 1x28x28 -> 20 k5 s1 spin"].hold_blas  # LeNet's first layer
    assert any(p.quick and p.spin for p in convs)  # the quick calibration spins too


def test_a_calibration_builds_each_probe_model_once() -> None:
    from hetflow.estimate import calibrate, probes

    builds = []
    probe = probes.Probe("counted", lambda: builds.append(1) or len(builds))
    once = calibrate._built_once(probe)
    assert [once.build(), once.build(), once.build()] == [1, 1, 1]
    assert len(builds) == 1 and once.name == "counted"


@pytest.mark.parametrize(("kernel", "side", "algorithm"), [
    (3, 32, "winograd_f43"),  # a batch's Winograd products on the tile GEMM
    (5, 16, "im2col"),  # a batch's im2col in bands or its columns on the tile GEMM
])  # fmt: skip
def test_a_batchs_im2col_and_winograd_on_own_threads_have_a_tiles_key(kernel, side, algorithm) -> None:
    """A run on its own threads multiplies im2col's and Winograd's products on the tile GEMM (``@tiles``),
    a spinning run or one beside BLAS's threads does not; ``key_algorithm`` reads through the mark."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import TILES_MARK, key_algorithm, layer_key
    from hetflow.runtime.planner import input_infos

    graph = _conv_graph(64, 64, kernel, 4, side)
    conv = graph.nodes[0]
    chosen = next(k for k in CPUDevice().kernels.kernels["Conv"] if k.algorithm == algorithm)
    assert chosen.reason_unsupported(conv, input_infos(graph, conv)) is None
    key = layer_key(conv, chosen, graph, split=True)
    assert key == f"Conv/{algorithm}{TILES_MARK}" and key_algorithm(key) == algorithm
    assert layer_key(conv, chosen, graph) == f"Conv/{algorithm}"
    assert not layer_key(conv, chosen, graph, spinning=True).endswith(TILES_MARK)


@pytest.mark.parametrize(("op_type", "kernel", "stride", "pad", "key"), [
    ("MaxPool", 3, 2, 0, "MaxPool/default"),  # overlapping windows
    ("MaxPool", 2, 2, 0, "MaxPool/tiles"),  # windows that tile X
    ("AveragePool", 3, 1, 0, "AveragePool/default"),
    ("MaxPool", 3, 1, 1, "MaxPool/same"),  # 3x3/1 padded by one: separable passes (jit_pool_same)
    ("AveragePool", 3, 1, 1, "AveragePool/same"),
])  # fmt: skip
def test_a_pool_in_a_run_on_its_own_threads_has_a_threads_key(op_type, kernel, stride, pad, key) -> None:
    """A run on its own threads shares a pool's planes out over them from far fewer outputs than a run
    beside BLAS's threads does (``@threads``); a spinning run has ``@spin``; the per-plane loop count
    applies whatever the mark."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import THREADS_MARK, kernel_cost, key_algorithm, layer_key, unmarked
    from hetflow.estimate.probes import pool
    from hetflow.frontends import load_model
    from hetflow.ops.cost import node_costs
    from hetflow.runtime.planner import input_infos

    graph = load_model(pool(op_type, 16, 112, kernel, stride, pad, batch=4)())
    node = graph.nodes[0]
    chosen = CPUDevice().kernels.lookup(node, input_infos(graph, node))
    marked = layer_key(node, chosen, graph, split=True)
    assert marked == key + THREADS_MARK and unmarked(marked) == key
    assert key_algorithm(marked) == key.split("/")[1]
    assert layer_key(node, chosen, graph) == key
    assert not layer_key(node, chosen, graph, spinning=True, split=True).endswith(THREADS_MARK)
    cost = next(cost for _, cost in node_costs(graph))
    assert kernel_cost(node, cost, marked, graph).loops == 4 * 16


@pytest.mark.parametrize(("batch", "mark"), [(1, "@spin"), (4, "@spin-batch")])
def test_a_tiling_max_pool_in_a_spinning_run_has_a_spin_key_that_probes_time(batch, mark) -> None:
    """A spinning run shares a tiling max pool's planes out (``jit_pool.pool_job``): its key is marked, and
    the catalogue has spinning probes of that key (left unmarked, VGG-19's pools at batch 16 were priced
    from one-thread probes at 2-3.4x their time)."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.calibrate import Terms
    from hetflow.estimate.predict import layer_key
    from hetflow.estimate.probes import catalogue, pool
    from hetflow.frontends import load_model
    from hetflow.runtime.planner import input_infos

    device = CPUDevice()

    def spinning_key(model) -> str:  # noqa: ANN001
        graph = load_model(model)
        node = graph.nodes[0]
        return layer_key(node, device.kernels.lookup(node, input_infos(graph, node)), graph, spinning=True)

    assert spinning_key(pool("MaxPool", 64, 112, 2, 2, batch=batch)()) == "MaxPool/tiles" + mark
    spins = Terms(None, None, None, 2).batch_spins  # type: ignore[arg-type]
    # Only the pool probes are built: the catalogue's classifier probes draw hundreds of MB of weights.
    timed = [p for p in catalogue() if p.name.startswith("maxpool") and (p.spin or (p.split and spins(p)))]
    assert any(spinning_key(p.build()) == "MaxPool/tiles" + mark for p in timed)


def test_a_run_replayed_whole_pays_what_it_adds_around_its_jobs(quick_profile):
    """A spinning run that calls no step from Python is one compiled call (``replay.DirectReplay``): the
    estimate adds what such a run adds around its jobs, less the Python call each layer timed alone paid;
    a run the executor walks pays its per-step dispatch and per-run cost, less that call for each step
    it replays from compiled code."""
    from hetflow.estimate.predict import run_overhead_ms

    profile = dataclasses.replace(quick_profile, dispatch_s=5e-6, run_overhead_s=2e-5, replayed_step_s=1e-6,
                                  direct_run_s=6e-6, direct_run_bytes=0)  # fmt: skip
    assert run_overhead_ms(profile, 0, direct=True) == pytest.approx(0.006)
    assert run_overhead_ms(profile, 0, direct=True, replayed=8) == pytest.approx(-0.002)
    assert run_overhead_ms(profile, 0, direct=False) == pytest.approx(0.02)
    assert run_overhead_ms(profile, 3, direct=False) == pytest.approx(0.035)
    assert run_overhead_ms(profile, 3, direct=False, replayed=5) == pytest.approx(0.030)
    old = dataclasses.replace(profile, replayed_step_s=0.0, direct_run_s=0.0)  # a profile from before
    assert run_overhead_ms(old, 0, direct=True, replayed=8) == 0.0
    if not jit_gemm.available():
        return  # no spinning runs: nothing below is replayed
    replayed = estimate(InferenceSession("zoo:lenet", threads=2), profile, 1)
    walked = estimate(InferenceSession("zoo:lenet", threads=1), profile, 1)
    steps = len(InferenceSession("zoo:lenet").plan.steps)
    assert replayed.overhead_ms == pytest.approx(0.006 - steps * 0.001)
    assert walked.overhead_ms >= 0.02 - steps * 0.001
    # ... and allocates its outputs' Python objects beside the arena, which a walked run's peak does not take.
    objects = dataclasses.replace(profile, direct_run_bytes=800)
    assert estimate(InferenceSession("zoo:lenet", threads=2), objects, 1).memory.peak_bytes == (
        replayed.memory.peak_bytes + 800)
    assert estimate(InferenceSession("zoo:lenet", threads=1), objects, 1).memory.peak_bytes == walked.memory.peak_bytes


def test_one_column_of_a_spinning_lstm_is_priced_a_call_a_step_outside_blas():
    """One column's steps on the spinning pool run compiled loops over packed W and R, not BLAS's GEMV:
    the cost keeps the multiply-adds but no GEMM, and a call for every step."""
    from hetflow.devices.cpu import CPUDevice
    from hetflow.estimate.predict import SPIN_MARK, kernel_cost
    from hetflow.ops.cost import node_costs
    from hetflow.runtime.planner import input_infos

    session = InferenceSession("zoo:lstm-gesture")
    graph = bind_batch(session.graph, {"N": 1})
    node = next(n for n in graph.nodes if n.op_type == "LSTM")
    raw = dict((n.name, c) for n, c in node_costs(graph))[node.name]
    assert CPUDevice().kernels.lookup(node, input_infos(graph, node)) is not None
    cost = kernel_cost(node, raw, "LSTM/vector" + SPIN_MARK, graph)
    assert cost.gemm is None
    assert cost.loops == raw.gemm.count == 100
    assert cost.macs == raw.macs
