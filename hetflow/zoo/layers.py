"""A small layer builder around ``onnx.helper``: names nodes, tracks shapes, draws seeded weights.

Builders in the zoo read like a layer list::

    b = LayerBuilder("lenet", seed=0)
    x = b.input("data", (1, 28, 28))
    x = b.max_pool(b.conv(x, 20, 5), 2, 2)
    ...
    model = b.model([b.softmax(x)])

Every tensor carries its per-example shape (batch excluded: the batch is always the symbolic "N"),
so layers know their fan-in without the caller repeating channel counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: Opset and IR version of every model the zoo writes.
OPSET = 17
IR_VERSION = 8
#: The symbolic batch dimension of every zoo model's inputs and outputs.
BATCH = "N"
#: Standard deviation of biases and of the random offsets of BatchNormalization's beta.
BIAS_STD = 0.01


@dataclass(frozen=True)
class Tensor:
    """A value in the graph under construction.

    Attributes:
        name: the ONNX value name.
        shape: the per-example shape (the leading batch dimension "N" is implied).
    """

    name: str
    shape: tuple[int, ...]

    @property
    def channels(self) -> int:
        return self.shape[0]


def he_normal(rng: np.random.Generator, shape: Sequence[int], fan_in: int, gain: float = 2.0) -> np.ndarray:
    """Kaiming-normal weights: N(0, gain / fan_in), so ReLU layers keep the activations' scale."""
    return rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(math.sqrt(gain / fan_in))


def small_normal(rng: np.random.Generator, shape: Sequence[int], std: float = BIAS_STD) -> np.ndarray:
    """Small centred values for biases."""
    return rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)


def near_one(rng: np.random.Generator, shape: Sequence[int], std: float = 0.1) -> np.ndarray:
    """Scales around 1 (BatchNormalization gamma, per-channel multipliers)."""
    return np.float32(1.0) + rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)


def _pooled(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    span = size + 2 * pad - kernel
    steps = -(-span // stride) if ceil_mode else span // stride
    # NOTE: ONNX (like Caffe) drops a ceil-mode window that would start inside the right padding.
    if ceil_mode and steps * stride >= size + pad:
        steps -= 1
    return steps + 1


class LayerBuilder:
    """Accumulates nodes and seeded initializers for one model.

    Args:
        name: the graph name (also the prefix of nothing: node names are per layer kind).
        seed: seeds the generator every weight is drawn from, in build order.
    """

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self._counts: dict[str, int] = {}

    # -- plumbing -------------------------------------------------------------------------------
    def fresh(self, kind: str) -> str:
        """The next node name of a kind: ``conv1``, ``conv2``, ..."""
        self._counts[kind] = self._counts.get(kind, 0) + 1
        return f"{kind}{self._counts[kind]}"

    def input(self, name: str, shape: Sequence[int]) -> Tensor:
        """Declare a float32 graph input of per-example ``shape`` (batch "N" prepended)."""
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [BATCH, *shape]))
        return Tensor(name, tuple(shape))

    def param(self, name: str, array: np.ndarray) -> str:
        """Add an initializer and return its name."""
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def ints(self, name: str, values: Sequence[int]) -> str:
        """Add an int64 constant (shapes, axes) and return its name."""
        return self.param(name, np.asarray(values, dtype=np.int64))

    def node(
        self, op_type: str, inputs: Sequence[str], name: str, num_outputs: int = 1, **attrs: Any
    ) -> list[str]:
        """Append a node; its outputs are named ``name`` (one output) or ``name_0``, ``name_1`` ..."""
        outputs = [name] if num_outputs == 1 else [f"{name}_{i}" for i in range(num_outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, **attrs))
        return outputs

    def op(self, op_type: str, inputs: Sequence[str], shape: Sequence[int], kind: str, **attrs: Any) -> Tensor:
        """Append a one-output node named after ``kind`` whose output has per-example ``shape``."""
        name = self.fresh(kind)
        (output,) = self.node(op_type, inputs, name, **attrs)
        return Tensor(output, tuple(shape))

    def model(self, outputs: Sequence[Tensor], doc: str = "") -> onnx.ModelProto:
        """Finish: a checked ModelProto at the zoo's opset and IR version."""
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, [BATCH, *t.shape]) for t in outputs],
            self.initializers,
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="hetflow.zoo",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model

    # -- layers ---------------------------------------------------------------------------------
    def conv(
        self,
        x: Tensor,
        out_channels: int,
        kernel: int,
        stride: int = 1,
        pad: int = 0,
        group: int = 1,
        bias: bool = True,
    ) -> Tensor:
        """2-D convolution with He-normal weights (square kernel, symmetric padding)."""
        channels, height, width = x.shape
        name = self.fresh("conv")
        fan_in = channels // group * kernel * kernel
        inputs = [x.name, self.param(f"{name}_W", he_normal(
            self.rng, (out_channels, channels // group, kernel, kernel), fan_in))]
        if bias:
            inputs.append(self.param(f"{name}_B", small_normal(self.rng, (out_channels,))))
        self.node(
            "Conv", inputs, name, kernel_shape=[kernel, kernel], strides=[stride, stride],
            pads=[pad] * 4, group=group,
        )
        out_h = (height + 2 * pad - kernel) // stride + 1
        out_w = (width + 2 * pad - kernel) // stride + 1
        return Tensor(name, (out_channels, out_h, out_w))

    def fc(self, x: Tensor, out_features: int, gain: float = 2.0) -> Tensor:
        """Fully connected layer (Gemm, weight stored [out, in] as Caffe does) on a flat input."""
        (features,) = x.shape
        name = self.fresh("fc")
        weight = self.param(f"{name}_W", he_normal(self.rng, (out_features, features), features, gain))
        bias = self.param(f"{name}_B", small_normal(self.rng, (out_features,)))
        self.node("Gemm", [x.name, weight, bias], name, transB=1)
        return Tensor(name, (out_features,))

    def batch_norm(self, x: Tensor) -> Tensor:
        """Inference BatchNormalization; mean 0 / var 1 are placeholders until ``calibrate`` sets them."""
        name = self.fresh("bn")
        channels = x.channels
        inputs = [
            x.name,
            self.param(f"{name}_scale", near_one(self.rng, (channels,))),
            self.param(f"{name}_bias", small_normal(self.rng, (channels,), std=0.1)),
            self.param(f"{name}_mean", np.zeros(channels, np.float32)),
            self.param(f"{name}_var", np.ones(channels, np.float32)),
        ]
        self.node("BatchNormalization", inputs, name, epsilon=1e-5)
        return Tensor(name, x.shape)

    def relu(self, x: Tensor) -> Tensor:
        return self.op("Relu", [x.name], x.shape, "relu")

    def relu6(self, x: Tensor) -> Tensor:
        """ReLU6 as Clip(x, 0, 6) with constant min/max inputs (opset >= 11 form)."""
        if not self._counts.get("relu6_bounds"):
            self._counts["relu6_bounds"] = 1
            self.param("relu6_min", np.array(0.0, np.float32))
            self.param("relu6_max", np.array(6.0, np.float32))
        return self.op("Clip", [x.name, "relu6_min", "relu6_max"], x.shape, "relu6_")

    def max_pool(self, x: Tensor, kernel: int, stride: int, pad: int = 0, ceil_mode: bool = False) -> Tensor:
        return self._pool("MaxPool", "pool", x, kernel, stride, pad, ceil_mode)

    def avg_pool(self, x: Tensor, kernel: int, stride: int, pad: int = 0, ceil_mode: bool = False) -> Tensor:
        return self._pool("AveragePool", "avepool", x, kernel, stride, pad, ceil_mode)

    def _pool(
        self, op_type: str, kind: str, x: Tensor, kernel: int, stride: int, pad: int, ceil_mode: bool
    ) -> Tensor:
        channels, height, width = x.shape
        shape = (
            channels, _pooled(height, kernel, stride, pad, ceil_mode), _pooled(width, kernel, stride, pad, ceil_mode)
        )
        return self.op(
            op_type, [x.name], shape, kind, kernel_shape=[kernel, kernel], strides=[stride, stride],
            pads=[pad] * 4, ceil_mode=int(ceil_mode),
        )

    def global_avg_pool(self, x: Tensor) -> Tensor:
        return self.op("GlobalAveragePool", [x.name], (x.channels, 1, 1), "gap")

    def flatten(self, x: Tensor) -> Tensor:
        """Flatten every per-example dimension into one (batch-agnostic, unlike a Reshape to [1, -1])."""
        return self.op("Flatten", [x.name], (math.prod(x.shape),), "flatten", axis=1)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        assert a.shape == b.shape, (a, b)
        return self.op("Add", [a.name, b.name], a.shape, "add")

    def softmax(self, x: Tensor) -> Tensor:
        return self.op("Softmax", [x.name], x.shape, "prob", axis=-1)
