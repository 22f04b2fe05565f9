"""ONNX ModelProto -> Graph.

Decodes the protobuf, normalises every node to its newest-opset form (``onnx_opsets``), converts
attributes once into each op's typed attrs object, and rejects a model with unsupported ops in one
error that lists them all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from hetflow.errors import InvalidModelError, ModelLoadError, UnsupportedOpsError
from hetflow.frontends.onnx_lean import Lean
from hetflow.frontends.onnx_opsets import ConstantSink, RawNode, normalise
from hetflow.graph import Graph, Node, Value, dtypes
from hetflow.graph.shapes import Dim, Shape
from hetflow.ops import registry
from hetflow.ops.attrs import parse_attrs

MIN_OPSET = 7
ModelSource = str | os.PathLike | bytes | onnx.ModelProto


def newest_opset() -> int:
    """The newest default-domain opset the installed onnx package defines."""
    return onnx.defs.onnx_opset_version()


@dataclass(frozen=True)
class LoadedModel:
    """A parsed ModelProto; for a file, also where its large initializers' data lies in it."""

    model: onnx.ModelProto
    lean: Lean | None = None  # set when the message was parsed without the large initializers' data

    def initializer(self, index: int) -> np.ndarray:
        """``model.graph.initializer[index]`` as an array (its data read from the file if streamed)."""
        tensor = self.model.graph.initializer[index]
        span = None if self.lean is None else self.lean.spans.get(index)
        return _to_array(tensor) if span is None else self.lean.read(tensor, span)  # type: ignore[union-attr]


def load_proto(source: ModelSource) -> LoadedModel:
    """Read a ModelProto from a path, serialized bytes or a ModelProto; external data is loaded.

    From a path, initializers of 64 KiB or more are left out of the parsed message and read from the
    file one at a time when converted (``onnx_lean``), so their data is held once, not twice.
    """
    if isinstance(source, onnx.ModelProto):
        return LoadedModel(source)
    if isinstance(source, (bytes, bytearray)):
        return LoadedModel(_parse(bytes(source), "the given bytes"))
    path = Path(os.fspath(source))
    if not path.exists():
        raise ModelLoadError(f"model file not found: {path}")
    if path.is_dir():
        raise ModelLoadError(f"{path} is a directory, not a model file")
    try:
        lean = Lean.of(path)
        data = lean.message if lean is not None else path.read_bytes()
    except OSError as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    model = _parse(data, str(path))
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"{path}: cannot load its external data: {error}") from error
    return LoadedModel(model, lean)


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    if not data:
        raise ModelLoadError(f"{where}: the file is empty, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as error:
        raise ModelLoadError(f"{where}: not a valid ONNX model (protobuf decode failed: {error})") from error
    # NOTE: protobuf happily decodes many random byte strings into a message with unknown fields;
    # a real model has an IR version and a graph with at least one output.
    if model.ir_version <= 0 or not model.HasField("graph") or not model.graph.output:
        raise ModelLoadError(f"{where}: not an ONNX model (no IR version or no graph outputs)")
    return model


def import_onnx(source: ModelSource) -> Graph:
    """Convert an ONNX model into a hetflow Graph (not yet folded or shape-inferred).

    Raises:
        ModelLoadError: the source cannot be read or is not ONNX.
        UnsupportedOpsError: listing every node whose op hetflow lacks.
        InvalidModelError: attributes or structure are invalid.
    """
    loaded = load_proto(source)
    model = loaded.model
    opset = _default_opset(model)
    _check_supported(model.graph)

    graph = Graph(name=model.graph.name or "graph", opset=opset)
    graph.metadata = {p.key: p.value for p in model.metadata_props}
    for index, tensor in enumerate(model.graph.initializer):
        graph.initializers[tensor.name] = loaded.initializer(index)
    for sparse in model.graph.sparse_initializer:
        raise InvalidModelError(f"sparse initializer '{sparse.values.name}' is not supported")

    for info in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        graph.values[info.name] = _value_from_info(info)
    for name, array in graph.initializers.items():
        graph.values[name] = Value(name, tuple(array.shape), array.dtype)
    # NOTE: IR < 4 lists every initializer as a graph input too; those are weights, not feeds
    # (hetflow does not let a feed override a weight, which also lets them be folded).
    graph.inputs = [i.name for i in model.graph.input if i.name not in graph.initializers]
    graph.outputs = [o.name for o in model.graph.output]

    names = _UniqueNames(graph)
    sink = ConstantSink(lambda array, hint: _add_constant(graph, names, array, hint))
    for index, proto in enumerate(model.graph.node):
        raw = RawNode(
            op_type=proto.op_type,
            name=proto.name or names.fresh(f"{proto.op_type}_{index}"),
            inputs=list(proto.input),
            outputs=list(proto.output),
            attrs={a.name: _attribute_value(a, proto) for a in proto.attribute},
            domain=proto.domain,
        )
        names.reserve(raw.name)
        if raw.op_type == "Constant" and _is_default_domain(raw.domain):
            graph.initializers[raw.outputs[0]] = _constant_value(raw)
            graph.values[raw.outputs[0]] = Value(
                raw.outputs[0], tuple(graph.initializers[raw.outputs[0]].shape),
                graph.initializers[raw.outputs[0]].dtype,
            )
            continue
        normalise(raw, opset, sink)
        graph.nodes.append(_to_node(raw))
    graph.validate()
    return graph


def _default_opset(model: onnx.ModelProto) -> int:
    versions = [o.version for o in model.opset_import if _is_default_domain(o.domain)]
    opset = versions[0] if versions else 1
    newest = newest_opset()
    if opset < MIN_OPSET or opset > newest:
        raise ModelLoadError(
            f"model uses ONNX opset {opset}; hetflow supports opsets {MIN_OPSET}..{newest}"
        )
    return opset


def _is_default_domain(domain: str) -> bool:
    return domain in ("", "ai.onnx")


def _check_supported(graph_proto: onnx.GraphProto) -> None:
    unsupported = []
    for index, proto in enumerate(graph_proto.node):
        if proto.op_type == "Constant" and _is_default_domain(proto.domain):
            continue
        found = registry.describe_unsupported(
            proto.name or f"{proto.op_type}_{index}", proto.op_type, proto.domain
        )
        if found is not None:
            unsupported.append(found)
    if unsupported:
        raise UnsupportedOpsError(unsupported)


def _to_node(raw: RawNode) -> Node:
    opdef = registry.get(raw.op_type, raw.domain)
    lo, hi = opdef.num_inputs
    count = len(raw.inputs)
    while count > lo and raw.inputs[count - 1] == "":
        count -= 1  # trailing omitted optional inputs
    if count < lo or (hi >= 0 and count > hi):
        expected = f"{lo}" if lo == hi else f"{lo}..{'any' if hi < 0 else hi}"
        raise InvalidModelError(
            f"node '{raw.name}' ({raw.op_type}) has {count} inputs; {raw.op_type} takes {expected}"
        )
    out_lo, out_hi = opdef.num_outputs
    if len(raw.outputs) < out_lo or (out_hi >= 0 and len(raw.outputs) > out_hi):
        raise InvalidModelError(
            f"node '{raw.name}' ({raw.op_type}) has {len(raw.outputs)} outputs; "
            f"{raw.op_type} produces {out_lo}..{out_hi}"
        )
    attrs = parse_attrs(opdef.Attrs, raw.attrs, op_type=raw.op_type, node_name=raw.name)
    return Node(raw.op_type, raw.name, raw.inputs[:count], raw.outputs, attrs, raw.domain)


def _to_array(tensor: onnx.TensorProto) -> np.ndarray:
    try:
        array = numpy_helper.to_array(tensor)
    except (ValueError, TypeError) as error:
        raise InvalidModelError(f"tensor '{tensor.name}' cannot be decoded: {error}") from error
    # NOTE: np.ascontiguousarray turns 0-d arrays into 1-d ones; keep scalars scalar.
    return np.ascontiguousarray(array).reshape(array.shape)


def _attribute_value(attr: onnx.AttributeProto, node: onnx.NodeProto) -> Any:
    if attr.ref_attr_name:
        raise InvalidModelError(f"node '{node.name}': attribute references are only valid in functions")
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return _to_array(value)
    if isinstance(value, list):
        return tuple(
            v.decode("utf-8") if isinstance(v, bytes)
            else _to_array(v) if isinstance(v, onnx.TensorProto) else v
            for v in value
        )
    if isinstance(value, (onnx.GraphProto, onnx.SparseTensorProto, onnx.TypeProto)):
        raise InvalidModelError(
            f"node '{node.name}' ({node.op_type}): attribute '{attr.name}' of this kind is not supported"
        )
    return value


def _constant_value(raw: RawNode) -> np.ndarray:
    if len(raw.attrs) != 1:
        raise InvalidModelError(f"Constant node '{raw.name}' must have exactly one value attribute")
    ((kind, value),) = raw.attrs.items()
    if kind == "value":
        return np.asarray(value)
    if kind == "value_float":
        return np.array(value, dtype=np.float32)
    if kind == "value_floats":
        return np.array(value, dtype=np.float32)
    if kind == "value_int":
        return np.array(value, dtype=np.int64)
    if kind == "value_ints":
        return np.array(value, dtype=np.int64)
    if kind == "value_string":
        return np.array(value, dtype=object)
    if kind == "value_strings":
        return np.array(value, dtype=object)
    raise InvalidModelError(f"Constant node '{raw.name}': unsupported value attribute '{kind}'")


def _value_from_info(info: onnx.ValueInfoProto) -> Value:
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise InvalidModelError(f"value '{info.name}' has type {kind}; only tensors are supported")
    tensor_type = info.type.tensor_type
    shape: Shape | None = None
    if tensor_type.HasField("shape"):
        dims: list[Dim] = []
        for axis, dim in enumerate(tensor_type.shape.dim):
            if dim.HasField("dim_value"):
                dims.append(int(dim.dim_value))
            elif dim.dim_param:
                dims.append(dim.dim_param)
            else:
                dims.append(f"{info.name}_dim{axis}")
        shape = tuple(dims)
    return Value(info.name, shape, dtypes.from_onnx(tensor_type.elem_type))


def _add_constant(graph: Graph, names: _UniqueNames, array: np.ndarray, hint: str) -> str:
    name = names.fresh(hint)
    graph.initializers[name] = np.ascontiguousarray(array).reshape(np.shape(array))
    graph.values[name] = Value(name, tuple(array.shape), array.dtype)
    return name


class _UniqueNames:
    """Hands out value and node names that collide with nothing in the model."""

    def __init__(self, graph: Graph):
        self._taken = set(graph.values) | set(graph.initializers)

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def fresh(self, hint: str) -> str:
        name, suffix = hint, 1
        while name in self._taken:
            name, suffix = f"{hint}_{suffix}", suffix + 1
        self._taken.add(name)
        return name
