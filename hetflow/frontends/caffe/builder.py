"""The state a Caffe import builds up: the Graph, blob -> value names, shapes, and the layers' weights.

Caffe names *blobs*, and in-place layers (``top == bottom``, e.g. ReLU) overwrite a blob; the Graph is
SSA, so every write of a blob gets its own value name (the blob's name the first time, then
``blob/layer``) and ``blobs`` maps each blob to its newest value. Nodes are shape-inferred as they are
added, so converters can read their inputs' shapes (a convolution's weights depend on its input's
channels).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.errors import InvalidModelError, ModelLoadError
from hetflow.frontends.caffe.caffemodel import LayerBlobs
from hetflow.frontends.caffe.prototxt import Message
from hetflow.graph import Graph, Node, Value
from hetflow.graph.shapes import Shape, format_shape
from hetflow.ops import registry
from hetflow.ops.attrs import parse_attrs
from hetflow.ops.base import TensorInfo

FLOAT = np.dtype(np.float32)
#: The symbolic batch dimension every input gets (``passes.bind_batch`` binds it).
BATCH = "N"


@dataclass
class Layer:
    """One Caffe layer, V1 or V2, in one form.

    Attributes:
        name: the layer's name (unique in a well-formed net).
        type: the V2 type string (``"Convolution"``); V1 enum names are translated.
        bottoms: the blobs it reads.
        tops: the blobs it writes.
        message: the whole layer message (its ``*_param`` sub-messages are read from here).
        index: position in the net, for messages.
    """

    name: str
    type: str
    bottoms: list[str]
    tops: list[str]
    message: Message = field(default_factory=Message)
    index: int = 0

    def params(self, field_name: str) -> Message:
        """The layer's ``field_name`` sub-message (e.g. ``"convolution_param"``); empty when absent."""
        try:
            return self.message.message(field_name)
        except ValueError as error:
            raise self.error(str(error)) from error

    def error(self, reason: str) -> InvalidModelError:
        return InvalidModelError(f"layer '{self.name}' ({self.type}): {reason}")


class GraphBuilder:
    """Adds inputs, weights and nodes to a Graph for the layer converters.

    Args:
        name: the graph's name.
        weights: the caffemodel's layers by name, or None to create placeholder weights (zeros, or the
            layer's neutral value) of the right shapes, enough for shape inference and cost estimates.
    """

    def __init__(self, name: str, weights: dict[str, LayerBlobs] | None):
        self.graph = Graph(name=name)
        self.weights = weights
        self.blobs: dict[str, str] = {}
        self._value_names: set[str] = set()
        self._node_names: set[str] = set()
        self._used_blobs: dict[str, set[int]] = {}
        #: Each input as the prototxt declares it (batch included), e.g. ``data=10x3x227x227``.
        self.input_shapes: list[str] = []

    # -- names ---------------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A value name nothing else uses, as close to ``hint`` as possible."""
        return _unique(hint, self._value_names)

    def fresh_node(self, hint: str) -> str:
        """A node name nothing else uses (node and value names are separate namespaces)."""
        return _unique(hint, self._node_names)

    def top(self, layer: Layer, index: int = 0) -> str:
        """The value name for the layer's ``index``-th top: the blob name, or ``blob/layer`` on a rewrite."""
        blob = layer.tops[index]
        return self.fresh(blob if blob not in self._value_names else f"{blob}/{layer.name}")

    def bottom(self, layer: Layer, index: int = 0) -> str:
        """The value that the layer's ``index``-th bottom currently names."""
        if index >= len(layer.bottoms):
            raise layer.error(f"needs at least {index + 1} bottom(s); has {len(layer.bottoms)}")
        return self.blobs[layer.bottoms[index]]

    # -- values --------------------------------------------------------------------------------
    def shape(self, value: str) -> Shape:
        shape = self.graph.values[value].shape
        assert shape is not None
        return shape

    def add_input(self, blob: str, shape: Sequence[int]) -> str:
        """A graph input for a Caffe input blob; its first (batch) dimension becomes ``"N"``."""
        name = self.fresh(blob)
        dims = tuple(int(d) for d in shape)
        if not dims or any(d < 1 for d in dims):
            raise InvalidModelError(f"input '{blob}' has shape {dims}; every dimension must be positive")
        self.graph.inputs.append(name)
        self.graph.values[name] = Value(name, (BATCH, *dims[1:]), FLOAT)
        self.blobs[blob] = name
        self.input_shapes.append(f"{blob}={'x'.join(str(d) for d in dims)}")
        return name

    def identity(self, hint: str, value: str) -> str:
        """A new value equal to ``value`` (an Identity node), e.g. an output that aliases an input."""
        out = self.fresh(hint)
        self.graph.nodes.append(Node("Identity", self.fresh_node(hint), [value], [out],
                                     registry.get("Identity").Attrs()))
        self.graph.values[out] = Value(out, self.shape(value), self.graph.values[value].dtype)
        return out

    def constant(self, hint: str, array: np.ndarray) -> str:
        """Add an initializer (a weight or a constant operand) and return its name."""
        name = self.fresh(hint)
        self.graph.initializers[name] = array
        self.graph.values[name] = Value(name, tuple(array.shape), array.dtype)
        return name

    def param(
        self, layer: Layer, index: int, shape: Sequence[int], fill: float = 0.0, role: str = ""
    ) -> str:
        """The layer's ``index``-th learned blob as an initializer of ``shape``.

        With a caffemodel the blob must hold exactly ``prod(shape)`` values (its stored shape may differ,
        e.g. the legacy 4-D ``1 x 1 x N x K`` of an InnerProduct) and is reshaped; without one a
        placeholder filled with ``fill`` is created (zeros come from the allocator lazily, so a
        VGG-sized placeholder costs no memory until something reads it).
        """
        role = role or _BLOB_ROLES.get(index, f"blob{index}")
        return self.constant(f"{layer.name}/{role}", self.param_array(layer, index, shape, fill))

    def param_array(self, layer: Layer, index: int, shape: Sequence[int], fill: float = 0.0) -> np.ndarray:
        """Like ``param`` but returns the array without adding it (for blobs folded into others)."""
        shape = tuple(int(d) for d in shape)
        if self.weights is None:
            return np.zeros(shape, FLOAT) if fill == 0.0 else np.full(shape, fill, FLOAT)
        stored = self.weights.get(layer.name)
        if stored is None:
            raise ModelLoadError(f"the caffemodel has no weights for layer '{layer.name}' ({layer.type})")
        if index >= len(stored.blobs):
            raise ModelLoadError(
                f"the caffemodel's layer '{layer.name}' has {len(stored.blobs)} blob(s); "
                f"the prototxt's {layer.type} needs blob {index} of shape {shape}"
            )
        self._used_blobs.setdefault(layer.name, set()).add(index)
        blob = stored.blobs[index]
        if blob.size != int(np.prod(shape, dtype=np.int64)):
            raise ModelLoadError(
                f"layer '{layer.name}' ({layer.type}): caffemodel blob {index} has shape {blob.shape}; "
                f"the prototxt implies {shape}"
            )
        return np.ascontiguousarray(blob, dtype=FLOAT).reshape(shape)

    def check_blob_counts(self, layers: Sequence[Layer]) -> None:
        """Every caffemodel blob of an imported layer must have been used (Caffe's own check)."""
        if self.weights is None:
            return
        for layer in layers:
            stored = self.weights.get(layer.name)
            if stored is None or not stored.blobs:
                continue
            used = self._used_blobs.get(layer.name, set())
            if len(used) != len(stored.blobs):
                raise ModelLoadError(
                    f"layer '{layer.name}' ({layer.type}): the caffemodel has {len(stored.blobs)} blob(s), "
                    f"the prototxt's layer uses {len(used)} (check bias_term and the layer's parameters)"
                )

    # -- nodes ---------------------------------------------------------------------------------
    def add(
        self,
        layer: Layer,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str] | None = None,
        name: str | None = None,
        **attrs: Any,
    ) -> list[str]:
        """Add one node, parse its attributes against the op's schema and infer its outputs' shapes.

        Args:
            layer: the Caffe layer the node comes from (for error messages).
            op_type: the hetflow op.
            inputs: input value names.
            outputs: output value names; one fresh name (from the node's name) when omitted.
            name: node name hint; the layer's name when omitted.
            attrs: the op's attributes (defaults apply to the rest).

        Returns:
            The node's output value names.
        """
        node_name = self.fresh_node(name or layer.name)
        outs = list(outputs) if outputs is not None else [self.fresh(node_name)]
        opdef = registry.get(op_type)
        try:
            parsed = parse_attrs(opdef.Attrs, attrs, op_type=op_type, node_name=node_name)
        except InvalidModelError as error:
            raise layer.error(str(error)) from error
        node = Node(op_type, node_name, list(inputs), outs, parsed)
        infos = [TensorInfo(self.shape(i), self.graph.values[i].dtype) for i in inputs]
        consts = [self.graph.initializers.get(i) for i in inputs]
        try:
            results = opdef.infer(node, infos, consts)
        except (ValueError, IndexError, TypeError) as error:
            shapes = ", ".join(format_shape(i.shape) for i in infos)
            raise layer.error(f"{op_type} on input shapes ({shapes}): {error}") from error
        for out, info in zip(outs, results):
            self.graph.values[out] = Value(out, tuple(info.shape), info.dtype)
        self.graph.nodes.append(node)
        return outs


#: What a layer's blobs hold, by index, for readable initializer names.
_BLOB_ROLES = {0: "W", 1: "b"}


def _unique(hint: str, taken: set[str]) -> str:
    name, suffix = hint, 1
    while name in taken:
        name, suffix = f"{hint}_{suffix}", suffix + 1
    taken.add(name)
    return name
