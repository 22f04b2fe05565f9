"""Predict a model's per-layer time and its memory on a device from a DeviceProfile.

The estimator looks at exactly what a session would run: the optimised graph of an
``InferenceSession`` and the kernel (algorithm) its planner chose for every node. Each node's cost
comes from its op definition (``hetflow.ops.cost.node_costs``: MACs, bytes, the im2col GEMM,
workspace), its time from the profile's model of that (op, algorithm), and the memory from a replay
of the executor's liveness (``Plan.release_after``) with each kernel's measured transient memory.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.base import Kernel
from hetflow.errors import HetflowError
from hetflow.estimate.cache import HitCurve, Touch, cold_bytes
from hetflow.estimate.models import FALLBACK_COEF, bandwidth, features
from hetflow.estimate.profile import DeviceProfile, OpModel, ProfileError, default_profile_path
from hetflow.frontends import ModelSource, describe_source
from hetflow.graph import Graph, Node
from hetflow.graph.shapes import is_static
from hetflow.ops.base import Cost, GemmDims, TensorInfo, planned_infos
from hetflow.ops.cost import node_costs
from hetflow.passes import bind_batch
from hetflow.runtime.memory import MemoryPlan
from hetflow.runtime.replay import VIEW_OPS
from hetflow.runtime.session import InferenceSession

#: Transient memory of a kernel the profile has never seen: its outputs and its workspace.
FALLBACK_TRANSIENT = OpModel(coef=list(FALLBACK_COEF), transient=[0.0, 1.0, 1.0, 1.0], retained=1.0)


@dataclass
class LayerEstimate:
    """One node of the optimised graph: what it computes and how long it should take.

    ``bytes`` is what the node reads and writes once (weights included); ``measured_ms`` is filled by
    validation.
    """

    name: str
    op: str
    algorithm: str
    output_shape: list[int]
    params: int
    macs: int
    gemm: GemmDims | None
    bytes: int
    workspace_bytes: int
    predicted_ms: float
    measured_ms: float | None = None

    def error(self) -> float | None:
        """(predicted - measured) / measured, once measured."""
        if self.measured_ms is None or self.measured_ms <= 0:
            return None
        return (self.predicted_ms - self.measured_ms) / self.measured_ms


@dataclass
class MemoryEstimate:
    """Memory, two ways.

    Augur's accounting (Table 4): every weight and bias, every intermediate blob, and the sum of all
    im2col buffers (every Conv's, whatever algorithm runs it), as if everything were allocated at once. hetflow's planned peak: the most memory
    live at any moment of hetflow's own run, values released after their last reader, plus each
    kernel's transient scratch; ``peak_bytes`` excludes weights, kernel caches kept across runs
    (``cache_bytes``: Winograd's transformed weights) and the caller's inputs (what a warm run
    allocates), ``planned_total_bytes`` includes them.
    """

    weights_bytes: int
    data_bytes: int
    workspace_bytes: int
    input_bytes: int
    peak_bytes: int
    peak_layer: str
    limit_bytes: int | None = None
    cache_bytes: int = 0
    measured_peak_bytes: int | None = None
    #: of ``weights_bytes``, those the session maps from the model file and does not hold (large fully
    #: connected weights held only as the dense kernel's panels, counted in ``cache_bytes``)
    mapped_bytes: int = 0

    @property
    def augur_total_bytes(self) -> int:
        return self.weights_bytes + self.data_bytes + self.workspace_bytes

    @property
    def planned_total_bytes(self) -> int:
        return self.weights_bytes - self.mapped_bytes + self.cache_bytes + self.input_bytes + self.peak_bytes

    def fits(self) -> bool | None:
        """Whether hetflow's planned total fits the limit (None without a limit)."""
        if self.limit_bytes is None:
            return None
        return self.planned_total_bytes <= self.limit_bytes


@dataclass
class Estimate:
    """The prediction for one model, batch size and device profile."""

    model: str
    batch: int
    device: str
    profile: DeviceProfile
    layers: list[LayerEstimate]
    memory: MemoryEstimate
    overhead_ms: float
    measured_ms: float | None = None
    notes: list[str] = field(default_factory=list)
    #: what the layers lose inside a whole run against each timed alone: data in memory that a layer
    #: run over and over finds in cache (``in_run_seconds``).
    in_run_ms: float = 0.0

    @property
    def predicted_ms(self) -> float:
        """Whole-model latency: every layer, what they lose inside a run, and the executor's per-node
        and per-run overhead."""
        return sum(layer.predicted_ms for layer in self.layers) + self.in_run_ms + self.overhead_ms

    @property
    def validated(self) -> bool:
        return self.measured_ms is not None

    def totals(self) -> dict[str, Any]:
        """The ``totals`` object of the JSON report."""
        totals: dict[str, Any] = {
            "params": sum(layer.params for layer in self.layers),
            "macs": sum(layer.macs for layer in self.layers),
            "weights_bytes": self.memory.weights_bytes,
            "data_bytes": self.memory.data_bytes,
            "workspace_bytes": self.memory.workspace_bytes,
            "predicted_ms": self.predicted_ms,
        }
        if self.measured_ms is not None:
            totals["measured_ms"] = self.measured_ms
        return totals

    def op_type_times(self, measured: bool = False) -> list[tuple[str, float, float]]:
        """(op type, ms, share of the layers' total) sorted by time, largest first."""
        times: dict[str, float] = defaultdict(float)
        for layer in self.layers:
            value = layer.measured_ms if measured else layer.predicted_ms
            times[layer.op] += value or 0.0
        total = sum(times.values()) or 1.0
        return [(op, ms, ms / total) for op, ms in sorted(times.items(), key=lambda item: -item[1])]

    def to_dict(self) -> dict[str, Any]:
        """The JSON report (the schema ``hetflow estimate --json`` prints)."""
        layers = []
        for layer in self.layers:
            row: dict[str, Any] = {
                "name": layer.name,
                "op": layer.op,
                "output_shape": layer.output_shape,
                "params": layer.params,
                "macs": layer.macs,
                "gemm": None if layer.gemm is None else {"n": layer.gemm.n, "m": layer.gemm.m, "k": layer.gemm.k},
                "bytes": layer.bytes,
                "predicted_ms": layer.predicted_ms,
            }
            if self.measured_ms is not None:
                row["measured_ms"] = layer.measured_ms
            layers.append(row)
        return {"model": self.model, "batch": self.batch, "device": self.device, "layers": layers,
                "totals": self.totals()}


# -- profiles ------------------------------------------------------------------------------------
def resolve_profile(device: str | os.PathLike[str] | DeviceProfile, quiet: bool = False) -> DeviceProfile:
    """The profile ``device`` names: a DeviceProfile, a JSON file, or a device id with a saved profile.

    For a device id without a saved profile, a quick calibration runs (a few seconds), is saved as
    that device's default, and a note says to run ``hetflow calibrate`` for an accurate one.
    """
    if isinstance(device, DeviceProfile):
        return device
    text = os.fspath(device)
    if text.endswith(".json") or os.path.sep in text or os.path.exists(text):
        return DeviceProfile.load(text)
    from hetflow.devices.registry import get_device

    hardware = get_device(text)
    path = default_profile_path(hardware.id, hardware.fingerprint())
    if path.exists():
        try:
            return DeviceProfile.load(path)
        except ProfileError as error:
            print(f"hetflow: warning: ignoring {path}: {error}", file=sys.stderr)
    if not quiet:
        print(
            f"hetflow: no calibrated profile for '{hardware.id}' on this machine; running a quick "
            f"calibration (run `hetflow calibrate --device {hardware.id}` for an accurate one)",
            file=sys.stderr,
        )
    from hetflow.estimate.calibrate import calibrate

    profile = calibrate(hardware.id, quick=True)
    profile.save(path)
    return profile


# -- per-layer keys --------------------------------------------------------------------------------
#: Kernel algorithm names that are not a method of their own: a single kernel for every case
#: ("default") or a run-time dispatcher ("auto"). Their layers are keyed by the op's own choice.
DISPATCHERS = ("default", "auto")


#: Marks the key of a layer that a spinning run splits (``hetflow.runtime.executor.spins``): timed as such
#: runs call it, it has a model of its own.
SPIN_MARK = "@spin"
#: The layers a spinning run splits: one image's direct Conv shared out by kernel blocks, the fully
#: connected layers' products split by columns (im2col's and Winograd's GEMMs too, with BLAS held at one
#: thread in a large network's run), and the planes of the depthwise Conv, the pools, Winograd's
#: transforms, BatchNormalization and LRN shared out on the spinning pool (``threads.spin_split``;
#: elsewhere they split on the Python pool only from 1 Mi outputs beside BLAS's threads, so their plain
#: models are about one thread's time).
SPIN_SPLIT_KEYS = frozenset({
    "Conv/direct_fma", "Gemm/default", "MatMul/default", "Conv/depthwise", "MaxPool/default", "AveragePool/default",
    "MaxPool/same", "AveragePool/same", "Conv/im2col", "Conv/winograd_f23", "Conv/winograd_f43", "BatchNormalization/default", "LRN/default",
    # The 2x2 windows that tile X (``jit_pool.pool_job``'s tiles job): VGG-19's pools, left out, were
    # priced from probes that ran them on one thread, at 2-3.4x their time in its spinning batch runs.
    "MaxPool/tiles",
})  # fmt: skip


#: Marks the key of a layer that a spinning run of a batch splits (``executor.spins``; ``SPIN_SPLIT_KEYS``):
#: a batch's direct Conv shares out whole images where one image shares out its kernel blocks, and a
#: batch's products and planes run nearer their peak, so the batch probes (``SPIN_BATCH_CONVS``, the
#: small networks' pools at batch 16) are fitted apart from the batch-1 ones.
SPIN_BATCH_MARK = "@spin-batch"
#: Marks the key of a pointwise Conv that a run on its own or spinning threads gives to hetflow's own
#: GEMM (``kernels.own_gemm``), of one image's im2col Conv that a spinning run multiplies there in
#: bands, and of a fully connected layer at a batch on the dense kernel (``kernels.dense``): its epilogue
#: is in the product, and its weights are not packed anew each call, so it has a model of its own.
OWN_GEMM_MARK = "@own"
#: Marks the key of a fully connected layer at a batch on the dense kernel in a spinning run, which
#: shares its columns out on the pool whatever its size; elsewhere it splits them over the Python pool
#: only from ``dense.MIN_MACS_PER_SPLIT`` multiply-adds. With one model for both, LeNet's 800 -> 500
#: layer at batch 16 (0.069 ms in its spinning run, 0.138 on one thread) came out +86% and the whole
#: network +11-13% in three calibrations running.
DENSE_SPIN_MARK = "@own-spin"
#: Marks the key of one image's deep im2col Conv that a spinning run builds as whole columns and
#: multiplies on the tile GEMM (``own_gemm.columns_geometry``). Its own model: fitted together with the
#: bands, whose time goes to building columns more than to the product, ResNet-50's first layer (bands)
#: was priced 63% over and its deep 1x1 stride-2 projections (columns) 19-24% over.
COLUMNS_MARK = "@columns"
#: Marks the key of an im2col or Winograd Conv in a run on its own threads (a batch's), whose products
#: run on the tile GEMM there (``own_gemm.bands_on_own_threads``, ``own_gemm.product_on_own_threads``)
#: and on OpenBLAS elsewhere: at ~210 against ~100 GMAC/s on the Zen 5 VM, one model for both priced
#: VGG-19's Winograd layers at batch 16 53% over.
TILES_MARK = "@tiles"
#: The keys a run on its own threads gives ``TILES_MARK``.
TILES_KEYS = frozenset({"Conv/im2col", "Conv/winograd_f23", "Conv/winograd_f43"})
#: Marks the key of a per-plane kernel (pools, LRN) in a run on its own threads, which shares its planes
#: out over them from 32 Ki outputs a thread (``threads.parallel_planes``); beside BLAS's threads, as a
#: plain probe times it, only from 1 Mi. With one model for both, the pools of VGG-19 and Inception v2
#: at batch 16 were priced at 1.4-2.8x their time, AlexNet's LRN at 1.9x.
THREADS_MARK = "@threads"
#: The keys a run on its own threads gives ``THREADS_MARK``.
THREADS_KEYS = frozenset({
    "MaxPool/default", "MaxPool/tiles", "MaxPool/same", "AveragePool/default", "AveragePool/same", "LRN/default",
})  # fmt: skip
#: Marks the key of a direct Conv over a strided window, which runs on the input's phase planes
#: (``jit_direct_phases``: the image stems): filled per image and copied out a kernel block at a time, on
#: 3 channels. Its samples in the stride-1 model pulled that model's elementwise term from 0.05-0.4 to
#: 1.3, and VGG-19's 3 -> 64 first layer at batch 16 came out +98%.
PHASES_MARK = "@phases"
#: The marks of layers whose products run on hetflow's own GEMMs (the tile GEMM, the dense kernel), not
#: through BLAS's GEMM model.
OWN_PRODUCT_MARKS = (OWN_GEMM_MARK, DENSE_SPIN_MARK, COLUMNS_MARK)
#: Every mark a key may end with.
MARKS = (
    SPIN_BATCH_MARK, SPIN_MARK, DENSE_SPIN_MARK, OWN_GEMM_MARK, COLUMNS_MARK, TILES_MARK, THREADS_MARK, PHASES_MARK,
)


def key_algorithm(key: str) -> str:
    """The algorithm named in a profile key (``"Conv/direct_fma@spin"`` -> ``"direct_fma"``)."""
    return unmarked(key).split("/", 1)[1]


def unmarked(key: str) -> str:
    """A profile key without its mark (``"MaxPool/default@threads"`` -> ``"MaxPool/default"``)."""
    for mark in MARKS:
        key = key.removesuffix(mark)
    return key


def layer_key(
    node: Node, kernel: Kernel, graph: Graph | None = None, spinning: bool = False, split: bool = False
) -> str:
    """The profile key of a node run by ``kernel``: ``"OpType/algorithm"``, marked ``SPIN_MARK`` where a
    spinning run (``spinning``) splits the layer, ``OWN_GEMM_MARK`` where a run on its own threads
    (``split``) or a spinning one gives a pointwise Conv to hetflow's own GEMM, or a spinning run an
    im2col Conv in bands, ``COLUMNS_MARK`` where a spinning run gives it there as whole columns,
    ``TILES_MARK`` where a run on its own threads multiplies an im2col or Winograd Conv there,
    ``THREADS_MARK`` where such a run shares a pool's or an LRN's planes out over its threads,
    ``SPIN_BATCH_MARK`` where a spinning run of a batch splits the layer, ``DENSE_SPIN_MARK`` for a
    fully connected layer at a batch on the dense kernel in a spinning run (``OWN_GEMM_MARK`` elsewhere),
    and ``PHASES_MARK`` for a direct Conv over a strided window, however the run splits it.

    The algorithm is the kernel's own. A kernel that covers several methods (``default``, ``auto``) is
    refined by the method the op's cost model would pick (Conv's heuristic), so pointwise, depthwise,
    im2col and Winograd convolutions are told apart whichever kernel the plan holds; an LSTM whose steps
    run as one compiled loop (``jit_lstm.runs_sequence``) is ``LSTM/sequence``, and one whose steps a
    spinning run splits (``jit_lstm.runs_spinning``) ``LSTM/default@spin``, or ``LSTM/vector@spin`` for
    one column (a GEMV a step).
    """
    if spinning and node.op_type == "LSTM" and graph is not None and _spinning_lstm(node, graph):
        return ("LSTM/vector" if _lstm_batch(node, graph) == 1 else "LSTM/default") + SPIN_MARK
    key = _unmarked_key(node, kernel, graph)
    if key == "Conv/direct_fma" and graph is not None and window_strided(node, graph):
        return key + PHASES_MARK
    if (split or spinning) and key == "Conv/pointwise" and graph is not None and _runs_own_gemm(node, graph):
        return key + OWN_GEMM_MARK
    if key == "Gemm/default" and graph is not None and _runs_dense(node, graph):
        return key + (DENSE_SPIN_MARK if spinning else OWN_GEMM_MARK)
    if spinning and key == "Conv/im2col" and graph is not None:
        way = _im2col_on_tiles(node, graph)
        if way is not None:
            return key + way
    if split and not spinning and key in TILES_KEYS and graph is not None and _float32_conv(node, graph):
        return key + TILES_MARK
    if split and not spinning and key in THREADS_KEYS:
        return key + THREADS_MARK
    if not spinning or key not in SPIN_SPLIT_KEYS:
        return key
    return key + (SPIN_BATCH_MARK if graph is not None and _batch_of(node, graph) > 1 else SPIN_MARK)


def _batch_of(node: Node, graph: Graph) -> int:
    """The leading dimension of ``node``'s first input where it is concrete, else 1."""
    value = graph.values.get(node.inputs[0])
    if value is None or not value.shape or not isinstance(value.shape[0], int):
        return 1
    return int(value.shape[0])


def _im2col_on_tiles(node: Node, graph: Graph) -> str | None:
    """How the im2col Conv ``node`` runs on hetflow's own GEMM in a spinning run: ``OWN_GEMM_MARK`` in
    bands, ``COLUMNS_MARK`` as whole columns (``own_gemm.im2col_on_tiles``); None on BLAS."""
    from hetflow.devices.cpu.kernels import own_gemm

    x, w = graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1])
    if x is None or w is None or x.shape is None or w.shape is None:
        return None
    infos = [TensorInfo(tuple(v.shape), np.dtype(v.dtype)) for v in (x, w)]
    found = own_gemm.im2col_on_tiles(node, *infos)
    if found is None:
        return None
    return OWN_GEMM_MARK if found[0] == own_gemm.BANDS else COLUMNS_MARK


def _float32_conv(node: Node, graph: Graph) -> bool:
    """Whether the Conv ``node``'s X and W are what the tile GEMM multiplies (``own_gemm.takes``)."""
    from hetflow.devices.cpu.kernels import own_gemm

    x, w = graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1])
    return x is not None and w is not None and own_gemm.takes(x.dtype, w.dtype)


def _runs_own_gemm(node: Node, graph: Graph) -> bool:
    """Whether the pointwise Conv ``node`` runs on hetflow's own GEMM in a run on its own threads."""
    return _conv_shapes(node, graph) is not None and _float32_conv(node, graph)


def _runs_dense(node: Node, graph: Graph) -> bool:
    """Whether the Gemm ``node`` runs on hetflow's dense kernel, its weights packed (``dense.runs_dense``):
    a fully connected layer at a batch, whatever threads the run holds."""
    from hetflow.devices.cpu.kernels import dense

    return dense.runs_dense(node, planned_infos(node, graph.values, graph.initializers))


def _unmarked_key(node: Node, kernel: Kernel, graph: Graph | None) -> str:
    algorithm = kernel.algorithm
    if node.op_type == "LSTM" and graph is not None and _lstm_columns(node, graph) is not None:
        return "LSTM/sequence"
    if algorithm in DISPATCHERS and node.op_type == "Conv" and graph is not None:
        algorithm = _conv_method(node, graph) or algorithm
    if node.op_type in ("MaxPool", "AveragePool") and graph is not None and _whole_map(node, graph):
        # One window over the whole map: the CPU kernel runs it as the global pool's reduction.
        return f"Global{node.op_type}/{algorithm}"
    if node.op_type in ("MaxPool", "AveragePool") and graph is not None and _same_pool(node, graph):
        # 3x3/1 windows padded by one run two separable passes over flat planes (jit_pool_same): 2-5x
        # faster per output than the other overlapping windows.
        return f"{node.op_type}/same"
    if node.op_type == "MaxPool" and graph is not None and _tiling_max_pool(node, graph):
        # Windows that tile X run a loop of their own, without phase planes (jit_pool.tile_loop): per
        # output element about half the cost of the overlapping windows' loop.
        return f"{node.op_type}/tiles"
    return f"{node.op_type}/{algorithm}"


def _conv_shapes(node: Node, graph: Graph) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    values = [graph.values.get(node.inputs[0]), graph.values.get(node.inputs[1]),
              graph.values.get(node.outputs[0])]
    if any(v is None or v.shape is None or not is_static(v.shape) for v in values):
        return None
    x, w, y = (tuple(int(d) for d in v.shape) for v in values)  # type: ignore[union-attr]
    return x, w, y


def _conv_method(node: Node, graph: Graph) -> str | None:
    from hetflow.ops import conv as conv_op

    shapes = _conv_shapes(node, graph)
    if shapes is None:
        return None
    x, w, _ = shapes
    spec = conv_op.conv_window(node.attrs, w)
    heuristic = getattr(conv_op, "heuristic_conv_algorithm", None)
    if heuristic is not None:
        return str(heuristic(spec, x, w[0], node.attrs.group, graph.values[node.inputs[0]].dtype))
    return str(conv_op.conv_algorithm(spec, x[1], node.attrs.group))


def kernel_cost(node: Node, cost: Cost, key: str, graph: Graph) -> Cost:
    """``cost`` as the algorithm in ``key`` carries it out (what its time and scratch memory follow).

    An op's cost is the op's: Augur's im2col GEMM, and the workspace of the op's default algorithm. The
    plan may run another algorithm, which does other work. Conv is the op with several today:

    * every algorithm: the workspace ``hetflow.ops.conv.conv_workspace_bytes`` gives for it, less what
      the kernel keeps across calls (``cache_bytes``: Winograd's transformed weights);
    * Winograd F(m, 3): its own GEMMs, ``(m + 2)^2`` products of ``[K x C] @ [C x tiles]``;
    * depthwise: no GEMM; every multiply-accumulate is elementwise work (a multiply and an add);
    * direct: no GEMM; the multiply-adds its kernel carries out (``direct.computed_products``);
    * hetflow's own tile GEMM (``OWN_GEMM_MARK``, ``COLUMNS_MARK``): its multiply-adds outside BLAS's GEMM
      model.

    Reports keep the op's cost (Augur's convention); only features and memory use this one.
    """
    if unmarked(key) in PER_PLANE_KEYS:  # however a run splits them, a loop per plane
        cost = dataclasses.replace(cost, loops=_output_planes(node, graph))
    if node.op_type == "LSTM":
        return _lstm_cost(node, cost, graph, key.endswith(SPIN_MARK))
    if node.op_type == "Concat":  # one copy per input: its calls feature (``concat_copy_cost``)
        return dataclasses.replace(cost, loops=len(node.present_inputs()))
    if node.op_type != "Conv":
        return cost
    from hetflow.ops import conv as conv_op

    if getattr(node.attrs, "residual", False) and len(node.inputs) > 3:
        # The folded shortcut is read in the epilogue, costed apart (``residual_seconds``).
        cost = dataclasses.replace(cost, bytes_read=cost.bytes_read - _value_bytes(graph, node.inputs[3]))
    shapes = _conv_shapes(node, graph)
    algorithm = key_algorithm(key)
    if shapes is None:
        return cost
    x, w, y = shapes
    changes: dict[str, Any] = {}
    workspace_of = getattr(conv_op, "conv_workspace_bytes", None)
    if algorithm == getattr(conv_op, "DIRECT_FMA", None):
        # The direct kernel's scratch and work follow its layout (padding, which variant), which only it
        # knows: no GEMM, its multiply-adds (the dropped ones included) at its own fitted rate.
        from hetflow.devices.cpu.kernels import direct

        changes.update(gemm=None, macs=direct.computed_products(node, x, w),
                       workspace_bytes=direct.workspace_bytes(node, x, w))  # fmt: skip
    elif workspace_of is not None:
        itemsize = graph.values[node.inputs[0]].dtype.itemsize
        workspace = int(workspace_of(algorithm, x, w, y, itemsize)) - cache_bytes(node, key, graph)
        changes["workspace_bytes"] = max(0, workspace)
    tile = getattr(conv_op, "WINOGRAD_TILE", {}).get(algorithm)
    if tile is not None and len(y) == 4:
        tiles = y[0] * -(-y[2] // tile) * -(-y[3] // tile)
        products = (tile + 2) ** 2
        changes["gemm"] = GemmDims(n=w[0], m=tiles, k=w[1], count=products)
        changes["macs"] = products * w[0] * w[1] * tiles
        if key.endswith((SPIN_MARK, SPIN_BATCH_MARK)):
            changes.update(_winograd_on_tiles(w, tiles))
    elif algorithm == getattr(conv_op, "DEPTHWISE", "depthwise"):
        changes.update(gemm=None, macs=0, flops=cost.flops + 2 * cost.macs)
    if key.endswith(OWN_PRODUCT_MARKS):
        # hetflow's tile GEMM runs thin products about as fast as wide ones: its multiply-adds at the
        # peak rate, not through BLAS's GEMM model, whose small-matrix curve priced SqueezeNet's 16-kernel
        # 1x1 layers at 2.5x their time.
        changes["gemm"] = None
    return dataclasses.replace(cost, **changes)


#: Tiles a Winograd transform call takes at once (``jit_winograd_lanes``: one a vector lane).
WINOGRAD_TILE_GROUP = 16


def _winograd_on_tiles(w: Sequence[int], tiles: int) -> dict[str, Any]:
    """A spinning run's Winograd Conv: its a*a products are one grouped job on the tile GEMM, whose
    multiply-adds run at the peak rate however small each product is (no GEMM model: its per-call cost,
    36 calls a layer for F(4,3), priced MentorNet's 16x16 layers 40% over once they ran Winograd), and
    its transforms a call per channel (and per kernel on the way out) and group of 16 tiles (``loops``)."""
    groups = -(-tiles // WINOGRAD_TILE_GROUP)
    return {"gemm": None, "loops": (int(w[0]) + int(w[1])) * groups}


def concat_copy_cost(node: Node, cost: Cost, planned: MemoryPlan | None, graph: Graph) -> Cost:
    """A Concat's ``cost`` (``kernel_cost``'s: a loop per input) less the inputs the memory plan
    ``planned`` placed in its output already (``MemoryPlan.placed_inputs``): their producers wrote them
    there, so the kernel copies only the others (SqueezeNet's and GoogLeNet's Concats copy nothing in a
    run; timed alone on inputs of their own, SqueezeNet's 8 took 0.33 ms of its 3.9). Other ops' costs
    unchanged."""
    if node.op_type != "Concat" or planned is None:
        return cost
    inputs = node.present_inputs()
    copies = [name for name, inside in zip(inputs, planned.placed_inputs(inputs, node.outputs)) if not inside]
    copied = sum(_value_bytes(graph, name) for name in copies)
    return dataclasses.replace(cost, bytes_read=copied, bytes_written=copied, loops=len(copies))


#: Kernels compiled to loop over output planes (``hetflow.devices.cpu.kernels.jit_*``): each plane pays a
#: fixed cost (a copy into a padded buffer, the loop set-up), so many small planes cost more than their
#: bytes and arithmetic say (960 planes of 7x7 take as long as 32 of 112x112).
PER_PLANE_KEYS = frozenset({
    "Conv/depthwise", "MaxPool/default", "MaxPool/tiles", "MaxPool/same", "AveragePool/default", "AveragePool/same",
})  # fmt: skip


def _lstm_cost(node: Node, cost: Cost, graph: Graph, spinning: bool) -> Cost:
    """An LSTM's cost as its CPU kernel carries it out.

    Scratch: the compiled cell's buffers (``compiled_lstm_scratch_bytes``, on the spinning pool where
    the run holds one: ``spinning``; 0.6 MB at batch 16 for lstm-gesture, where the op's input
    projection of every step is 13 MB), else the op's. Products: where the compiled sequence makes the
    recurrent product a GEMV per column (``jit_lstm.GEMV_MAX_COLUMNS``), that many one-column products
    a step, as on the spinning pool for one column (``jit_lstm._spin_vector_step``, on packed W and R);
    on the spinning pool for more (``_spinning_lstm_products``) the tile GEMM's."""
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.devices.cpu.kernels.rnn import compiled_lstm_scratch_bytes
    from hetflow.runtime.planner import input_infos

    scratch = compiled_lstm_scratch_bytes(node, input_infos(graph, node) or [], pool_held=spinning)
    if scratch is None:
        return cost
    cost = dataclasses.replace(cost, workspace_bytes=scratch)
    if cost.gemm is None:
        return cost
    columns = _lstm_batch(node, graph)
    if spinning and columns == 1:
        return _one_column_products(cost, cost.gemm)
    if spinning:
        return _spinning_lstm_products(cost, cost.gemm)
    if columns is not None and columns <= jit_lstm.GEMV_MAX_COLUMNS and (spinning or jit_lstm.runs_sequence(columns)):
        gemm = cost.gemm
        return dataclasses.replace(cost, gemm=GemmDims(n=gemm.n, m=1, k=gemm.k, count=gemm.count * gemm.m))
    return cost


def _one_column_products(cost: Cost, gemm: GemmDims) -> Cost:
    """One column's steps on the spinning pool (``jit_lstm._spin_vector_step``): compiled loops stream
    the packed W and R once a step at one rate whatever their size (measured: 166-179 GB/s of R from
    H=256 to 640, 2.1 us a step at H=128), so their multiply-adds are priced at a rate of their own and
    each step is a call. Through BLAS's GEMV model, whose efficiency bends with the shape, the fit over
    the H=128..512 probes missed by +-23% and lstm-gesture came out -16..-19%."""
    return dataclasses.replace(cost, gemm=None, loops=gemm.count * gemm.m)


def _spinning_lstm_products(cost: Cost, gemm: GemmDims) -> Cost:
    """The recurrent products of an LSTM on the spinning pool: the tile GEMM (``jit_tile_gemm``) works
    in whole vectors of columns, so the batch counts rounded up to them, and each step streams all of
    R (float32) through it again. Still priced through BLAS's GEMM model, which the key's coefficient
    scales (the tile GEMM's cost per column is about half OpenBLAS's), with R's reading a term of its
    own: per step, H=512, 40 + 72 us per vector of 16 columns (16 to 96 columns). Through BLAS's model
    alone, lstm-gesture came out -15% at batch 16 and +9% at 64; priced outside it at the peak rate,
    as ``OWN_GEMM_MARK`` layers are, -18% and +15%."""
    from hetflow.devices.cpu.kernels.llvm_vectors import LANES

    columns = -(-gemm.m // LANES) * LANES
    padding = (columns - gemm.m) * gemm.n * gemm.k * gemm.count
    return dataclasses.replace(cost, macs=cost.macs + padding, streamed_bytes=gemm.n * gemm.k * 4,
                               gemm=GemmDims(n=gemm.n, m=columns, k=gemm.k, count=gemm.count))


def _lstm_batch(node: Node, graph: Graph) -> int | None:
    """The batch of an LSTM's input, when static."""
    x = graph.values.get(node.inputs[0])
    if x is None or x.shape is None or not is_static(x.shape) or len(x.shape) != 3:
        return None
    return int(x.shape[0] if getattr(node.attrs, "layout", 0) == 1 else x.shape[1])


def _spinning_lstm(node: Node, graph: Graph) -> bool:
    """Whether a spinning run splits the LSTM ``node``'s steps on its pool (``jit_lstm.runs_spinning``)."""
    from hetflow.devices.cpu.kernels.rnn import spinning_lstm_batch
    from hetflow.runtime.planner import input_infos

    infos = input_infos(graph, node)
    return infos is not None and spinning_lstm_batch(node, infos) > 0


def _lstm_columns(node: Node, graph: Graph) -> int | None:
    """The batch of a standard-cell LSTM whose steps run as one compiled loop (``jit_lstm.runs_sequence``),
    else None."""
    from hetflow.devices.cpu.kernels import jit_lstm
    from hetflow.devices.cpu.kernels.rnn import compiled_lstm_scratch_bytes
    from hetflow.runtime.planner import input_infos

    batch = _lstm_batch(node, graph)
    if batch is None or not jit_lstm.runs_sequence(batch):
        return None
    return batch if compiled_lstm_scratch_bytes(node, input_infos(graph, node) or []) is not None else None


def _output_planes(node: Node, graph: Graph) -> int:
    """N * C of the node's first output when its shape is known and 4-D (the planes a 2-D kernel loops over)."""
    value = graph.values.get(node.outputs[0]) if node.outputs else None
    shape = value.shape if value is not None else None
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[:2]):
        return 0
    return int(shape[0]) * int(shape[1])


def im2col_bytes(node: Node, graph: Graph) -> int:
    """Augur's workspace of a Conv: its im2col buffer, whatever algorithm actually runs it."""
    from hetflow.ops import conv as conv_op

    shapes = _conv_shapes(node, graph) if node.op_type == "Conv" else None
    workspace_of = getattr(conv_op, "conv_workspace_bytes", None)
    if shapes is None or workspace_of is None:
        return 0
    x, w, y = shapes
    return int(workspace_of(getattr(conv_op, "IM2COL", "im2col"), x, w, y, graph.values[node.inputs[0]].dtype.itemsize))


def cache_bytes(node: Node, key: str, graph: Graph) -> int:
    """Memory a kernel keeps for the session's lifetime once it has run (Winograd's transformed
    weights ``[(m + 2)^2, K, C]``, the direct kernel's blocked ones, the dense kernel's panels); 0 for
    kernels that keep nothing."""
    if node.op_type == "Gemm" and key.endswith((OWN_GEMM_MARK, DENSE_SPIN_MARK)):
        from hetflow.devices.cpu.kernels import dense

        return dense.panel_bytes(node, planned_infos(node, graph.values, graph.initializers))
    if node.op_type == "LSTM" and key.endswith(SPIN_MARK):
        from hetflow.devices.cpu.kernels import rnn

        infos = planned_infos(node, graph.values, graph.initializers)
        return 0 if infos is None else rnn.gate_panel_bytes(node, infos) + rnn.sequence_capture_bytes(node, infos)
    if node.op_type != "Conv":
        return 0
    from hetflow.ops import conv as conv_op

    algorithm = key_algorithm(key)
    tile = getattr(conv_op, "WINOGRAD_TILE", {}).get(algorithm)
    shapes = _conv_shapes(node, graph)
    if algorithm == getattr(conv_op, "DIRECT_FMA", None) and shapes is not None:
        from hetflow.devices.cpu.kernels.direct import blocked_weight_bytes

        return blocked_weight_bytes(node, shapes[0], shapes[1])
    if tile is None or shapes is None:
        return 0
    _, w, _ = shapes
    return (tile + 2) ** 2 * w[0] * w[1] * graph.values[node.inputs[1]].dtype.itemsize


def _captured_lstm(node: Node, key: str, graph: Graph) -> bool:
    """Whether ``node`` is an LSTM whose sequence a spinning run captures (``rnn.captures_sequence``): its
    buffers and outputs are then kept between runs (``cache_bytes``) and a run allocates nothing for it."""
    if node.op_type != "LSTM" or not key.endswith(SPIN_MARK):
        return False
    from hetflow.devices.cpu.kernels import rnn

    infos = planned_infos(node, graph.values, graph.initializers)
    return infos is not None and rnn.captures_sequence(node, infos)


def memory_terms(node: Node, cost: Cost, graph: Graph) -> np.ndarray:
    """What a kernel's transient memory is fitted on: bytes of its activation inputs, of its outputs,
    of its workspace, and of its input padded (0 when the window adds no padding)."""
    activations = [n for n in node.present_inputs() if n not in graph.initializers]
    in_bytes = sum(_value_bytes(graph, n) for n in activations)
    out_bytes = sum(_value_bytes(graph, n) for n in node.present_outputs())
    return np.array([in_bytes, out_bytes, cost.workspace_bytes, padded_input_bytes(node, graph)], dtype=np.float64)


def _window(node: Node, graph: Graph) -> Any:
    """The resolved window (``hetflow.ops.spatial.WindowSpec``) of a Conv or pool node, else None."""
    try:
        if node.op_type == "Conv":
            from hetflow.ops.conv import conv_window

            return conv_window(node.attrs, graph.values[node.inputs[1]].shape)
        if node.op_type in ("MaxPool", "AveragePool"):
            from hetflow.ops.pool import pool_window

            return pool_window(node.attrs)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return None


def window_strided(node: Node, graph: Graph) -> bool:
    """Whether a windowed op steps its window by more than one element along some axis."""
    spec = _window(node, graph)
    return spec is not None and any(s > 1 for s in spec.strides)


def _geometry(node: Node, graph: Graph) -> Any:
    """The windowing (``hetflow.ops.spatial.Geometry``) of a Conv or pool node's concrete input, else None."""
    from hetflow.ops.spatial import geometry

    x = graph.values.get(node.inputs[0]) if node.inputs else None
    if x is None or x.shape is None or not is_static(x.shape) or len(x.shape) < 3:
        return None
    spec = _window(node, graph)
    if spec is None:
        return None
    try:
        return geometry(spec, [int(d) for d in x.shape[2:]])
    except (TypeError, ValueError):
        return None


def _tiling_max_pool(node: Node, graph: Graph) -> bool:
    """Whether a MaxPool runs the loop for windows that tile its input (``jit_pool.runs_tiles``) and no
    Indices are asked."""
    from hetflow.devices.cpu.kernels.jit_pool import runs_tiles

    geo = _geometry(node, graph)
    wants_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    x = graph.values[node.inputs[0]]
    return geo is not None and len(geo.axes) == 2 and not wants_indices and runs_tiles(geo, np.dtype(x.dtype))


def _same_pool(node: Node, graph: Graph) -> bool:
    """Whether a pool runs ``jit_pool_same``'s passes (3x3/1 padded by one, float32) and no Indices are
    asked."""
    from hetflow.devices.cpu.kernels.jit_pool_same import takes_geometry

    geo = _geometry(node, graph)
    wants_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    x = graph.values[node.inputs[0]]
    return geo is not None and not wants_indices and takes_geometry(geo, np.dtype(x.dtype))


def _whole_map(node: Node, graph: Graph) -> bool:
    """Whether a pool's one window holds its whole input (``Geometry.covers_input``)."""
    geo = _geometry(node, graph)
    return geo is not None and geo.covers_input


def padded_input_bytes(node: Node, graph: Graph) -> int:
    """Bytes of a windowed op's input with its padding added, or 0 when it pads nothing (or, a pool over
    the whole map, reads its input as it is)."""
    geo = _geometry(node, graph)
    if geo is None or geo.covers_input and node.op_type != "Conv":
        return 0
    if all(a.padded == a.size for a in geo.axes):
        return 0
    x = graph.values[node.inputs[0]]
    positions = int(np.prod([a.padded for a in geo.axes], dtype=np.int64))
    return int(x.shape[0]) * int(x.shape[1]) * positions * x.dtype.itemsize


def op_model(profile: DeviceProfile, key: str) -> tuple[OpModel, str]:
    """The profile's model for ``key``, else the best-calibrated model of the same op, else a fallback.

    Returns the model and the key it was found under (``"fallback"`` when none).
    """
    if key in profile.ops:
        return profile.ops[key], key
    op_type = key.split("/", 1)[0]
    same_op = [(k, m) for k, m in profile.ops.items() if k.split("/", 1)[0] == op_type]
    if same_op:
        found, model = max(same_op, key=lambda item: item[1].samples)
        return model, found
    return FALLBACK_TRANSIENT, "fallback"


def predict_seconds(
    profile: DeviceProfile, key: str, cost: Cost, strided: bool = False, split_threads: int = 0
) -> float:
    """Predicted seconds of one call of a kernel with profile key ``key`` doing ``cost``; with
    ``split_threads``, in a run that splits its GEMMs over that many threads of its own."""
    model, _ = op_model(profile, key)
    split = (profile.gemm_one_thread, split_threads) if split_threads and profile.gemm_one_thread else None
    return model.seconds(features(cost, profile.gemm, profile.memory, strided, split))


def split_threads(profile: DeviceProfile, plan: Any, batch: int, threads: int | None) -> int:
    """The threads a run of ``plan`` at ``batch`` splits its GEMMs over (0: BLAS threads them), as the
    executor decides (``splits_gemms``), with the session's ``threads`` or else the profile's."""
    from hetflow.runtime.executor import plan_conv_work, splits_gemms

    count = threads or profile.threads
    conv_macs, direct_macs = plan_conv_work(plan)
    if profile.gemm_one_thread is None or not splits_gemms(conv_macs, batch > 1, count, direct_macs):
        return 0
    return count


def spin_run(profile: DeviceProfile, plan: Any, batch: int, threads: int | None) -> bool:
    """Whether a run of ``plan`` at ``batch`` splits on the spinning pool (``executor.spins``, or
    ``spins_recurrent`` for a large batch of an LSTM), with the session's ``threads`` or else the
    profile's: a CPU profile only."""
    from hetflow.runtime.executor import plan_conv_macs, plan_recurrent_batch, spins, spins_recurrent

    count = threads or profile.threads
    if profile.device != "cpu":
        return False
    return spins(plan_conv_macs(plan), batch > 1, count) or spins_recurrent(plan_recurrent_batch(plan), count)


def run_overhead_ms(profile: DeviceProfile, called: int, direct: bool, replayed: int = 0) -> float:
    """Milliseconds a run adds beyond its layers as they are timed alone: the executor's per-step
    dispatch for the ``called`` steps and its per-run cost (``run_overhead_s``, calibrated on a run the
    executor walks), or for a run replayed whole in one compiled call (``direct``: a spinning run that
    calls no step from Python, ``replay.DirectReplay``) what it adds around its jobs (``direct_run_s``);
    less, for each of the ``replayed`` steps run from compiled code, the Python call its layer timed
    alone paid (``replayed_step_s``). Negative where a run saves more than it adds: LeNet at batch 1,
    2 threads (2026-12-07) ran its jobs in 44.5 us, its layers alone took 62.5 and the whole run 51.8."""
    saved = replayed * profile.replayed_step_s
    if direct:
        return (profile.direct_run_s - saved) * 1e3
    return (called * profile.dispatch_s + profile.run_overhead_s - saved) * 1e3


def called_steps(plan: Any, outputs: Sequence[str], profile: DeviceProfile, spinning: bool, threads: int | None) -> int:
    """How many of ``plan``'s steps a run calls from Python, each at the profile's ``dispatch_s``: all,
    but those a captured run replays from compiled code where runs are captured (a CPU profile, a run
    that spins or has one thread; ``hetflow.runtime.replay``)."""
    from hetflow.runtime.executor import REPLAYS, compiled

    if profile.device != "cpu" or not REPLAYS or not (spinning or (threads or profile.threads) == 1):
        return len(plan.steps)
    return len(plan.steps) - sum(compiled(plan, tuple(outputs)).replayed_steps())


# -- the estimate ----------------------------------------------------------------------------------
def batch_bindings(graph: Graph, batch: int) -> dict[str, int]:
    """Every symbolic dimension of the graph's inputs, set to ``batch``."""
    return {
        dim: batch for value in graph.input_values() if value.shape is not None
        for dim in value.shape if isinstance(dim, str)
    }


def open_session(model: ModelSource | Graph | InferenceSession, device: str) -> InferenceSession:
    """A session for ``model`` on ``device`` (the CPU when the profile's device is not here)."""
    if isinstance(model, InferenceSession):
        return model
    try:
        return InferenceSession(model, device=device)
    except HetflowError:
        if device == "cpu":
            raise
        return InferenceSession(model, device="cpu")


def estimate(
    model: ModelSource | Graph | InferenceSession,
    device: str | os.PathLike[str] | DeviceProfile = "cpu",
    batch: int = 1,
    *,
    memory_limit: int | str | None = None,
    validate: bool = False,
    name: str | None = None,
) -> Estimate:
    """Predict per-layer time and memory of ``model`` at ``batch`` on ``device``.

    Args:
        model: anything ``hetflow.load_model`` accepts (``.onnx``, ``zoo:NAME``, ...), or a session.
        device: ``"cpu"`` (its saved profile; a quick calibration on first use), a profile JSON path
            (what-if for a device you do not have), or a DeviceProfile.
        batch: value of the symbolic batch dimension.
        memory_limit: bytes, or a string such as ``"512MB"`` / ``"1.5GiB"``, for the memory verdict.
        validate: also run the model here and fill in measured times (``hetflow.estimate.validate``).
        name: the model's name in reports (default: the source as given).

    Example::

        report = hetflow.estimate("zoo:alexnet", batch=16)
        print(report.predicted_ms, report.memory.peak_bytes)
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1; got {batch}")
    profile = resolve_profile(device)
    session = open_session(model, profile.device if profile.device != "cpu" else "cpu")
    source_name = name or (describe_source(model) if not isinstance(model, InferenceSession) else "session")
    bindings = batch_bindings(session.graph, batch)
    graph = bind_batch(session.graph, bindings) if bindings else session.graph
    plan = session.plan_for(bindings)
    by_name = {node.name: node for node in graph.nodes}
    steps = [(by_name[step.node.name], step.kernel) for step in plan.steps]
    threads = session.threads
    spinning = spin_run(profile, plan, batch, threads)
    split = split_threads(profile, plan, batch, threads)
    keys = [layer_key(node, kernel, graph, spinning, split > 0) for node, kernel in steps]
    raw = {node.name: cost for node, cost in node_costs(graph)}
    planned = _memory_plan(session, plan)
    costs = {node.name: concat_copy_cost(node, kernel_cost(node, raw[node.name], key, graph), planned, graph)
             for (node, _), key in zip(steps, keys)}  # fmt: skip
    layers = [_layer(graph, node, key, raw[node.name], costs[node.name], profile, split)
              for (node, _), key in zip(steps, keys)]
    limit = parse_bytes(memory_limit) if memory_limit is not None else None
    memory = plan_memory(graph, steps, keys, costs, plan.release_after, profile, limit)
    called = called_steps(plan, [v.name for v in session.get_outputs()], profile, spinning, threads)
    direct = spinning and called == 0
    arena_peak = _arena_peak(session, planned, graph)
    if arena_peak is not None:
        own, layer = _largest_own_allocation(graph, steps, keys, costs, profile)
        # A run replayed whole allocates only its outputs, and their Python objects (``direct_run_bytes``).
        memory.peak_bytes = arena_peak + own + (profile.direct_run_bytes if direct else 0)
        memory.peak_layer = "the arena" if not own else f"the arena, plus {layer}'s own allocations"
    memory.workspace_bytes = sum(im2col_bytes(node, graph) if node.op_type == "Conv" else raw[node.name].workspace_bytes
                                 for node, _ in steps)
    overhead = run_overhead_ms(profile, called, direct=direct, replayed=len(plan.steps) - called)
    notes = _notes(profile, keys)
    if threads is not None and profile.device == "cpu" and threads != profile.threads:
        notes.append(f"the profile was calibrated with {profile.threads} thread(s); the session runs {threads}")
    images = session.images_per_run(batch) if isinstance(session, InferenceSession) else None
    # A batch run in parts takes its runs' in-run losses (``_in_runs_of``): the whole batch's are not needed.
    in_run = in_run_seconds(graph, steps, keys, planned, profile) * 1e3 if images is None else 0.0
    result = Estimate(source_name, batch, _device_label(profile), profile, layers, memory, overhead, notes=notes,
                      in_run_ms=in_run)
    if images is not None:
        result = _in_runs_of(result, estimate(session, profile, images, name=source_name), limit)
    if validate:
        from hetflow.estimate.validate import validate as run_validation

        run_validation(result, session)
    return result


def _in_runs_of(whole: Estimate, part: Estimate, limit: int | None) -> Estimate:
    """``whole`` (the batch's layers, counted as one run of every image) as the session runs it: runs of
    ``part.batch`` images (``InferenceSession.images_per_run``). Each layer takes ``part``'s algorithm and
    its time once a run, and the run's losses and overhead are paid every run; the planned peak is one
    run's. Augur's counts and memory accounting stay the whole batch's."""
    runs = whole.batch / part.batch
    by_name = {layer.name: layer for layer in part.layers}
    layers = []
    for layer in whole.layers:
        found = by_name.get(layer.name)
        if found is not None:
            layer = dataclasses.replace(layer, algorithm=found.algorithm, predicted_ms=runs * found.predicted_ms)
        layers.append(layer)
    memory = dataclasses.replace(whole.memory, peak_bytes=part.memory.peak_bytes, peak_layer=part.memory.peak_layer,
                                 cache_bytes=part.memory.cache_bytes, limit_bytes=limit)  # fmt: skip
    note = f"the session runs a batch of {whole.batch} as {runs:g} runs of {part.batch} images (sub_batch)"
    return dataclasses.replace(whole, layers=layers, memory=memory, overhead_ms=runs * part.overhead_ms,
                               in_run_ms=runs * part.in_run_ms, notes=[*whole.notes, note])  # fmt: skip


def _memory_plan(session: InferenceSession, plan: Any) -> MemoryPlan | None:
    """The arena layout a run of ``plan`` uses (``executor.memory_plan``), or None without an arena."""
    from hetflow.runtime.executor import memory_plan

    return memory_plan(plan, [v.name for v in session.get_outputs()])


def _arena_peak(session: InferenceSession, planned: MemoryPlan | None, graph: Graph) -> int | None:
    """A run's peak when its activations live in the memory plan's arena (``planned``): the arena
    (activations and workspace, laid out by liveness) plus the outputs, which a run copies out of it;
    None when the plan has no arena (devices whose kernels allocate their own results)."""
    if planned is None:
        return None
    return int(planned.arena_bytes) + sum(_value_bytes(graph, v.name) for v in session.get_outputs())


def _transient_bytes(profile: DeviceProfile, key: str, node: Node, cost: Cost, graph: Graph) -> float:
    """Bytes a kernel allocates during one call (outputs and scratch): the profile's transient model;
    none for an LSTM whose sequence a spinning run replays as captured jobs (``_captured_lstm``), nor for
    an op whose output is a view of its input (``replay.VIEW_OPS``: Squeeze had no model of its own, and
    the fallback priced its output as allocated)."""
    if _captured_lstm(node, key, graph) or node.op_type in VIEW_OPS:
        return 0.0
    model, _ = op_model(profile, key)
    terms = memory_terms(node, cost, graph)
    return float(np.dot(model.transient[:len(terms)], terms[:len(model.transient)]))


def _largest_own_allocation(
    graph: Graph, steps: Sequence[tuple[Node, Kernel]], keys: Sequence[str], costs: Mapping[str, Cost],
    profile: DeviceProfile,
) -> tuple[int, str]:
    """The most a kernel outside the arena allocates during its call (its results and scratch: the
    profile's transient model), and which node; (0, "") when every kernel writes into the arena."""
    largest, layer = 0, ""
    for (node, kernel), key in zip(steps, keys):
        if kernel.writes_out:
            continue
        own = int(_transient_bytes(profile, key, node, costs[node.name], graph))
        if own > largest:
            largest, layer = own, node.name
    return largest, layer


def _device_label(profile: DeviceProfile) -> str:
    return profile.device if not profile.name else f"{profile.device} ({profile.name})"


def _notes(profile: DeviceProfile, keys: Sequence[str]) -> list[str]:
    notes = []
    if profile.quick:
        notes.append("the profile is a quick calibration; run `hetflow calibrate` for accurate times")
    missing = sorted({key for key in keys if key not in profile.ops})
    if missing:
        notes.append("not calibrated (predicted from a related model): " + ", ".join(missing))
    return notes


def _layer(
    graph: Graph, node: Node, key: str, cost: Cost, work: Cost, profile: DeviceProfile, split: int = 0
) -> LayerEstimate:
    """One report row: counts from the op's ``cost``, time from ``work`` (the algorithm's cost) in a
    run that splits its GEMMs over ``split`` threads (0: BLAS threads them)."""
    first = graph.values.get(node.present_outputs()[0]) if node.present_outputs() else None
    shape = [int(d) for d in first.shape] if first is not None and first.shape is not None else []
    params = sum(int(graph.initializers[name].size) for name in node.present_inputs() if name in graph.initializers)
    return LayerEstimate(
        name=node.name,
        op=node.op_type,
        algorithm=key_algorithm(key),
        output_shape=shape,
        params=params,
        macs=int(cost.macs),
        gemm=cost.gemm,
        bytes=int(cost.bytes_read + cost.bytes_written),
        workspace_bytes=int(work.workspace_bytes),
        predicted_ms=(predict_seconds(profile, key, work, window_strided(node, graph), split)
                      + residual_seconds(node, graph, profile)) * 1e3,
    )  # fmt: skip


def residual_seconds(node: Node, graph: Graph, profile: DeviceProfile) -> float:
    """A Conv's folded residual (``ConvAttrs.residual``, ``passes.fuse_residual``) on the Add model: one
    add per output element and one more tensor read, in the pass over Y the Conv makes anyway (the Add
    it replaced read two and wrote one). The Conv's own models are fitted on Convs without one, and its
    work (``kernel_cost``) leaves the shortcut out. 0 for any other node."""
    if node.op_type != "Conv" or not getattr(node.attrs, "residual", False):
        return 0.0
    value = graph.values.get(node.outputs[0])
    if value is None or value.shape is None or not is_static(value.shape):
        return 0.0
    elements = int(np.prod(value.shape, dtype=np.int64))
    return predict_seconds(profile, "Add/default", Cost(flops=elements, bytes_read=elements * value.dtype.itemsize))


# -- inside a run ----------------------------------------------------------------------------------
def in_run_seconds(
    graph: Graph, steps: Sequence[tuple[Node, Kernel]], keys: Sequence[str], planned: MemoryPlan | None,
    profile: DeviceProfile,
) -> float:
    """Seconds a whole run of ``steps`` spends bringing from memory what each layer, repeated alone,
    finds in the device's caches (``hetflow.estimate.cache``: the share in cache at each block's reuse
    distance, from the calibrated re-read rates), at ``cold_bytes_per_second``; 0 for a profile without a
    cache size (a device that is not the CPU)."""
    if profile.last_level_cache_bytes <= 0:
        return 0.0
    touches = [step_touches(index, node, key, graph, planned)
               for index, ((node, _), key) in enumerate(zip(steps, keys, strict=True))]  # fmt: skip
    return sum(cold_bytes(touches, HitCurve.of(profile.memory))) / cold_bytes_per_second(profile)


def cold_bytes_per_second(profile: DeviceProfile) -> float:
    """The rate a run brings its cold bytes from memory at: each of its threads at one thread's copy rate
    past every cache (the largest working set calibration copies).

    Why: one core's stream is bound by the misses it keeps in flight, so two cores stream about twice as
    much until the memory's own limit. On the 2-vCPU Xeon VM (2026-12-02) the runs at batch 1 lost what
    their cold bytes cost at 23-33 GB/s (GoogLeNet, Inception v2, DenseNet-121, VGG-19, ZFNet), with one
    thread copying at 14 GB/s past the cache; priced at that one thread's rate, AlexNet's and VGG-19's
    in-run terms came out 2-3x what their runs lost (estimates +21% and +49%)."""
    memory = profile.memory
    return max(1, profile.threads) * bandwidth(memory, memory.working_set_bytes[-1])


def step_touches(index: int, node: Node, key: str, graph: Graph, planned: MemoryPlan | None) -> list[Touch]:
    """What plan step ``index`` (``node``, run as ``key``) reads and writes: its activations where the
    memory plan put them, its weights as its kernel holds them (``cache_bytes``), its scratch. A Concat
    leaves out the inputs its producers wrote in place."""
    placed = planned.placed_inputs(node.inputs, node.outputs) if planned is not None else [False] * len(node.inputs)
    held = cache_bytes(node, key, graph)
    touches: list[Touch] = []
    for position, (name, inside) in enumerate(zip(node.inputs, placed, strict=True)):
        if not name or inside:
            continue
        if name in graph.initializers:
            nbytes = held if held and position == 1 else int(graph.initializers[name].nbytes)
            touches.append(Touch(f"weight:{name}", 0, nbytes))
        else:
            touches += _value_touches(name, graph, planned)
    if not (node.op_type == "Concat" and all(placed)):
        for name in node.present_outputs():
            touches += _value_touches(name, graph, planned)
    region = planned.workspaces.get(index) if planned is not None else None
    if region is not None:
        touches.append(Touch("arena", region.offset, region.nbytes))
    return touches


def _value_touches(name: str, graph: Graph, planned: MemoryPlan | None) -> list[Touch]:
    placement = planned.placements.get(name) if planned is not None else None
    if placement is None:
        return [Touch(f"value:{name}", 0, _value_bytes(graph, name))]
    return [Touch("arena", region.offset, region.nbytes) for region in placement.byte_ranges()]


# -- memory --------------------------------------------------------------------------------------
def _value_bytes(graph: Graph, name: str) -> int:
    value = graph.values.get(name)
    if value is None or value.shape is None or not is_static(value.shape):
        return 0
    return int(np.prod(value.shape, dtype=np.int64)) * value.dtype.itemsize


def plan_memory(
    graph: Graph,
    steps: Sequence[tuple[Node, Kernel]],
    keys: Sequence[str],
    costs: Mapping[str, Cost],
    release_after: Mapping[int, Sequence[str]],
    profile: DeviceProfile,
    limit: int | None = None,
) -> MemoryEstimate:
    """Augur's totals and hetflow's planned peak for a graph with static shapes.

    The peak replays the executor: before each step, the live values (outputs not yet past their last
    reader; a view shares its input's buffer) plus the step's transient allocation (the profile's
    fitted bytes per input, output and workspace byte); then the step's outputs join the live set and
    the values it read last leave it. Weights and the caller's inputs are not part of the peak.
    """
    used = {name for node, _ in steps for name in node.present_inputs()}
    weights = sum(int(array.nbytes) for name, array in graph.initializers.items() if name in used)
    mapped = sum(int(array.nbytes) for name, array in graph.initializers.items()
                 if name in used and isinstance(array, np.memmap))  # fmt: skip
    feeds = {value.name for value in graph.input_values()}
    input_bytes = sum(_value_bytes(graph, name) for name in feeds)
    produced = [name for node, _ in steps for name in node.present_outputs()]
    data = input_bytes + sum(_value_bytes(graph, name) for name in produced)
    workspace = sum(int(costs[node.name].workspace_bytes) for node, _ in steps)

    buffer_of: dict[str, int] = {}  # value -> buffer id
    sizes: dict[int, int] = {}
    holders: dict[int, int] = defaultdict(int)
    live = peak = 0
    peak_layer = ""
    for index, ((node, _), key) in enumerate(zip(steps, keys)):
        model, _ = op_model(profile, key)
        activations = [n for n in node.present_inputs() if n not in graph.initializers]
        outputs = node.present_outputs()
        transient = _transient_bytes(profile, key, node, costs[node.name], graph)
        if live + transient > peak:
            peak, peak_layer = int(live + transient), node.name
        kept = _captured_lstm(node, key, graph)  # its outputs are kept between runs (``cache_bytes``)
        for name in outputs:
            viewed = model.retained < 0.5 or node.op_type in VIEW_OPS
            aliased = viewed and activations and activations[0] in buffer_of
            if aliased:
                buffer = buffer_of[activations[0]]
            else:
                buffer = len(sizes)
                sizes[buffer] = 0 if kept else _value_bytes(graph, name)
                live += sizes[buffer]
            buffer_of[name] = buffer
            holders[buffer] += 1
        peak = max(peak, live)
        for name in release_after.get(index, ()):
            buffer = buffer_of.pop(name, None)
            if buffer is None or name in graph.outputs:
                continue
            holders[buffer] -= 1
            if holders[buffer] == 0:
                live -= sizes[buffer]
    caches = sum(cache_bytes(node, key, graph) for (node, _), key in zip(steps, keys))
    return MemoryEstimate(weights, data, workspace, input_bytes, peak, peak_layer, limit, caches, mapped_bytes=mapped)


_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "M": 1000**2, "MB": 1000**2, "G": 1000**3, "GB": 1000**3, "T": 1000**4, "TB": 1000**4,
    "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
}


def parse_bytes(text: int | str) -> int:
    """``512MB`` -> 512e6, ``1.5GiB`` -> 1.5 * 2**30, ``1024`` -> 1024 (case-insensitive units).

    Raises:
        ValueError: not a size.
    """
    if isinstance(text, int):
        return text
    stripped = text.strip().replace(" ", "").replace("_", "")
    number = stripped.rstrip("kmgtibKMGTIB")
    unit = stripped[len(number):].upper()
    if unit not in _UNITS or not number:
        raise ValueError(f"cannot read a memory size from {text!r}; write e.g. 512MB, 1.5GiB or 1000000")
    try:
        value = float(number)
    except ValueError as error:
        raise ValueError(f"cannot read a memory size from {text!r}; write e.g. 512MB or 1.5GiB") from error
    if value < 0:
        raise ValueError(f"a memory size cannot be negative: {text!r}")
    return int(value * _UNITS[unit])
