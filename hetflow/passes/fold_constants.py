"""Constant folding, including shape subgraphs over a symbolic batch.

Nodes whose inputs are all constant are evaluated once with the CPU reference kernels and replaced by
initializers. ``Shape`` of a value whose shape holds a symbol (the batch ``N``) folds to a *symbolic*
constant (a numpy object array such as ``["N", 256, 6, 6]`` whose symbols are ``Symbol`` strings, so that
real string tensors are never taken for shapes); Gather / Unsqueeze / Concat / Slice / Squeeze / Reshape /
Flatten / Identity and Casts to integer types over it stay symbolic (and become int64 again once every
symbol is gone), and when it reaches Reshape's shape input it is rewritten into ONNX's own spelling of
"copy this dimension" (0) or "infer this one" (-1). Chains whose symbolic value is needed elsewhere are
kept and run at execution time.
"""

from __future__ import annotations

import numpy as np

from hetflow.graph import Graph, Node, Value
from hetflow.graph.dtypes import from_onnx


class Symbol(str):
    """A symbolic dimension (e.g. the batch ``"N"``) inside a folded shape vector.

    A subclass of ``str`` so that it reads like the shape's own symbol, and a distinct type so that a
    real string tensor is never mistaken for a symbolic shape.
    """


# Ops whose evaluation at load could change behaviour or cost far more than it saves.
_NEVER_FOLD = frozenset({"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"})


def fold_constants(graph: Graph) -> Graph:
    """Fold constant and shape-only subgraphs into initializers (in place; returns graph)."""
    import hetflow.devices.cpu  # noqa: F401  (registers the kernels)
    from hetflow.devices.cpu.table import CPU_KERNELS  # the CPU kernels are the reference evaluator

    known: dict[str, np.ndarray] = dict(graph.initializers)
    folded: set[int] = set()
    for index, node in enumerate(graph.nodes):
        result = _evaluate(graph, node, known, CPU_KERNELS)
        if result is None:
            continue
        for name, array in zip(node.outputs, result):
            if name and array is not None:
                known[name] = array
        folded.add(index)

    keep = _nodes_to_keep(graph, known, folded)
    kept_nodes: list[Node] = []
    for index, node in enumerate(graph.nodes):
        if index in keep:
            kept_nodes.append(node)
            _materialise_inputs(graph, node, known)
    for name in graph.outputs:
        if name in known and not _is_symbolic(known[name]) and name not in graph.inputs:
            _make_initializer(graph, name, known[name])
    graph.nodes = kept_nodes
    graph.remove_unused()
    return graph


def _evaluate(graph: Graph, node: Node, known: dict[str, np.ndarray], kernels) -> list | None:
    if node.op_type in _NEVER_FOLD:
        return None
    if node.op_type == "Shape":
        return _fold_shape(graph, node)
    if not all(name in known for name in node.present_inputs()):
        return None
    kernel = kernels.lookup(node)
    if kernel is None:
        return None
    inputs = [known[name] if name else None for name in node.inputs]
    symbolic = any(_is_symbolic(x) for x in inputs if x is not None)
    if symbolic and node.op_type == "Cast":
        return _cast_symbolic(node, inputs[0])
    if symbolic and node.op_type not in _SYMBOLIC_SAFE:
        return None
    try:
        with np.errstate(all="ignore"):
            outputs = list(kernel.fn(node, inputs))
    except (ValueError, TypeError, IndexError, ArithmeticError):
        return None
    return [_concrete(x) if x is not None else None for x in outputs]


def _concrete(array: np.ndarray) -> np.ndarray:
    """A symbolic-shape object array whose symbols were all dropped (e.g. by Gather) as int64 again."""
    if array.dtype != object or array.size == 0:
        return array
    if not all(isinstance(v, (int, np.integer)) for v in array.ravel()):
        return array  # symbols remain, or a real string tensor
    return array.astype(np.int64)


def _cast_symbolic(node: Node, array: np.ndarray | None) -> list[np.ndarray] | None:
    """Cast of a symbolic shape to an integer type: the symbols stand for integers, so they stay."""
    try:
        target = from_onnx(node.attrs.to)
    except TypeError:
        return None
    if array is None or target.kind not in "iu":
        return None
    result = np.empty(array.shape, dtype=object)
    result.flat[:] = [v if isinstance(v, Symbol) else int(v) for v in array.ravel()]
    return [result]


# Ops that only move elements around, so they are exact on object arrays holding symbols.
_SYMBOLIC_SAFE = frozenset(
    {"Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Identity", "Reshape", "Flatten"}
)


def _fold_shape(graph: Graph, node: Node) -> list[np.ndarray] | None:
    value = graph.values.get(node.inputs[0])
    if value is None or value.shape is None:
        return None
    dims = list(value.shape)
    rank = len(dims)
    start = getattr(node.attrs, "start", 0) or 0
    end = getattr(node.attrs, "end", None)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else min(max(end + rank if end < 0 else end, 0), rank)
    picked = dims[start:end]
    if all(isinstance(d, int) for d in picked):
        return [np.array(picked, dtype=np.int64)]
    symbolic = np.empty(len(picked), dtype=object)
    symbolic[:] = [Symbol(d) if isinstance(d, str) else d for d in picked]
    return [symbolic]


def _is_symbolic(array: np.ndarray) -> bool:
    return array.dtype == object and any(isinstance(v, Symbol) for v in array.ravel())


def _nodes_to_keep(graph: Graph, known: dict[str, np.ndarray], folded: set[int]) -> set[int]:
    """Unfolded nodes, plus folded producers of symbolic values that some kept node really needs."""
    producer_index = {out: i for i, n in enumerate(graph.nodes) for out in n.present_outputs()}
    keep = {i for i in range(len(graph.nodes)) if i not in folded}
    work = list(keep)

    def need(value_name: str) -> None:
        index = producer_index.get(value_name)
        if index is not None and index not in keep:
            keep.add(index)
            work.append(index)

    for name in graph.outputs:
        if name in known and _is_symbolic(known[name]):
            need(name)
    while work:
        node = graph.nodes[work.pop()]
        for position, name in enumerate(node.inputs):
            if not name or name not in known or not _is_symbolic(known[name]):
                continue
            if _reshape_target(graph, node, position, known[name]) is None:
                need(name)
    return keep


def _reshape_target(graph: Graph, node: Node, position: int, shape: np.ndarray) -> np.ndarray | None:
    """Reshape's symbolic target rewritten with 0 (copy) / -1 (infer), or None when impossible."""
    if node.op_type != "Reshape" or position != 1:
        return None
    data = graph.values.get(node.inputs[0])
    if data is None or data.shape is None:
        return None
    allow_zero = getattr(node.attrs, "allowzero", 0)
    target: list[int] = []
    inferred = False
    for axis, dim in enumerate(shape.tolist()):
        if isinstance(dim, str):
            if not allow_zero and axis < len(data.shape) and data.shape[axis] == dim:
                target.append(0)
            elif not inferred and -1 not in shape.tolist():
                target.append(-1)
                inferred = True
            else:
                return None
        else:
            target.append(int(dim))
    return np.array(target, dtype=np.int64)


def _materialise_inputs(graph: Graph, node: Node, known: dict[str, np.ndarray]) -> None:
    """Turn the folded values a kept node reads into initializers (symbolic ones via Reshape rules)."""
    for position, name in enumerate(node.inputs):
        if not name or name not in known or name in graph.initializers:
            continue
        array = known[name]
        if _is_symbolic(array):
            target = _reshape_target(graph, node, position, array)
            if target is None:
                continue  # its producer chain is kept and runs at execution time
            new_name = f"{name}__bound_{node.name}"
            _make_initializer(graph, new_name, target)
            node.inputs[position] = new_name
        else:
            _make_initializer(graph, name, array)


def _make_initializer(graph: Graph, name: str, array: np.ndarray) -> None:
    # NOTE: np.ascontiguousarray would turn a 0-d array into a 1-d one.
    graph.initializers[name] = np.ascontiguousarray(array).reshape(array.shape)
    graph.values[name] = Value(name, tuple(array.shape), array.dtype)
