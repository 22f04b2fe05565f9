"""Split a Conv of a few groups into one Conv per group.

AlexNet (as Caffe trained it, on two GPUs) convolves in two groups: its 5x5 and two of its 3x3 layers.
The CPU device's Winograd and direct kernels take one group only, so such a layer ran on im2col, one
GEMM per group. Split into ``Split -> Conv per group -> Concat`` on the channel axis, each half is a
one-group Conv whose algorithm is chosen like any other's (direct for the 5x5, Winograd for the 3x3
ones), the Split copies the input's channels apart (a few MB), and the Concat costs nothing: the
memory plan lets each half write its slice of the output. AlexNet, two trees alternating
(``benchmarks/ab.py``): 0.88 of the time at batch 16, 0.91 at batch 1.

The split applies to a 2-D Conv of ``2 .. MAX_GROUPS`` groups that is not depthwise and whose window is
more than one tap (a grouped 1x1 Conv is one GEMM per group whichever way it runs), with constant
weights (and bias), no residual folded in, and channels read in order (no shuffle folded in), where
the cost model gives one group's Conv another algorithm than im2col at one image or at a batch (else
the parts would run as the grouped Conv does). Each part keeps the Conv's attributes (its fused
activation included) with one group.
"""

from __future__ import annotations

import numpy as np

from hetflow.graph import Graph, Node, Value
from hetflow.ops import registry
from hetflow.ops.attrs import replace
from hetflow.ops.conv import IM2COL, conv_window, heuristic_conv_algorithm
from hetflow.passes.rewrite import Rewriter

#: The most groups split: many small Convs (ResNeXt's 32 groups) would each run too little work.
MAX_GROUPS = 4


def split_conv_groups(graph: Graph) -> Graph:
    """Split every Conv that qualifies into one Conv per group (in place; returns graph)."""
    rewriter = Rewriter(graph)
    replacements: dict[int, list[Node]] = {}
    for node in list(graph.nodes):
        if _splits(rewriter, node):
            replacements[id(node)] = _split(rewriter, node)
    if replacements:
        graph.nodes = [part for node in graph.nodes for part in replacements.get(id(node), [node])]
    return rewriter.finish()


def _splits(rewriter: Rewriter, node: Node) -> bool:
    """Whether ``node`` is a Conv this pass splits (see the module docstring)."""
    if node.op_type != "Conv" or not 1 < node.attrs.group <= MAX_GROUPS:
        return False
    if node.attrs.residual or node.attrs.shuffle_groups or len(node.present_outputs()) != 1:
        return False
    w = rewriter.constant(node.inputs[1])
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    if w is None or w.ndim != 4 or w.shape[2] * w.shape[3] == 1 or w.shape[0] % node.attrs.group:
        return False
    if bias and rewriter.constant(bias) is None:
        return False
    x = rewriter.graph.values.get(node.inputs[0])
    if x is None or x.shape is None or len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape[1:]):
        return False
    if x.shape[1] != w.shape[1] * node.attrs.group or w.shape[1] == 1:
        return False
    return _part_leaves_im2col(node, x, w.shape)


def _part_leaves_im2col(node: Node, x: Value, w_shape: tuple[int, ...]) -> bool:
    """Whether the cost model gives one group's Conv another algorithm than im2col, for one image or a
    batch: otherwise the parts would run as the grouped Conv does, one GEMM per group, plus two nodes."""
    groups = node.attrs.group
    spec = conv_window(node.attrs, w_shape)
    for batch in (1, 2):
        part = (batch, int(x.shape[1]) // groups, *x.shape[2:])
        if heuristic_conv_algorithm(spec, part, w_shape[0] // groups, 1, x.dtype) != IM2COL:
            return True
    return False


def _split(rewriter: Rewriter, conv: Node) -> list[Node]:
    """The nodes that replace ``conv``: a Split of X's channels, a Conv per group, a Concat."""
    graph, groups = rewriter.graph, conv.attrs.group
    w = rewriter.constant(conv.inputs[1])
    assert w is not None
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
    bias = rewriter.constant(bias_name)
    kernels = w.shape[0] // groups
    x, y = graph.values[conv.inputs[0]], graph.values.get(conv.outputs[0])
    split = Node("Split", rewriter.fresh_name(f"{conv.name}_split"), [conv.inputs[0]], [],
                 registry.get("Split").Attrs(axis=1))  # fmt: skip
    parts: list[Node] = []
    for group in range(groups):
        piece = rewriter.fresh_name(f"{conv.name}_x{group}")
        split.outputs.append(piece)
        graph.values[piece] = Value(piece, _with_channels(x.shape, w.shape[1]), x.dtype)
        inputs = [piece, _constant(rewriter, f"{conv.name}_w{group}", w[group * kernels : (group + 1) * kernels])]
        if bias is not None:
            inputs.append(_constant(rewriter, f"{conv.name}_b{group}", bias[group * kernels : (group + 1) * kernels]))
        output = rewriter.fresh_name(f"{conv.name}_y{group}")
        graph.values[output] = Value(output, _with_channels(y.shape if y else None, kernels), x.dtype)
        parts.append(Node("Conv", rewriter.fresh_name(f"{conv.name}_g{group}"), inputs, [output],
                          replace(conv.attrs, group=1)))  # fmt: skip
    concat = Node("Concat", rewriter.fresh_name(f"{conv.name}_concat"), [p.outputs[0] for p in parts],
                  [conv.outputs[0]], registry.get("Concat").Attrs(axis=1))  # fmt: skip
    rewriter.remove(conv)
    for node in (split, *parts, concat):
        for name in node.present_inputs():
            rewriter.readers.setdefault(name, []).append(node)
        for name in node.present_outputs():
            rewriter.producers[name] = node
    return [split, *parts, concat]


def _constant(rewriter: Rewriter, hint: str, array: np.ndarray) -> str:
    """A new initializer holding a copy of ``array``; its name."""
    name = rewriter.fresh_name(hint)
    rewriter.add_constant(name, np.ascontiguousarray(array))
    return name


def _with_channels(shape: tuple | None, channels: int) -> tuple | None:
    """``shape`` (N, C, H, W) with ``channels`` channels; None where unknown."""
    return None if shape is None else (shape[0], channels, *shape[2:])
