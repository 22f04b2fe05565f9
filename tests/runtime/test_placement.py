"""Placement: rules by node and op type, host-side shape ops, measured costs, the CPU as fallback."""

from __future__ import annotations

import platform
import time

import numpy as np
import pytest
from onnx import TensorProto, helper

import hetflow
from hetflow.devices.base import Device, KernelTable
from hetflow.devices.cpu import CPUDevice
from hetflow.errors import UnsupportedOpsError
from hetflow.frontends import load_model
from hetflow.passes import bind_batch
from hetflow.runtime import session as session_module
from hetflow.runtime.placement import (
    MIN_GAIN,
    MIN_MIX_GAIN,
    PlacementRules,
    best_single_device,
    cheapest,
    measure_costs,
)
from hetflow.runtime.planner import make_plan
from hetflow.runtime.session import MIXED
from tests.helpers import make_model


class FakeAccelerator(Device):
    """A device with the CPU's kernels for a few ops; ``slow_ops`` sleep first, so measurement sees them
    slower than on the CPU."""

    kind = "fake"

    def __init__(self, ops: tuple[str, ...], slow_ops: tuple[str, ...] = (), device_id: str = "fake:0"):
        self.id = device_id
        self.kernels = KernelTable()
        cpu = CPUDevice().kernels
        for op_type in ops:
            for kernel in cpu.kernels[op_type]:
                self.kernels.register(op_type, algorithm=kernel.algorithm, supports=kernel.supports)(
                    _slowed(kernel.fn) if op_type in slow_ops else kernel.fn
                )

    def name(self) -> str:
        return "fake accelerator"

    def fingerprint(self) -> dict[str, str]:
        return {"kind": "fake", "machine": platform.machine()}


def _slowed(fn):
    def slow(node, inputs):
        time.sleep(0.003)
        return fn(node, inputs)

    return slow


def _mlp():
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
        helper.make_node("Relu", ["h"], ["r"], name="act"),
        helper.make_node("Flatten", ["r"], ["y"], name="flat"),
        helper.make_node("Softmax", ["y"], ["p"], name="probs", axis=-1),
        # A Shape the loader cannot fold away: its value is an output the user asked for.
        helper.make_node("Shape", ["x"], ["s"], name="shape_of"),
    ]
    weights = {"w": rng.standard_normal((7, 5)).astype(np.float32)}
    outputs = [("p", TensorProto.FLOAT, ["N", 5]), ("s", TensorProto.INT64, [2])]
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 7])], outputs, weights)


def _graph():
    return bind_batch(load_model(_mlp()), {"N": 3})


def test_first_device_with_a_kernel_wins_and_the_cpu_takes_the_rest():
    fake = FakeAccelerator(("MatMul", "Relu", "Flatten", "Shape"))
    plan = make_plan(_graph(), [fake, CPUDevice()])
    placement = plan.placement()
    assert placement["fc"] == placement["act"] == placement["flat"] == "fake:0"
    assert placement["probs"] == "cpu"  # the fake device has no Softmax


def test_shape_arithmetic_stays_on_the_cpu_unless_pinned():
    fake = FakeAccelerator(("MatMul", "Relu", "Flatten", "Shape"))
    graph = _graph()
    assert make_plan(graph, [fake, CPUDevice()]).placement()["shape_of"] == "cpu"
    rules = PlacementRules.parse({"shape_of": "fake:0"}, graph)
    assert make_plan(graph, [fake, CPUDevice()], rules=rules).placement()["shape_of"] == "fake:0"


def test_node_rule_wins_over_op_type_rule():
    fake = FakeAccelerator(("MatMul", "Relu"))
    graph = _graph()
    rules = PlacementRules.parse({"MatMul": "cpu", "Relu": "cpu", "act": "fake:0"}, graph)
    placement = make_plan(graph, [fake, CPUDevice()], rules=rules).placement()
    assert placement["fc"] == "cpu" and placement["act"] == "fake:0"


def test_pinning_to_a_device_without_the_kernel_is_one_clear_error():
    fake = FakeAccelerator(("MatMul",))
    graph = _graph()
    rules = PlacementRules.parse({"Softmax": "fake:0", "act": "fake:0"}, graph)
    with pytest.raises(UnsupportedOpsError) as caught:
        make_plan(graph, [fake, CPUDevice()], rules=rules)
    message = str(caught.value)
    assert "probs" in message and "act" in message and "placement rule" in message


def test_unknown_placement_keys_are_rejected_with_what_exists():
    with pytest.raises(ValueError, match="conv9"):
        PlacementRules.parse({"conv9": "cpu"}, _graph())
    with pytest.raises(ValueError, match="device id"):
        PlacementRules.parse({"fc": 0}, _graph())


def test_measured_costs_move_a_node_to_the_faster_device():
    fake = FakeAccelerator(("MatMul", "Relu"), slow_ops=("Relu",))
    graph = _graph()
    devices = [fake, CPUDevice()]
    costs = measure_costs(graph, devices, rounds=2)
    assert costs["act"]["fake:0"] > costs["act"]["cpu"] + 0.002
    assert set(costs["probs"]) == {"cpu"}  # only the CPU has Softmax: measured there in both runs
    placement = make_plan(graph, devices, costs=costs).placement()
    assert placement["act"] == "cpu"


def test_a_gain_within_the_noise_keeps_the_priority_order():
    fake = FakeAccelerator(("MatMul",))
    devices = [fake, CPUDevice()]
    node = next(n for n in _graph().nodes if n.name == "fc")
    assert cheapest(node, devices, {"fc": {"fake:0": 1.0, "cpu": 1.0 - MIN_GAIN / 2}}) is fake
    assert cheapest(node, devices, {"fc": {"fake:0": 1.0, "cpu": 1.0 - 2 * MIN_GAIN}}).id == "cpu"
    assert cheapest(node, devices, {"other": {"cpu": 0.1}}) is fake  # not measured: priority order


def test_a_mix_must_beat_the_best_single_device_clearly():
    fake = FakeAccelerator(("MatMul", "Relu"))
    cpu = CPUDevice()
    graph = _graph()
    nodes = [n.name for n in graph.nodes]
    # The fake device is a little faster on two nodes; a mix would save less than MIN_MIX_GAIN.
    costs = {name: {"cpu": 1.0} for name in nodes}
    costs["fc"]["fake:0"] = 0.98
    costs["act"]["fake:0"] = 0.98
    assert best_single_device(graph, [fake, cpu], costs) is fake  # its total (CPU for the rest) is lowest
    costs["fc"]["fake:0"] = 1.5  # now the fake device alone is slower than the CPU alone
    assert best_single_device(graph, [fake, cpu], costs) is cpu
    costs["fc"]["fake:0"] = 0.1
    costs["act"]["fake:0"] = 1.5  # only a mix gets fc's large gain without act's loss
    assert 4.1 < (0.1 + 1.5 + 3.0) * (1 - MIN_MIX_GAIN)  # the mix beats the fake device alone clearly
    assert best_single_device(graph, [fake, cpu], costs) is None


def test_session_rules_by_op_type_run_and_match(monkeypatch):
    x = np.random.default_rng(4).standard_normal((3, 7)).astype(np.float32)
    [expected, _] = hetflow.InferenceSession(_mlp()).run(None, {"x": x})
    session = hetflow.InferenceSession(_mlp(), placement={"Softmax": "cpu", "fc": "cpu"})
    assert set(session.placement().values()) == {"cpu"}
    [got, _] = session.run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="neither a node"):
        hetflow.InferenceSession(_mlp(), placement={"NoSuchOp": "cpu"})


def test_kernels_are_asked_with_the_dtypes_while_the_batch_is_symbolic():
    def float32_only(node, inputs):
        if inputs is not None and any(i is not None and i.dtype != np.float32 for i in inputs):
            return "float32 only"
        return None

    fake = FakeAccelerator(())
    fake.kernels.register("MatMul", "Relu", supports=float32_only)(CPUDevice().kernels.kernels["Relu"][0].fn)
    model = make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"), helper.make_node("Relu", ["h"], ["y"], name="act")],
        [("x", TensorProto.DOUBLE, ["N", 7])],
        [("y", TensorProto.DOUBLE, ["N", 5])],
        {"w": np.ones((7, 5))},
    )
    graph = load_model(model)  # the batch stays symbolic
    assert make_plan(graph, [fake, CPUDevice()]).placement() == {"fc": "cpu", "act": "cpu"}


def _auto_session(monkeypatch, devices, seconds=None, model=None):
    """A ``device="auto"`` session over ``devices`` (instead of the machine's); with ``seconds``
    (candidate -> whole-run seconds) the timing of candidates is replaced by those numbers."""
    monkeypatch.setattr(session_module, "resolve_devices", lambda device: list(devices))
    if seconds is not None:
        monkeypatch.setattr(session_module, "time_plans", lambda plans, feeds, threads=None: {
            label: seconds[label] for label in plans})  # fmt: skip
    return hetflow.InferenceSession(model or _mlp(), device="auto")


def test_auto_times_whole_runs_and_keeps_the_fastest_device(monkeypatch):
    fake = FakeAccelerator(("MatMul", "Relu", "Flatten"), slow_ops=("Relu",))
    session = _auto_session(monkeypatch, [fake, CPUDevice()])
    x = np.random.default_rng(7).standard_normal((3, 7)).astype(np.float32)
    [got, _] = session.run(None, {"x": x})
    timed = session.placement_seconds(batch=3)
    assert {"fake:0", "cpu"} <= set(timed) and timed["fake:0"] > timed["cpu"] + 0.002  # Relu sleeps 3 ms
    assert set(session.placement(batch=3).values()) == {"cpu"}
    [expected, _] = hetflow.InferenceSession(_mlp()).run(None, {"x": x})
    np.testing.assert_array_equal(got, expected)
    assert hetflow.InferenceSession(_mlp()).placement_seconds(batch=3) == {}  # a named device times nothing


def test_auto_trusts_whole_runs_over_per_node_sums(monkeypatch):
    """Per-node sums may promise a mix that whole runs do not deliver (each crossing waits for a queue):
    the mix is kept only when its whole runs beat the best single device by more than MIN_GAIN."""
    monkeypatch.setattr(session_module, "best_single_device", lambda *args: None)  # the sums favour a mix
    fake = FakeAccelerator(("MatMul", "Relu", "Flatten"))
    near = {"fake:0": 1.0, "cpu": 0.9, MIXED: 0.9 * (1 - MIN_GAIN / 2)}
    session = _auto_session(monkeypatch, [fake, CPUDevice()], near, model=_mlp())
    assert set(session.placement(batch=2).values()) == {"cpu"}
    assert session.placement_seconds(batch=2) == near
    clear = {"fake:0": 1.0, "cpu": 0.9, MIXED: 0.5}
    session = _auto_session(monkeypatch, [fake, CPUDevice()], clear)
    # The mix is the per-node fastest placement: shape arithmetic on the CPU, the rest by measured cost.
    assert session.placement(batch=2)["shape_of"] == "cpu" and session.placement_seconds(batch=2) == clear


opencl = pytest.importorskip("hetflow.devices.opencl")


@pytest.fixture
def opencl_device():
    reason = opencl.OpenCLDevice.is_available()
    if reason is not None:
        pytest.skip(f"no OpenCL device: {reason}")
    return "opencl:0"


def test_matmul_only_placement_like_rstensorflow(opencl_device):
    x = np.random.default_rng(5).standard_normal((3, 7)).astype(np.float32)
    [expected, _] = hetflow.InferenceSession(_mlp()).run(None, {"x": x})
    session = hetflow.InferenceSession(_mlp(), device="cpu", placement={"MatMul": opencl_device})
    placement = session.placement()
    assert placement["fc"] == opencl_device
    assert {placement[n] for n in ("act", "shape_of", "probs")} == {"cpu"}
    [got, _] = session.run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)


def test_named_accelerator_leaves_what_it_lacks_to_the_cpu(opencl_device):
    session = hetflow.InferenceSession(_mlp(), device=opencl_device)
    assert session.get_providers()[-1] == "cpu"
    assert session.placement()["shape_of"] == "cpu"


def test_auto_measures_per_batch_and_matches_the_cpu(opencl_device):
    x = np.random.default_rng(6).standard_normal((4, 7)).astype(np.float32)
    [expected, _] = hetflow.InferenceSession(_mlp()).run(None, {"x": x})
    session = hetflow.InferenceSession(_mlp(), device="auto")
    [got, _] = session.run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    bound = session.placement(batch=4)
    assert set(bound) == set(session.placement()) and set(bound.values()) <= {opencl_device, "cpu"}


def test_auto_keeps_the_cpu_only_folds_when_the_cpu_wins(opencl_device, monkeypatch):
    """The folds only the CPU's kernels run (a residual added in the Conv) are left out of a graph that
    may run elsewhere, but the CPU's own candidate has them: auto on the CPU is the CPU session."""
    from tests.passes.test_fuse_residual import residual_block

    monkeypatch.setattr(session_module, "time_plans", lambda plans, feeds, threads=None: {
        label: 0.5 if label == "cpu" else 1.0 for label in plans})  # fmt: skip
    proto = residual_block()
    session = hetflow.InferenceSession(proto, device="auto")
    assert [n.op_type for n in session.graph.nodes] == ["Conv", "Add"]  # runnable on every device
    plan = session.plan_for({"N": 2})
    assert [s.node.op_type for s in plan.steps] == ["Conv"] and set(plan.placement().values()) == {"cpu"}
    x = np.random.default_rng(8).standard_normal((2, 6, 8, 7)).astype(np.float32)
    [expected] = hetflow.InferenceSession(proto).run(None, {"x": x})
    [got] = session.run(None, {"x": x})
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
