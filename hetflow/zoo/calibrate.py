"""BatchNormalization statistics for randomly weighted models, from one forward pass.

With random running mean/variance, deep BN networks (ResNet-50, ShuffleNet) overflow float32 within a
few dozen layers. ``calibrate_batchnorm`` walks the graph once in topological order on hetflow's own
CPU kernels; on reaching a BatchNormalization it sets the node's mean/variance to the per-channel
statistics of the input that actually arrives there, then carries on, so every BN normalises what the
layers before it (already calibrated) produce.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from hetflow.devices.cpu import CPU_KERNELS
from hetflow.frontends import load_model
from hetflow.graph import Node


def calibrate_batchnorm(model: onnx.ModelProto, sample: np.ndarray) -> int:
    """Set every BatchNormalization's mean/var initializers in ``model`` (in place) from ``sample``.

    Args:
        model: a model with one float input; BN mean and variance must be initializers.
        sample: a batch fed to that input (a few random images are enough).

    Returns:
        The number of BatchNormalization nodes calibrated.
    """
    if not any(node.op_type == "BatchNormalization" for node in model.graph.node):
        return 0
    graph = load_model(model)
    (feed,) = graph.input_values()
    values: dict[str, np.ndarray] = dict(graph.initializers)
    values[feed.name] = sample
    statistics: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        inputs: list[np.ndarray | None] = [values[name] if name else None for name in node.inputs]
        if node.op_type == "BatchNormalization":
            mean, var = _channel_statistics(inputs[0])
            inputs[3], inputs[4] = mean, var
            statistics[node.inputs[3]] = mean
            statistics[node.inputs[4]] = var
        for name, array in zip(node.outputs, _run(node, inputs)):
            if name and array is not None:
                values[name] = array
    _write_back(model, statistics)
    return len(statistics) // 2


def _channel_statistics(x: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    assert x is not None and x.ndim >= 2
    axes = (0, *range(2, x.ndim))
    mean = x.mean(axis=axes, dtype=np.float64)
    var = x.var(axis=axes, dtype=np.float64)
    return mean.astype(np.float32), var.astype(np.float32)


def _run(node: Node, inputs: Sequence[np.ndarray | None]) -> Sequence[np.ndarray | None]:
    kernel = CPU_KERNELS.lookup(node)
    if kernel is None:
        raise NotImplementedError(
            f"zoo calibration needs a CPU kernel for {node.op_type} (node '{node.name}'): "
            f"{CPU_KERNELS.reason_unsupported(node)}"
        )
    return kernel.fn(node, inputs)


def _write_back(model: onnx.ModelProto, statistics: dict[str, np.ndarray]) -> None:
    written = set()
    for tensor in model.graph.initializer:
        if tensor.name in statistics:
            tensor.CopyFrom(numpy_helper.from_array(statistics[tensor.name], tensor.name))
            written.add(tensor.name)
    missing = sorted(set(statistics) - written)
    if missing:
        raise ValueError(f"zoo calibration: BatchNormalization statistics {missing[:5]} are not initializers")
