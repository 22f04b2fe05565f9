"""The training form of an inference Graph, and back.

Training changes three things and nothing else: BatchNormalization normalises with the batch's
statistics and emits updated running averages (``training_mode=1``), Dropout draws a seeded mask
(``training_mode`` input set, mask output named), and the loss reads the scores before a final Softmax
or LogSoftmax when it fuses that normalisation itself (cross-entropy). The inference graph is never
modified: ``export`` writes it with the trained initializers, so BatchNormalization is back in its
inference form with the running statistics the training steps accumulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetflow.graph import Graph, Value
from hetflow.ops import registry
from hetflow.ops.activation import FusedActivation
from hetflow.ops.attrs import replace
from hetflow.ops.pool import has_indices
from hetflow.passes.rewrite import Rewriter
from hetflow.train.kernels import computes_pool_indices

#: dtypes whose MaxPools get Indices for the backward pass (the compiled training MaxPool's).
POOL_INDEX_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass
class TrainingGraph:
    """A training-form copy of an inference graph.

    Attributes:
        graph: the training-form graph (same value and initializer names as the inference graph).
        scores: the value the loss reads (the model's output, or the input of its final Softmax).
        output: the inference graph's output ``scores`` stands for.
        running: BatchNormalization running-statistic output -> the initializer it updates.
        dropout_nodes: names of the Dropout nodes whose seed changes every step.
    """

    graph: Graph
    scores: str
    output: str
    running: dict[str, str] = field(default_factory=dict)
    dropout_nodes: list[str] = field(default_factory=list)


def training_graph(graph: Graph, reads_logits: bool) -> TrainingGraph:
    """The training form of ``graph`` (its first output is the one trained).

    Args:
        graph: a shape-inferred inference graph (not optimised: fused nodes have no backward rule).
        reads_logits: the loss applies its own softmax, so a final Softmax / LogSoftmax is skipped.
    """
    train = graph.copy()
    output = graph.outputs[0]
    scores = output
    producer = train.producers().get(output)
    if reads_logits and producer is not None and producer.op_type in ("Softmax", "LogSoftmax"):
        scores = producer.inputs[0]
    result = TrainingGraph(train, scores, output)
    for node in train.nodes:
        if node.op_type == "BatchNormalization" and not node.attrs.training_mode:
            node.attrs = replace(node.attrs, training_mode=1)
            outputs = [node.outputs[0]]
            for slot, initializer in ((3, node.inputs[3]), (4, node.inputs[4])):
                name = f"{node.name}__running_{'mean' if slot == 3 else 'var'}"
                outputs.append(name)
                train.values[name] = Value(
                    name, train.values[initializer].shape, train.values[initializer].dtype
                )
                result.running[name] = initializer
            node.outputs = outputs
        elif node.op_type == "Dropout":
            inputs = list(node.inputs) + [""] * (3 - len(node.inputs))
            if not inputs[1]:
                inputs[1] = _constant(train, f"{node.name}__ratio", np.array(0.5, np.float32))
            inputs[2] = _constant(train, f"{node.name}__training", np.array(True))
            node.inputs = inputs
            if len(node.outputs) < 2 or not node.outputs[1]:
                mask = f"{node.name}__mask"
                node.outputs = [node.outputs[0], mask]
                train.values[mask] = Value(mask, train.values[node.outputs[0]].shape, np.dtype(bool))
            result.dropout_nodes.append(node.name)
    train.outputs = [scores]
    train.remove_unused()
    # NOTE: remove_unused keeps only what the scores depend on; the running-statistic outputs are
    # written by nodes it keeps, so they survive.
    return result


def fuse_conv_relu(graph: Graph) -> int:
    """Fold each Relu that alone reads a Conv's output into that Conv (``fused`` Relu), in place;
    returns how many were folded.

    The CPU's training Conv applies the Relu while each chunk of Y is in cache and the Relu's mask to
    each chunk of dY inside its backward pass, so the two separate passes over the activation (and the
    Conv's own output, kept only for the Relu's backward) go. Conv's backward rules differentiate a
    fused Relu (``hetflow.ops.conv.Conv.backward``); no other fused activation has one.
    """
    rewriter = Rewriter(graph)
    fused = 0
    for node in list(graph.nodes):
        if node.op_type != "Relu" or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        source = node.inputs[0]
        producer = rewriter.producers.get(source)
        if producer is None or producer.op_type != "Conv" or producer.attrs.fused is not None:
            continue
        if producer.outputs[:1] != [source] or not rewriter.only_reader_is(source, node):
            continue
        producer.attrs = replace(producer.attrs, fused=FusedActivation("Relu"))
        rewriter.take_over_output(producer, source, node)
        fused += 1
    rewriter.finish()
    return fused


def record_pool_indices(graph: Graph) -> int:
    """Give each 2-D float MaxPool without an Indices output one (``{node}__indices``, int64, Y's
    shape), in place; returns how many got one.

    The CPU's training MaxPool fills them in the pass that computes Y (``hetflow.train.kernels``) and the
    CPU's backward rule scatters dY by them, where it searched every window of X again. Measured on the
    mentee at batch 128, one core, two A/B runs in one process (minimum of 10 and of 20 steps): the
    three pools' forward 11.9 -> 18.5 and 17.1 -> 26.6 ms a step, their backward 25.3 -> 10.0 and 28.4
    -> 12.7 ms (6-9 ms a step saved). NOTE: the Indices are int64, 8 bytes a pooled output, kept
    for the backward pass (the mentee's: 14 MB at batch 128).
    """
    added = 0
    for node in graph.nodes:
        if node.op_type != "MaxPool" or node.domain not in ("", "ai.onnx") or has_indices(node):
            continue
        x = graph.values.get(node.inputs[0])
        if x is None or x.dtype not in POOL_INDEX_DTYPES or not computes_pool_indices(node):
            continue
        name = f"{node.name}__indices"
        graph.values[name] = Value(name, graph.values[node.outputs[0]].shape, np.dtype(np.int64))
        node.outputs = [node.outputs[0], name]
        added += 1
    return added


def set_dropout_seed(train: TrainingGraph, seed: int) -> None:
    """Give every Dropout node its own seed for this step (a fresh, reproducible mask per step)."""
    for offset, name in enumerate(train.dropout_nodes):
        node = train.graph.node(name)
        node.attrs = replace(node.attrs, seed=(seed * 1009 + offset) % 2**31)


def parameter_names(graph: Graph) -> list[str]:
    """Float initializers some node reads at a differentiable input: the learnable parameters, in the
    order nodes read them."""
    names: list[str] = []
    for node in graph.nodes:
        opdef = registry.get(node.op_type, node.domain)
        for index in opdef.differentiable_inputs(node):
            if index >= len(node.inputs):
                continue
            name = node.inputs[index]
            array = graph.initializers.get(name)
            if array is not None and array.dtype.kind == "f" and name not in names:
                names.append(name)
    return names


def _constant(graph: Graph, name: str, array: np.ndarray) -> str:
    graph.initializers[name] = array
    graph.values[name] = Value(name, tuple(array.shape), array.dtype)
    return name
