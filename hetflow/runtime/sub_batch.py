"""A batch run as several runs of fewer images each (depth first), where that measures faster.

A batch of 16 through SqueezeNet or MobileNet v2 writes activations of 25-77 MB a layer: every layer
reads its input back from memory, and the write-backs of the last layer's output compete with it. Run
as four runs of four images, each run's activations stay in the last-level cache. Whole runs on the
Zen 4 VM (2 threads, 2026-12-06), batch 16 against four runs of 4 images: squeezenet 62.4 / 58.6 ms,
mobilenetv2 70.6 / 66.2, densenet121 489.6 / 471.1; but resnet50 635 / 739 (its 100 MB of weights are
read again by every run) and googlenet 212 / 210 (four runs of 4 in a fresh session). So the split is
measured per model and batch (``hetflow tune MODEL --batch B``) and kept in the tuning cache (``SUB_BATCH_OP``
records), or set with the session's ``sub_batch``; without either, the cost model splits where a batch's
largest layer outgrows the last-level cache and the weights are small (``default_images``).

Only a graph whose images never meet is split: every input and output carries the batch symbol as its
first dimension (and no other symbol), and every op computes each image on its own (``SEPARABLE_OPS``,
with the axis rules of ``_separable_node``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping

import numpy as np

from hetflow.graph import Graph, Node
from hetflow.tuning.space import Workload

#: The tuning cache's op name for a model's measured images per run.
SUB_BATCH_OP = "Session/sub-batch"
#: Images per run measured against the whole batch (those that divide it, below it).
CANDIDATE_IMAGES = (2, 4, 8)

#: Ops that compute each image of their inputs on its own, whatever their attributes (axis rules for
#: the rest in ``_separable_node``).
SEPARABLE_OPS = frozenset({
    "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LRN",
    "BatchNormalization", "InstanceNormalization", "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "Elu",
    "Selu", "HardSigmoid", "Softplus", "PRelu", "Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Dropout",
    "Identity", "Gemm", "MatMul", "Pad", "Upsample", "Resize",
})  # fmt: skip
#: Ops whose ``axis`` must not be the batch's.
_AXIS_OPS = frozenset({"Concat", "Softmax", "LogSoftmax", "Flatten", "Split"})


def batch_symbol(graph: Graph) -> str | None:
    """The symbol every input and output of ``graph`` carries as its first dimension, where the graph
    computes each image on its own; None where it may not (or has no such symbol)."""
    values = [*graph.input_values(), *graph.output_values()]
    firsts = {v.shape[0] if v.shape else None for v in values}
    if len(firsts) != 1:
        return None
    symbol = firsts.pop()
    if not isinstance(symbol, str):
        return None
    if any(isinstance(d, str) for v in values for d in v.shape[1:]):
        return None
    return symbol if all(_separable_node(graph, node) for node in graph.nodes) else None


def _separable_node(graph: Graph, node: Node) -> bool:
    """Whether ``node`` computes each image (its inputs' first dimension) on its own."""
    if node.op_type in SEPARABLE_OPS:
        return node.op_type != "Gemm" or not getattr(node.attrs, "transA", 0)
    if node.op_type in _AXIS_OPS:
        axis = getattr(node.attrs, "axis", 1)
        info = graph.values.get(node.inputs[0])
        rank = len(info.shape) if info is not None and info.shape is not None else None
        if axis < 0:
            return rank is not None and axis + rank > 0
        return axis > 0
    if node.op_type == "Reshape":
        return _keeps_batch(graph, node)
    return False


def _keeps_batch(graph: Graph, node: Node) -> bool:
    """Whether a Reshape keeps the first dimension: its constant target shape starts with 0 (copy), or
    with -1 where every other dimension is given."""
    target = graph.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if target is None or target.ndim != 1 or target.size == 0:
        return False
    first, rest = int(target[0]), [int(d) for d in target[1:]]
    return first == 0 or (first == -1 and all(d > 0 for d in rest))


def graph_key(graph: Graph) -> str:
    """A short hash of what a run of ``graph`` does (its ops, attributes, wiring and weight shapes; not
    the weights' values): a sub-batch record's model."""
    digest = hashlib.sha256()
    for node in graph.nodes:
        digest.update(repr((node.op_type, node.inputs, node.outputs, node.attrs)).encode())
    for name, array in sorted(graph.initializers.items()):
        digest.update(repr((name, array.shape, str(array.dtype))).encode())
    return digest.hexdigest()[:16]


def sub_batch_workload(graph: Graph, batch: int, threads: str, mode: str) -> Workload:
    """The tuning cache's workload for ``graph``'s runs of ``batch`` images, in the thread arrangement
    ``threads`` (``ThreadArrangement.label``) and execution mode ``mode``."""
    return Workload(SUB_BATCH_OP, {"graph": graph_key(graph), "batch": batch, "threads": threads, "mode": mode})


def candidates(batch: int) -> list[int]:
    """Images per run worth measuring for a batch of ``batch``: ``CANDIDATE_IMAGES`` that divide it."""
    return [images for images in CANDIDATE_IMAGES if images < batch and batch % images == 0]


#: The share of the last-level cache that one run's largest layer (its images' inputs and outputs) may
#: fill when the cost model splits a batch (``default_images``): the weights and the next layer's
#: output need the rest.
CACHE_SHARE = 0.75
#: Weights, as a share of the last-level cache, up to which the cost model splits a batch: every run
#: reads them again.
MAX_WEIGHT_SHARE = 0.5


def default_images(graph: Graph, batch: int, cache_bytes: int) -> int | None:
    """Images per run the cost model splits a batch of ``batch`` into (None: the whole batch at once): the
    most of ``candidates`` whose largest layer fits ``CACHE_SHARE`` of the last-level cache, where the
    whole batch's does not and the weights are at most ``MAX_WEIGHT_SHARE`` of it.

    Why: the layers of a batch of 16 through SqueezeNet (4.7 MB of weights) and MobileNet v2 (13 MB)
    write 25-77 MB each, back to memory, and read them again; runs of 4 images keep them in the 32 MB
    cache. Fresh processes alternating, 2 threads, Zen 4 VM (2026-12-06), whole batch / 4 a run / 8 a run
    (minimums, ms): squeezenet 62.8 / 60.4 / 62.0, mobilenetv2 67.2 / 64.8 / 67.6. Networks with more
    weights re-read them every run and lost (ResNet-50, 97 MB: 635 -> 739 ms at 4 a run); ShuffleNet's
    largest layer at 16 images (28 MB) fits, and 4 a run measured 1.03x its whole batch.
    """
    weights = sum(int(array.nbytes) for array in graph.initializers.values())
    largest = largest_layer_bytes(graph)
    if cache_bytes <= 0 or not largest or weights > MAX_WEIGHT_SHARE * cache_bytes or batch * largest <= cache_bytes:
        return None
    fitting = [images for images in candidates(batch) if images * largest <= CACHE_SHARE * cache_bytes]
    return max(fitting) if fitting else None


def largest_layer_bytes(graph: Graph) -> int:
    """Bytes of one image's activations that the layer touching most of them reads and writes (its
    inputs and outputs that are not weights); 0 where a shape past the batch is not known."""
    largest = 0
    for node in graph.nodes:
        names = [name for name in (*node.inputs, *node.outputs) if name and name not in graph.initializers]
        touched = 0
        for name in names:
            value = graph.values.get(name)
            if value is None or value.shape is None or not all(isinstance(d, int) for d in value.shape[1:]):
                return 0
            touched += int(np.prod(value.shape[1:], dtype=np.int64)) * value.dtype.itemsize
        largest = max(largest, touched)
    return largest


def run_in_parts(
    run: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]], feeds: Mapping[str, np.ndarray], images: int
) -> list[np.ndarray]:
    """``run``'s results for the whole batch of ``feeds``, computed ``images`` images at a time (the feeds
    split on their first dimension, each output the parts' results end to end)."""
    batch = int(next(iter(feeds.values())).shape[0])
    parts = [
        run({name: value[start : start + images] for name, value in feeds.items()})
        for start in range(0, batch, images)
    ]
    return [np.concatenate([part[i] for part in parts]) for i in range(len(parts[0]))]


def check_sub_batch(sub_batch: int | None) -> int | None:
    """``sub_batch`` as the session takes it: None, or a positive int of images per run."""
    if sub_batch is None:
        return None
    if isinstance(sub_batch, bool) or not isinstance(sub_batch, int) or sub_batch < 1:
        raise ValueError(f"sub_batch must be a positive number of images per run or None, not {sub_batch!r}")
    return sub_batch


def fastest(times: Mapping[int, float]) -> int:
    """The images per run of the least seconds per batch in ``times``."""
    return min(times, key=lambda images: (times[images], -images))
