"""Values stay on the OpenCL device between OpenCL nodes (issue #4).

The device is put on its copy path (``unified_memory = False``: what a discrete GPU does, on PoCL's
host-unified CPU device), so every crossing is a counted copy: a run must copy exactly its inputs in
and its outputs out, plus, with a mixed placement, each value that crosses devices once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices.opencl import DeviceArray, OpenCLDevice
from hetflow.devices.opencl.kernels.conv import DIRECT
from hetflow.devices.opencl.kernels.elementwise import run_binary
from hetflow.devices.registry import get_device
from hetflow.ops.conv import DEPTHWISE, IM2COL
from hetflow.options import OPENCL_UNIFIED_ENV
from hetflow.runtime.placement import TransferCost, best_single_device, crossing_seconds
from hetflow.runtime.planner import make_plan
from hetflow.runtime.profiler import Profiler
from tests.devices.opencl_helpers import infos, make_node
from tests.helpers import make_model

BATCH = 2
#: Bytes of the chain's values (float32): the input, Relu's output, MaxPool's output, the result.
X_BYTES = BATCH * 3 * 12 * 12 * 4
RELU_BYTES = BATCH * 4 * 12 * 12 * 4
POOL_BYTES = BATCH * 4 * 6 * 6 * 4
Y_BYTES = BATCH * 5 * 4


@pytest.fixture
def copying(opencl: OpenCLDevice) -> Iterator[OpenCLDevice]:
    """opencl:0 on the copy path for one test."""
    previous = opencl.unified_memory
    opencl.unified_memory = False
    yield opencl
    opencl.unified_memory = previous


def chain_model() -> object:
    """Conv -> Relu -> MaxPool -> Conv -> Flatten -> Gemm on x [N, 3, 12, 12] (y [N, 5])."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.standard_normal((4, 3, 3, 3)).astype(np.float32),
        "b1": rng.standard_normal(4).astype(np.float32),
        "w2": rng.standard_normal((6, 4, 3, 3)).astype(np.float32),
        "b2": rng.standard_normal(6).astype(np.float32),
        "w3": rng.standard_normal((5, 96)).astype(np.float32),
        "b3": rng.standard_normal(5).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2"),
        helper.make_node("Flatten", ["c2"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    return make_model(
        nodes, [("x", TensorProto.FLOAT, ["N", 3, 12, 12])], [("y", TensorProto.FLOAT, ["N", 5])], weights
    )


def _input() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((BATCH, 3, 12, 12)).astype(np.float32)


def _copied(device: OpenCLDevice, session: hetflow.InferenceSession, feeds: dict) -> tuple[int, int, list]:
    """(bytes copied in, bytes copied out, outputs) of one run after a warm-up run (weights resident)."""
    session.run(None, feeds)
    before = (device.transfers.copied_in, device.transfers.copied_out)
    outputs = session.run(None, feeds)
    return device.transfers.copied_in - before[0], device.transfers.copied_out - before[1], outputs


def _assert_close(got: list, expected: list, rtol: float = 1e-4) -> None:
    for a, b in zip(got, expected):
        assert isinstance(a, np.ndarray) and a.shape == b.shape
        assert float(np.abs(a - b).max()) <= rtol * float(np.abs(b).max())


def test_a_chain_on_the_device_copies_only_its_input_and_output(copying):
    session = hetflow.InferenceSession(chain_model(), device="opencl:0", optimize=False)
    assert set(session.placement(BATCH).values()) == {"opencl:0"}
    copied_in, copied_out, got = _copied(copying, session, {"x": _input()})
    assert (copied_in, copied_out) == (X_BYTES, Y_BYTES)
    expected = hetflow.InferenceSession(chain_model(), device="cpu").run(None, {"x": _input()})
    _assert_close(got, expected)


def test_a_1d_conv_uploads_its_weights_once(copying):
    # NOTE: a 1-D Conv runs as a 2-D one on a view of W: the view is new on every run, W is not.
    rng = np.random.default_rng(2)
    weights = {"w": rng.standard_normal((4, 3, 5)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    model = make_model(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv1d", pads=[2, 2])],
        [("x", TensorProto.FLOAT, ["N", 3, 16])],
        [("y", TensorProto.FLOAT, ["N", 4, 16])],
        weights,
    )
    session = hetflow.InferenceSession(model, device="opencl:0")
    assert session.placement(BATCH) == {"conv1d": "opencl:0"}
    feeds = {"x": rng.standard_normal((BATCH, 3, 16)).astype(np.float32)}
    copied_in, copied_out, got = _copied(copying, session, feeds)
    assert (copied_in, copied_out) == (BATCH * 3 * 16 * 4, BATCH * 4 * 16 * 4)
    expected = hetflow.InferenceSession(model, device="cpu").run(None, feeds)
    _assert_close(got, expected)



@pytest.mark.parametrize("algorithm, group", [(IM2COL, 1), (DIRECT, 1), (DEPTHWISE, 4)])
def test_each_1d_conv_algorithm_keeps_its_weights_resident(copying, algorithm, group):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((BATCH, 4, 12)).astype(np.float32)
    w = rng.standard_normal((4, 4 // group, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    w.flags.writeable = b.flags.writeable = False  # as a graph's initializers are
    node = make_node("Conv", [x, w, b], pads=(1, 1), group=group)
    [kernel] = [k for k in copying.kernels.candidates(node, infos([x, w, b])) if k.algorithm == algorithm]
    kernel.fn(node, [x, w, b])
    before = (copying.transfers.copied_in, copying.transfers.copied_out)
    [y] = kernel.fn(node, [x, w, b])
    copied = (copying.transfers.copied_in - before[0], copying.transfers.copied_out - before[1])
    assert copied == (x.nbytes, y.nbytes)

def test_a_mixed_placement_copies_each_crossing_once(copying):
    session = hetflow.InferenceSession(
        chain_model(), device="opencl:0", optimize=False, placement={"MaxPool": "cpu"}
    )
    assert session.placement(BATCH)["pool1"] == "cpu" and session.placement(BATCH)["conv2"] == "opencl:0"
    copied_in, copied_out, got = _copied(copying, session, {"x": _input()})
    # Relu's output goes to the host for the CPU MaxPool; MaxPool's output comes back for conv2.
    assert (copied_in, copied_out) == (X_BYTES + POOL_BYTES, RELU_BYTES + Y_BYTES)
    expected = hetflow.InferenceSession(chain_model(), device="cpu").run(None, {"x": _input()})
    _assert_close(got, expected)


def test_the_profile_charges_each_crossing_to_the_node_that_needs_it(copying):
    session = hetflow.InferenceSession(
        chain_model(), device="opencl:0", optimize=False, placement={"MaxPool": "cpu"}
    )
    feeds = {"x": _input()}
    session.run(None, feeds)
    profiler = Profiler(devices=session.devices)
    session.run(None, feeds, observer=profiler.observe)
    copied = {name: record.copied_bytes for name, record in profiler.nodes.items()}
    assert copied == {
        "conv1": X_BYTES, "relu1": 0, "pool1": RELU_BYTES, "conv2": POOL_BYTES, "flatten": 0, "fc": Y_BYTES,
    }  # fmt: skip
    assert {r.mapped_bytes for r in profiler.nodes.values()} == {0}


def test_unified_memory_maps_the_same_crossings_and_copies_nothing(opencl):
    if not opencl.unified_memory:
        pytest.skip("this OpenCL device does not share host memory")
    session = hetflow.InferenceSession(
        chain_model(), device="opencl:0", optimize=False, placement={"MaxPool": "cpu"}
    )
    feeds = {"x": _input()}
    session.run(None, feeds)
    before = (opencl.transfers.copied, opencl.transfers.mapped)
    got = session.run(None, feeds)
    assert opencl.transfers.copied == before[0]
    assert opencl.transfers.mapped - before[1] == X_BYTES + POOL_BYTES + RELU_BYTES + Y_BYTES
    expected = hetflow.InferenceSession(chain_model(), device="cpu").run(None, feeds)
    _assert_close(got, expected)


def test_steady_runs_reuse_the_pooled_buffers(copying):
    session = hetflow.InferenceSession(chain_model(), device="opencl:0", optimize=False)
    feeds = {"x": _input()}
    session.run(None, feeds)
    free = copying.pool.free_bytes
    for _ in range(3):
        session.run(None, feeds)
    assert copying.pool.free_bytes == free > 0


@pytest.mark.parametrize("mode", ["sequential", "parallel"])
def test_a_zoo_model_on_the_copy_path_matches_the_cpu(copying, zoo_home, mode):
    session = hetflow.InferenceSession("zoo:squeezenet", device="opencl:0", execution_mode=mode, threads=2)
    cpu = hetflow.InferenceSession("zoo:squeezenet", device="cpu")
    feed = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal([1, *feed.shape[1:]]).astype(np.float32)
    copied_in, copied_out, got = _copied(copying, session, {feed.name: x})
    assert copied_in == x.nbytes and copied_out == sum(a.nbytes for a in got)
    _assert_close(got, cpu.run(None, {feed.name: x}))


def test_a_recurrent_zoo_model_keeps_its_states_on_the_device(copying, zoo_home):
    session = hetflow.InferenceSession("zoo:lstm-gesture", device="opencl:0")
    cpu = hetflow.InferenceSession("zoo:lstm-gesture", device="cpu")
    feed = session.get_inputs()[0]
    x = np.random.default_rng(0).standard_normal([2, *feed.shape[1:]]).astype(np.float32)
    copied_in, copied_out, got = _copied(copying, session, {feed.name: x})
    assert copied_in == x.nbytes and copied_out == sum(a.nbytes for a in got)
    _assert_close(got, cpu.run(None, {feed.name: x}))


def test_launchers_return_what_they_were_given(opencl):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, np.float32)
    host = run_binary(opencl, "Add", a, b)
    assert isinstance(host, np.ndarray)
    on_device = run_binary(opencl, "Add", opencl.to_device(a), b)
    assert isinstance(on_device, DeviceArray) and on_device.shape == (2, 3)
    np.testing.assert_array_equal(opencl.to_host(on_device), host)
    np.testing.assert_array_equal(host, a + b)


def test_the_environment_forces_the_copy_path(opencl, monkeypatch):
    monkeypatch.setenv(OPENCL_UNIFIED_ENV, "0")
    assert OpenCLDevice(0).unified_memory is False
    assert OpenCLDevice(0, unified=False).unified_memory is False


def _bound_graph() -> object:
    session = hetflow.InferenceSession(chain_model(), device="cpu", optimize=False)
    return session.plan_for({"N": BATCH}).graph


def test_the_placement_cost_counts_the_crossings_the_executor_copies(copying):
    # One second per byte, no latency: the model's seconds are the bytes it expects to move.
    per_byte = {"opencl:0": TransferCost(0.0, 1.0, 1.0)}
    session = hetflow.InferenceSession(
        chain_model(), device="opencl:0", optimize=False, placement={"MaxPool": "cpu"}
    )
    placement = session.placement(BATCH)
    predicted = crossing_seconds(_bound_graph(), placement, per_byte)
    copied_in, copied_out, _ = _copied(copying, session, {"x": _input()})
    # The executor also copies the input in and the result out; the model leaves those to node times.
    assert predicted == copied_in + copied_out - X_BYTES - Y_BYTES == RELU_BYTES + POOL_BYTES
    alone = {name: "opencl:0" for name in placement}
    assert crossing_seconds(_bound_graph(), alone, per_byte) == 0.0


def test_a_node_leaves_its_inputs_device_only_when_it_gains_more_than_the_crossings(opencl):
    graph = _bound_graph()
    cpu = get_device("cpu")
    costs = {node.name: {"opencl:0": 1.0, "cpu": 2.0} for node in graph.nodes}
    costs["pool1"] = {"opencl:0": 1.0, "cpu": 0.5}  # the CPU is twice as fast on the pool alone
    cheap = {"opencl:0": TransferCost(0.0, 1e-9, 1e-9)}
    dear = {"opencl:0": TransferCost(0.0, 1e-4, 1e-4)}
    assert make_plan(graph, [opencl, cpu], costs=costs, transfers=cheap).placement()["pool1"] == "cpu"
    assert make_plan(graph, [opencl, cpu], costs=costs, transfers=dear).placement()["pool1"] == "opencl:0"
    # The whole-graph gate agrees: with dear crossings the mix is not worth it.
    assert best_single_device(graph, [opencl, cpu], costs, dear) is opencl
    assert best_single_device(graph, [opencl, cpu], costs, cheap) is opencl  # 0.5 s of 6: under 10%
