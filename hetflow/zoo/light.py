"""Zoo models made from the architecture-only "light" models that the onnx package ships.

``onnx/backend/test/data/light/light_*.onnx`` hold famous ImageNet networks at opset 9 / IR 3 whose
weights are ``ConstantOfShape`` nodes (every weight 0.02) or, for some small tensors, leftover trained
values. ``from_light_model`` turns one into a zoo model:

1. every float weight (ConstantOfShape output or float initializer) becomes a seeded random
   initializer chosen by its role: He-normal conv/FC weights, small biases, BatchNormalization and
   Caffe "Scale" (Unsqueeze -> Mul / Add) gammas around 1 and betas around 0, BatchNormalization
   mean/var placeholders (0 / 1) that ``calibrate`` replaces with statistics from a forward pass;
2. initializers stop being graph inputs, and the batch dimension of the input and output becomes "N";
   Reshape targets with a literal batch of 1 get 0 ("copy the input's batch") instead;
3. the IR version is raised and ``onnx.version_converter`` upgrades the opset from 9 to the zoo's
   (done first, while the weights are still tiny ConstantOfShape nodes).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper, version_converter

from hetflow.errors import ModelLoadError
from hetflow.zoo.layers import BATCH, IR_VERSION, OPSET, he_normal, near_one, small_normal

#: Ops that only re-shape a weight on its way to the layer that uses it.
_PASS_THROUGH = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Flatten"})


def light_dir() -> Path:
    """Where the installed onnx package keeps its light models."""
    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def from_light_model(file_stem: str, seed: int) -> onnx.ModelProto:
    """Load ``light_<file_stem>.onnx`` and make it a runnable, randomly weighted zoo model.

    Raises:
        ModelLoadError: the installed onnx package lacks the file.
    """
    path = light_dir() / f"light_{file_stem}.onnx"
    if not path.exists():
        raise ModelLoadError(f"the installed onnx package has no light model {path}")
    model = onnx.load(str(path))
    _drop_initializer_inputs(model.graph)
    output_shapes = _symbolic_batch(model.graph)
    model.ir_version = IR_VERSION
    # NOTE: convert while the weights are still ConstantOfShape nodes: the converter copies the whole
    # model, which takes tens of seconds once VGG-19's 570 MB of weights are in it.
    model = version_converter.convert_version(model, OPSET)
    model.ir_version = IR_VERSION
    _materialise_weights(model.graph, np.random.default_rng(seed))
    _batch_agnostic_reshapes(model.graph)
    _restore_output_shapes(model.graph, output_shapes)
    del model.graph.value_info[:]
    model.producer_name = "hetflow.zoo"
    return model


# -- weights -------------------------------------------------------------------------------------
def _materialise_weights(graph: onnx.GraphProto, rng: np.random.Generator) -> None:
    """Replace ConstantOfShape weights and float initializers by seeded values chosen by role."""
    initializers = {t.name: t for t in graph.initializer}
    shapes: dict[str, tuple[int, ...]] = {}
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in initializers:
            shapes[node.output[0]] = tuple(int(d) for d in numpy_helper.to_array(initializers[node.input[0]]))
    for tensor in graph.initializer:
        if tensor.data_type == TensorProto.FLOAT:
            shapes[tensor.name] = tuple(tensor.dims)

    consumers = _consumers(graph.node)
    still_read = {name for node in graph.node if node.output[0] not in shapes for name in node.input}
    _remove_initializers(graph, lambda t: t.name in shapes or t.name not in still_read)
    # NOTE: drawing in node order (not the file's initializer order) makes the weights a pure function
    # of the architecture and the seed. Tensors are filled in place: copying 500 MB of protobuf
    # messages around costs seconds.
    for name in _in_use_order(graph.node, shapes):
        user, index = _final_user(name, consumers)
        array = _initial_value(rng, shapes[name], user, index)
        tensor = graph.initializer.add()
        tensor.name = name
        tensor.data_type = TensorProto.FLOAT
        tensor.dims.extend(array.shape)
        tensor.raw_data = array.astype("<f4", copy=False).tobytes()
    for index in reversed(range(len(graph.node))):
        if graph.node[index].output[0] in shapes:
            del graph.node[index]  # a ConstantOfShape whose output is now an initializer


def _remove_initializers(graph: onnx.GraphProto, drop: Callable[[TensorProto], bool]) -> None:
    for index in reversed(range(len(graph.initializer))):
        if drop(graph.initializer[index]):
            del graph.initializer[index]


def _consumers(nodes: Iterable[onnx.NodeProto]) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in nodes:
        for index, name in enumerate(node.input):
            found.setdefault(name, []).append((node, index))
    return found


def _in_use_order(nodes: Iterable[onnx.NodeProto], weights: dict[str, tuple[int, ...]]) -> list[str]:
    order: dict[str, None] = {}
    for node in nodes:
        for name in node.input:
            if name in weights:
                order.setdefault(name)
    return list(order)


def _final_user(
    name: str, consumers: dict[str, list[tuple[onnx.NodeProto, int]]]
) -> tuple[onnx.NodeProto, int]:
    """The layer that really uses a weight, looking through Unsqueeze/Reshape on the way."""
    node, index = consumers[name][0]
    while node.op_type in _PASS_THROUGH and index == 0 and node.output[0] in consumers:
        node, index = consumers[node.output[0]][0]
    return node, index


def _initial_value(
    rng: np.random.Generator, shape: tuple[int, ...], user: onnx.NodeProto, index: int
) -> np.ndarray:
    role = (user.op_type, index)
    if role == ("Conv", 1):
        return he_normal(rng, shape, math.prod(shape[1:]))
    if role == ("Gemm", 1):
        # NOTE: some Caffe2 exports store FC weights 4-D ([1, 1, out, in]) and Reshape them to 2-D.
        rows, cols = [d for d in shape if d != 1][-2:]
        trans_b = any(a.name == "transB" and a.i for a in user.attribute)
        return he_normal(rng, shape, cols if trans_b else rows, gain=_classifier_gain(shape))
    if role in (("Conv", 2), ("Gemm", 2)):
        return small_normal(rng, shape)
    if role == ("BatchNormalization", 1) or user.op_type == "Mul":
        return near_one(rng, shape)
    if role == ("BatchNormalization", 2) or user.op_type == "Add":
        return small_normal(rng, shape, std=0.1)
    if role == ("BatchNormalization", 3):
        return np.zeros(shape, np.float32)
    if role == ("BatchNormalization", 4):
        return np.ones(shape, np.float32)
    raise ValueError(f"zoo: no initialisation rule for a weight read by {user.op_type} input {index}")


def _classifier_gain(shape: tuple[int, ...]) -> float:
    # NOTE: ImageNet classifiers' last layer (1000 outputs) feeds Softmax directly, not a ReLU: gain 1
    # keeps the logits at the scale of the features instead of doubling their variance.
    return 1.0 if 1000 in shape else 2.0


# -- graph interface -----------------------------------------------------------------------------
def _drop_initializer_inputs(graph: onnx.GraphProto) -> None:
    names = {t.name for t in graph.initializer}
    kept = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(kept)


def _batch_agnostic_reshapes(graph: onnx.GraphProto) -> None:
    """Make Reshapes of activations copy the batch (target dim 0 -> 0) instead of fixing it to 1."""
    initializers = {t.name: t for t in graph.initializer}
    constant = set(initializers)
    for node in graph.node:
        if all(name in constant for name in node.input if name):
            constant.update(node.output)
    for node in graph.node:
        if node.op_type != "Reshape" or node.input[0] in constant or node.input[1] not in initializers:
            continue
        target = numpy_helper.to_array(initializers[node.input[1]]).copy()
        if target.size and target[0] == 1:
            target[0] = 0
            name = f"{node.output[0]}__batch_shape"
            graph.initializer.append(numpy_helper.from_array(target.astype(np.int64), name))
            node.input[1] = name
    still_read = {i for n in graph.node for i in n.input}
    _remove_initializers(graph, lambda t: t.name not in still_read)


def _symbolic_batch(graph: onnx.GraphProto) -> dict[str, list[int | str]]:
    """Set the inputs' batch to "N"; return the outputs' shapes with "N" as batch (restored later)."""
    for value in graph.input:
        value.type.tensor_type.shape.dim[0].dim_param = BATCH
    shapes: dict[str, list[int | str]] = {}
    for value in graph.output:
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim]
        shapes[value.name] = [BATCH, *dims[1:]]
    return shapes


def _restore_output_shapes(graph: onnx.GraphProto, shapes: dict[str, list[int | str]]) -> None:
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for dim in shapes[value.name]:
            entry = dims.add()
            if isinstance(dim, str):
                entry.dim_param = dim
            else:
                entry.dim_value = dim
