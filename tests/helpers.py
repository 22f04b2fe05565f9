"""Small model builders and oracles shared by the tests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hetflow.ops.spatial import Geometry


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[tuple[str, int, Sequence[int | str]]],
    outputs: Sequence[tuple[str, int, Sequence[int | str] | None]],
    initializers: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A one-graph model from nodes, (name, elem_type, shape) inputs/outputs and initializer arrays."""
    graph = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(a, n) for n, a in (initializers or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def add_relu_model(opset: int = 17) -> onnx.ModelProto:
    """y = relu(x + b) with x: float32 [N, 3] and b = [1, 1, 1]."""
    return make_model(
        [helper.make_node("Add", ["x", "b"], ["t"], name="add"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
        [("x", TensorProto.FLOAT, ["N", 3])],
        [("y", TensorProto.FLOAT, ["N", 3])],
        {"b": np.ones(3, np.float32)},
        opset=opset,
    )


def prelu_softmax_model() -> onnx.ModelProto:
    """y = softmax(prelu(x, 0.25)) over the last axis, x: float32 [2, 3, 8]. hetflow's PRelu has no
    compiled job: a captured run calls it from Python, then replays the Softmax."""
    return make_model(
        [helper.make_node("PRelu", ["x", "slope"], ["t"], name="prelu"),
         helper.make_node("Softmax", ["t"], ["y"], name="softmax", axis=-1)],  # fmt: skip
        [("x", TensorProto.FLOAT, [2, 3, 8])],
        [("y", TensorProto.FLOAT, [2, 3, 8])],
        {"slope": np.full((3, 1), 0.25, np.float32)},
    )


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs for ``model`` (2 threads, all optimisations on)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def record_splits(monkeypatch, module) -> list[int]:  # noqa: ANN001
    """Make every compiled loop of ``module`` (``jit_*``) split in numba's pool as soon as there are two
    kernel threads, and record the part counts its parallel driver ``_split`` is called with."""
    from hetflow.devices.cpu import threads

    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_PART", 1)
    monkeypatch.setattr(threads, "_numba_pool", True)  # as inside own_threads(numba_pool=True)
    calls: list[int] = []
    driver = module._split

    def recording(parts: int, *args: object) -> None:
        calls.append(parts)
        driver(parts, *args)

    monkeypatch.setattr(module, "_split", recording)
    return calls


def record_spin_jobs(monkeypatch, min_outputs: int | None = 16, python_pool: bool = False) -> list[tuple[int, int]]:  # noqa: ANN001
    """Record ``(job, chunks)`` for every job the 2-thread spinning pool runs from here on. ``min_outputs``:
    the outputs a share needs (``threads.MIN_OUTPUTS_PER_SPIN_SHARE``; None leaves it), so small arrays
    split; unless ``python_pool``, a split handed to the Python pool fails the test."""
    import pytest

    from hetflow.devices.cpu import threads

    if min_outputs is not None:
        monkeypatch.setattr(threads, "MIN_OUTPUTS_PER_SPIN_SHARE", min_outputs)
    if not python_pool:
        monkeypatch.setattr(threads, "parallel_for", lambda *args: pytest.fail("split on the Python pool"))
    pool = threads.spin_pool(2)
    jobs: list[tuple[int, int]] = []
    run = pool.run

    def recording(job: int, block: np.ndarray, chunks: int) -> None:
        jobs.append((job, chunks))
        run(job, block, chunks)

    monkeypatch.setattr(pool, "run", recording)
    return jobs


def pool_reference(x: np.ndarray, geo: Geometry, scale: np.ndarray | None) -> np.ndarray:
    """The window maxima (np.maximum's NaN rule, padding -inf) or sums (padding 0) times ``scale``, in
    float64, one tap at a time."""
    rows, cols = geo.axes
    is_max = scale is None
    padded = np.full((*x.shape[:2], rows.padded, cols.padded), -np.inf if is_max else 0.0)
    padded[:, :, rows.pad_begin : rows.pad_begin + rows.size, cols.pad_begin : cols.pad_begin + cols.size] = x
    total = None
    for tap in geo.taps():
        value = padded[(..., *geo.tap_slices(tap))]
        total = value.copy() if total is None else np.maximum(total, value) if is_max else total + value
    assert total is not None
    return total if is_max else total * scale
