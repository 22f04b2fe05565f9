"""A whole Caffe net -> Graph: layers in order, net-level inputs, BatchNorm+Scale fusion, net outputs."""

from __future__ import annotations

import os
from pathlib import Path

from hetflow.errors import InvalidModelError, ModelLoadError, UnsupportedNode, UnsupportedOpsError
from hetflow.frontends.caffe.builder import GraphBuilder, Layer
from hetflow.frontends.caffe.caffemodel import V1_TYPE_NAMES, CaffeWeights, read_caffemodel
from hetflow.frontends.caffe.layers import (
    LAYERS,
    convert_batchnorm,
    scale_fuses_into_batchnorm,
    unsupported_reason,
)
from hetflow.frontends.caffe.prototxt import Message, parse_prototxt
from hetflow.frontends.onnx_import import newest_opset
from hetflow.graph import Graph

#: The domain unsupported Caffe layers are reported under (``caffe::Deconvolution``).
CAFFE_DOMAIN = "caffe"
_PHASES = ("TRAIN", "TEST")


def import_caffe(
    prototxt: str | os.PathLike, weights: str | os.PathLike | CaffeWeights | None = None
) -> Graph:
    """Convert a Caffe deploy ``.prototxt`` (and optionally its ``.caffemodel``) into a Graph.

    The batch (first) dimension of every input becomes the symbol ``"N"``; the prototxt's own batch is
    kept in ``graph.metadata["caffe_input_shapes"]``. Without weights, every learned blob is a
    placeholder of the right shape (``graph.metadata["weights"] == "placeholder"``): enough for shapes,
    costs and estimates, not for meaningful outputs.

    Args:
        prototxt: path of the network description (protobuf text format, V1 or V2 layers).
        weights: path of a ``.caffemodel``, already-decoded weights, or None.

    Raises:
        ModelLoadError: a file is missing, unreadable, not text format / not a caffemodel, or the
            caffemodel lacks a layer's blobs.
        UnsupportedOpsError: listing every layer whose type (or parameter setting) hetflow cannot take.
        InvalidModelError: the net is inconsistent (undefined bottoms, bad parameters, shapes).
    """
    path = Path(prototxt)
    if not path.is_file():
        raise ModelLoadError(f"prototxt not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelLoadError(f"cannot read {path} as text: {error}") from error
    net = parse_prototxt(text, str(path))
    decoded = read_caffemodel(weights) if isinstance(weights, (str, os.PathLike)) else weights
    return convert_net(net, decoded, default_name=path.stem)


def convert_net(net: Message, weights: CaffeWeights | None = None, default_name: str = "caffe") -> Graph:
    """Convert a parsed ``NetParameter`` (see ``import_caffe``)."""
    layers = net_layers(net)
    unsupported = [
        UnsupportedNode(layer.name, layer.type, CAFFE_DOMAIN, reason)
        for layer in layers
        if (reason := unsupported_reason(layer)) is not None
    ]
    if unsupported:
        raise UnsupportedOpsError(unsupported)

    builder = GraphBuilder(str(net.get("name") or default_name), weights.layers if weights else None)
    _net_inputs(builder, net)
    absorbed: set[int] = set()
    for index, layer in enumerate(layers):
        if index in absorbed:
            continue
        for bottom in layer.bottoms:
            if bottom not in builder.blobs:
                raise InvalidModelError(
                    f"layer '{layer.name}' ({layer.type}) reads blob '{bottom}', which no earlier layer or "
                    "net input defines"
                )
        if _fuses_with_next(layers, index):
            outs = convert_batchnorm(builder, layer, layers[index + 1])
            absorbed.add(index + 1)
            _bind_tops(builder, layers[index + 1], outs)
        else:
            outs = LAYERS[layer.type].convert(builder, layer)
        _bind_tops(builder, layer, outs)
    builder.check_blob_counts(layers)

    graph = builder.graph
    if not graph.inputs:
        raise InvalidModelError("the net declares no input (an Input layer, or net-level input/input_shape)")
    graph.outputs = _net_outputs(builder, layers)
    if not graph.outputs:
        raise InvalidModelError("the net has no output blob (every top is consumed)")
    graph.opset = newest_opset()
    graph.metadata = {
        "source_format": "caffe",
        "weights": "placeholder" if weights is None else "caffemodel",
        "caffe_input_shapes": "; ".join(builder.input_shapes),
    }
    graph.validate()
    return graph


def net_layers(net: Message) -> list[Layer]:
    """The net's layers (V2 ``layer`` or legacy V1 ``layers``) that run in the TEST phase."""
    if "layer" in net and "layers" in net:
        raise InvalidModelError("the net mixes V2 'layer' and V1 'layers' fields; use one")
    v1 = "layers" in net
    out = []
    for index, message in enumerate(net.all("layers" if v1 else "layer")):
        if not isinstance(message, Message):
            raise InvalidModelError(f"layer #{index} is not a message")
        type_name = str(message.get("type", ""))
        if v1:
            type_name = V1_TYPE_NAMES.get(type_name, type_name)
        name = str(message.get("name") or f"{type_name or 'layer'}_{index}")
        if not type_name:
            raise InvalidModelError(f"layer '{name}' has no type")
        layer = Layer(name, type_name, [str(b) for b in message.all("bottom")],
                      [str(t) for t in message.all("top")], message, index)
        if _runs_at_test(message):
            out.append(layer)
    return out


def _runs_at_test(message: Message) -> bool:
    """Caffe's NetStateRule filtering for the inference state (phase TEST, level 0, no stages):
    any met include rule admits the layer, any met exclude rule drops it."""
    includes = message.all("include")
    if includes:
        return any(_rule_met(rule) for rule in includes)
    return not any(_rule_met(rule) for rule in message.all("exclude"))


def _rule_met(rule: object) -> bool:
    if not isinstance(rule, Message):
        return False
    phase = rule.get("phase")
    if isinstance(phase, int) and not isinstance(phase, bool) and 0 <= phase < len(_PHASES):
        phase = _PHASES[phase]
    if phase is not None and phase != "TEST":
        return False
    if rule.all("stage"):
        return False  # the inference state has no stages
    min_level, max_level = rule.get("min_level"), rule.get("max_level")
    return (min_level is None or int(min_level) <= 0) and (max_level is None or int(max_level) >= 0)


def _net_inputs(builder: GraphBuilder, net: Message) -> None:
    """Net-level ``input`` blobs with ``input_shape`` or 4 ``input_dim`` values each (old deploy files)."""
    names = [str(n) for n in net.all("input")]
    shapes = [tuple(int(d) for d in s.all("dim")) for s in net.all("input_shape")]
    dims = [int(d) for d in net.all("input_dim")]
    if dims:
        if shapes:
            raise InvalidModelError("give net-level input_shape or input_dim, not both")
        if len(dims) != 4 * len(names):
            raise InvalidModelError(f"{len(dims)} input_dim values for {len(names)} input(s); expected 4 each")
        shapes = [tuple(dims[4 * i:4 * i + 4]) for i in range(len(names))]
    if len(shapes) != len(names):
        raise InvalidModelError(f"{len(names)} net-level input(s) but {len(shapes)} shape(s)")
    for name, shape in zip(names, shapes):
        builder.add_input(name, shape)


def _fuses_with_next(layers: list[Layer], index: int) -> bool:
    """A BatchNorm whose only reader is the Scale right after it becomes one BatchNormalization."""
    layer = layers[index]
    if layer.type != "BatchNorm" or index + 1 >= len(layers):
        return False
    following = layers[index + 1]
    return scale_fuses_into_batchnorm(layer, following) and _readers(layers, index, layer.tops[0]) == 1


def _readers(layers: list[Layer], index: int, blob: str) -> int:
    """How many later layers read the version of ``blob`` that layer ``index`` writes."""
    count = 0
    for later in layers[index + 1:]:
        count += blob in later.bottoms
        if blob in later.tops:
            break
    return count


def _bind_tops(builder: GraphBuilder, layer: Layer, outs: list[str]) -> None:
    if len(outs) != len(layer.tops):
        raise layer.error(f"produces {len(outs)} value(s) for {len(layer.tops)} top(s)")
    for top, value in zip(layer.tops, outs):
        builder.blobs[top] = value


def _net_outputs(builder: GraphBuilder, layers: list[Layer]) -> list[str]:
    """Caffe's rule: the blobs some layer writes and no later layer reads are the net's outputs."""
    available: dict[str, None] = {}
    for layer in layers:
        for bottom in layer.bottoms:
            available.pop(bottom, None)
        for top in layer.tops:
            available.pop(top, None)
            available[top] = None
    outputs: list[str] = []
    graph = builder.graph
    for blob in available:
        value = builder.blobs[blob]
        if value in graph.inputs or value in outputs:
            # NOTE: an alias (Dropout, Split) of an input or of another output needs a node of its own.
            value = builder.identity(f"{blob}/output", value)
        outputs.append(value)
    return outputs
