"""The pointwise Conv on hetflow's own GEMM (``jit_tile_gemm``) where a run's threads are its own.

OpenBLAS multiplies a 1x1 Conv's weights by its input planes about as fast as ``jit_tile_gemm`` does
on one core, but then the epilogue (bias, activation, a folded residual) passes over Y once more; the
tile GEMM finishes each tile in registers. It runs where hetflow arranges the threads:

- a batch on hetflow's own threads (``threads.owns_threads``, the Python pool): each thread takes its
  images, or column ranges of one image;
- a run on the spinning pool (``threads.spinning``): shares of whole column tiles, or of row blocks
  where W outweighs X (a 7x7 or 14x14 map: one or four tiles of columns, W up to 4 MB);
- a one-thread session.

Where a product's positions leave many of the tile GEMM's vector lanes empty (a 7x7 map: 49 of 64) and
its kernels fill whole tiles of 64, ``jit_lane_gemm`` runs it instead, kernels in the lanes
(``lanes_pay``), its weights packed once per array (``LANE_WEIGHTS``; a memory budget that cannot hold
the copy clears ``ConvAttrs.packed_weights``). In a batch, such a product's job takes the images end to
end instead (``jit_span_gemm``, ``tile_share_job``): no copy of anything, every lane but the last
tile's.

One example beside BLAS's threads keeps OpenBLAS, which splits a product over both cores (its spinning
workers would take the core a split of ours needs), and so do numba-pool runs, whose splits are arranged
by ``jit_gemm``.

An im2col Conv of one image on the spinning pool runs on the tile GEMM too: up to ``MAX_DEPTH`` column
rows in bands of output rows whose columns are built and multiplied by the thread that takes the band
(``prepare_bands``, ``jit_band_gemm``); deeper, or with a folded residual, with at most
``COLUMNS_MAX_BYTES`` of columns, as whole columns multiplied as a pointwise Conv over them
(``_ColumnsCall``). A batch on hetflow's own threads gives the tile GEMM im2col's bands
(``bands_on_own_threads``) or its columns, and Winograd's element products
(``product_on_own_threads``).

On the Zen 5 VM (2026-11-24) numpy's OpenBLAS multiplies at ~90-110 GMAC/s on two cores where the tile
GEMM reaches ~210, so the limits measured on the older VM (a batch's pointwise layers up to 256 input
channels, whole columns up to 2 MB, Winograd's products up to one tile of columns) were lifted there.

A/B at batch 16, 2 threads, alternating processes (``benchmarks/ab.py``, minimums): mobilenetv2 0.82x the
time, squeezenet 0.91x, googlenet and inception_v2 0.97x, resnet50 0.96x, densenet121 0.99x. Sessions of
one thread at batch 1: mobilenetv2 0.93x, resnet50 and googlenet 0.99x.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from hetflow.devices.base import BoundCall
from hetflow.devices.cpu.kernels import jit_band_gemm, jit_lane_gemm, jit_span_gemm, jit_tile_gemm
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, flat_images
from hetflow.devices.cpu.kernels.epilogue import apply_activation
from hetflow.devices.cpu.kernels.jit_im2col import im2col as compiled_im2col
from hetflow.devices.cpu.kernels.jit_im2col import im2col_job
from hetflow.devices.cpu.kernels.llvm_vectors import LANES
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.threads import (
    SPIN_SHARES_PER_THREAD,
    blas_is_narrow,
    in_numba_pool,
    intra_op_threads,
    owns_threads,
    parallel_for,
    spinning,
)
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import conv_window
from hetflow.ops.spatial import Geometry, geometry

#: Output columns per part below which an image is not split between threads (a few tiles each).
MIN_COLUMNS_PER_PART = 4 * jit_tile_gemm.TILE_POSITIONS
#: A product with fewer column parts than threads is split by W's row blocks instead from this many
#: multiply-adds: ResNet-50's 512 -> 512 3x3 layers at batch 16 (im2col's whole-chunk product, 512 x
#: 4608 x 441) had run on one thread.
ROW_SPLIT_MIN_MACS = 1 << 24


#: Column rows (C * kh * kw) up to which one image's im2col Conv runs in bands (``band_geometry``); deeper
#: ones build their columns whole (``columns_geometry``). It was also the depth above which a batch's
#: pointwise Conv kept OpenBLAS, measured on the older VM (resnet50 at batch 16: 512 -> 256 at 28x28 11.1
#: ms on BLAS, 11.5 on the tiles). On the Zen 5 VM (2026-11-24) OpenBLAS multiplies at ~90-110 GMAC/s
#: and the tiles at ~210, and every depth gained at batch 16 with the limit lifted (A/B, alternating
#: processes): densenet121 0.82, squeezenet 0.88, inception_v2 0.89, resnet50, googlenet and mobilenetv2
#: 0.95; so ``takes`` has no depth limit now.
MAX_DEPTH = 256


def takes(x_dtype: np.dtype, w_dtype: np.dtype) -> bool:
    """Whether a pointwise Conv over X and W of these dtypes runs on the tile GEMM (where ``runs_own`` lets
    it): float32, at any batch and depth (see ``MAX_DEPTH``)."""
    return x_dtype == np.float32 and w_dtype == np.float32


def runs_own() -> bool:
    """Whether the running call gives the pointwise Conv to the tile GEMM (see the module docstring)."""
    if in_numba_pool():
        return False
    return owns_threads() or intra_op_threads() == 1


def clamp_bounds(fused: FusedActivation | None) -> tuple[float, float] | None:
    """(low, high) of the activation the tiles apply as a clamp: none, Relu, or Clip; None for any other."""
    if fused is None:
        return -math.inf, math.inf
    if fused.op_type == "Relu":
        return 0.0, math.inf
    if fused.op_type == "Clip":
        return float(fused.alpha), float(fused.beta)
    return None


def work_items(batch: int, positions: int, parts: int) -> list[np.ndarray]:
    """``(image, first column, last column)`` rows for each of up to ``parts`` threads: whole images
    while there are at least as many as parts, else each image's columns in ranges of whole tiles."""
    if batch >= parts:
        bounds = [batch * p // parts for p in range(parts + 1)]
        return [
            np.array([(n, 0, positions) for n in range(bounds[p], bounds[p + 1])], np.int64).reshape(-1, 3)
            for p in range(parts)
        ]  # fmt: skip
    tile = jit_tile_gemm.TILE_POSITIONS
    per_image = max(1, min(-(-parts // batch), positions // MIN_COLUMNS_PER_PART))
    tiles = -(-positions // tile)
    items = []
    for n in range(batch):
        cuts = [min(positions, tiles * s // per_image * tile) for s in range(per_image + 1)]
        items += [np.array([(n, a, b)], np.int64) for a, b in zip(cuts, cuts[1:]) if b > a]
    return items


def spin_shares(batch: int, kernels: int, positions: int, groups: int, threads: int) -> tuple[int, int]:
    """(shares, row parts) of a product on ``threads`` spinning threads (``tile_share_job``):
    ``SPIN_SHARES_PER_THREAD`` shares a thread, by runs of column tiles where the images' groups' tiles
    (or the tiles of the images end to end, ``jit_span_gemm.spans_pay``) are that many and X outweighs W
    (each share of columns reads all of W), else by ranges of each group's row blocks (each reads all of
    X)."""
    wanted = threads * SPIN_SHARES_PER_THREAD
    if jit_span_gemm.spans_pay(batch, positions, groups):
        tiles = -(-batch * positions // jit_tile_gemm.TILE_POSITIONS)
    else:
        tiles = batch * groups * -(-positions // jit_tile_gemm.TILE_POSITIONS)
    blocks = -(-kernels // groups // jit_tile_gemm.ROWS)
    if tiles >= wanted and batch * positions >= kernels:
        return wanted, 1
    if blocks >= wanted:
        return wanted, wanted
    return max(1, min(tiles, wanted)), 1


def tile_share_job(
    w: np.ndarray, x: np.ndarray, y: np.ndarray, y_image: int, r: np.ndarray, r_image: int, bias: np.ndarray,
    bounds: np.ndarray, kernels: int, groups: int, shares: tuple[int, int],
) -> Job:  # fmt: skip
    """``Y[n] = clamp(W @ X[n] + bias [+ R[n]], *bounds)`` for every image of X ``[N, depth, P]`` as a
    spin-pool job of ``shares`` (``spin_shares``): on ``jit_span_gemm`` where its tiles run from one
    image into the next (``spans_pay``), else on ``jit_tile_gemm``. Y and R flat, their images ``y_image``
    and ``r_image`` floats apart (``r_image`` < 0: no residual)."""
    batch, _, positions = x.shape
    count, row_parts = shares
    if jit_span_gemm.spans_pay(batch, positions, groups):
        return jit_span_gemm.share_job(w, x, y, y_image, r, r_image, bias, bounds, kernels, row_parts,
                                       jit_tile_gemm.BLOCK_BYTES, count)  # fmt: skip
    return jit_tile_gemm.share_job(w, x, y, y_image, r, r_image, bias, bounds, kernels, positions, groups, row_parts,
                                   jit_tile_gemm.BLOCK_BYTES, count)  # fmt: skip


#: Depth from which the lane GEMM may take a product: its epilogue scatters every output once, a cost
#: the depth amortises (1000 kernels x 13 deep on 7x7 ran 3.4x slower in lanes, 64 x 64 1.1x), and its
#: packed copy of W is memory the raw weights already hold. Inside ResNet-50 the 512 -> 2048 layers (512
#: deep) gained nothing while their copies cost 12 MB of its +62 MB peak RSS; the deeper ones gained 3-15%.
LANES_MIN_DEPTH = 1024
#: Shallower products (from ``LANES_SMALL_MIN_DEPTH``) take the lanes where W is at most this many bytes:
#: such weights come from L2 or L3, not DRAM, so the products are bound by their FMAs, which the lanes
#: waste fewer of. MobileNet v2 at batch 1 (7x7 maps, in-run, 2 threads): its 160 -> 960 layers 0.107 ->
#: 0.093 ms, 320 -> 1280 0.262 -> 0.233.
LANES_SMALL_WEIGHT_BYTES = 2 * 1024 * 1024
LANES_SMALL_MIN_DEPTH = 160
#: How much more of its vector lanes the lane GEMM must fill than the tile GEMM to take a product.
LANES_MIN_GAIN = 0.15
#: W packed for the lane GEMM, per weight array (``jit_lane_gemm.packed_weights``).
LANE_WEIGHTS = WeightCache(jit_lane_gemm.packed_weights)


def lanes_pay(kernels: int, depth: int, positions: int, groups: int, batch: int = 1) -> bool:
    """Whether ``jit_lane_gemm`` (kernels in the vector lanes) computes a product of ``kernels`` x
    ``depth`` x ``positions`` (one image's) faster than ``jit_tile_gemm`` (positions in the lanes): where
    the positions leave many of the tile GEMM's lanes empty and the kernels fill whole tiles of 64, for one
    image only (``batch``), from ``LANES_MIN_DEPTH`` deep, or from ``LANES_SMALL_MIN_DEPTH`` where W is at
    most ``LANES_SMALL_WEIGHT_BYTES`` (whole runs at batch 1, A/B: mobilenetv2 0.95 and 0.97, googlenet
    0.97, densenet121 1.00 and 0.99). At batch 16, two threads, in-run medians over two alternating rounds, the lanes
    made Inception v2's pointwise layers 6% slower (45.5 vs 42.8 ms; its 1024-deep 7x7 layers) and tied
    in ResNet-50 (157.6 vs 156.8) and DenseNet-121 (116.7 vs 117.3), whose packed copies then cost memory
    for nothing.

    Measured on one core against the tile GEMM (2026-11-24, Zen 5, products alone, lane / tile time):
    7x7 maps (49 of 64 lanes) 512 x 4608 (a 3x3 layer's columns) 0.86, 512 x 2048 0.88, 2048 x 512 0.90,
    128 x 1024 0.85, 192 x 1024 0.90, 352 x 1024 0.98, but 160 x 1024 1.05 (160 of 192 lanes); one
    position (a classifier as a 1x1 Conv) 1000 x 1024 0.29; 14x14 256 x 1024 0.95, 13x13 256 x 256 1.11
    (the last seven before ``jit_lane_gemm``'s prefetch, which moved the first three by 1-3%).
    """
    if batch != 1 or groups != 1 or depth < LANES_SMALL_MIN_DEPTH:
        return False
    if depth < LANES_MIN_DEPTH and kernels * depth * 4 > LANES_SMALL_WEIGHT_BYTES:
        return False
    position_use = positions / (-(-positions // LANES) * LANES)
    kernel_use = kernels / (-(-kernels // jit_lane_gemm.TILE_KERNELS) * jit_lane_gemm.TILE_KERNELS)
    return kernel_use >= position_use + LANES_MIN_GAIN


def lane_weight_bytes(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> int:
    """Bytes of the packed copy of W that a Conv keeps for the lane GEMM where ``lanes_pay`` (counted
    wherever the product qualifies, whether or not a run then takes the tiles)."""
    kernels, depth = int(w_shape[0]), math.prod(int(d) for d in w_shape[1:])
    out = geometry(conv_window(node.attrs, w_shape), x_shape[2:]).out
    if not lanes_pay(kernels, depth, math.prod(out), node.attrs.group, int(x_shape[0])):
        return 0
    return -(-kernels // jit_lane_gemm.TILE_KERNELS) * jit_lane_gemm.TILE_KERNELS * depth * 4


def prepare_pointwise(
    fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
) -> Callable[[Node, Sequence[TensorInfo | None], Out, np.ndarray | None], BoundCall | None]:
    """The pointwise kernel's ``prepare``: ``fallback(node, arrays, out, workspace)`` (the BLAS kernel, with the
    shared epilogue) where ``runs_own`` is false or the arrays do not fit, the tile GEMM elsewhere."""

    def prepare(
        node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
    ) -> BoundCall | None:
        x_info, w_info = inputs[0], inputs[1]
        if x_info is None or w_info is None or not takes(x_info.dtype, w_info.dtype):
            return None
        return _TileCall(node, x_info, w_info, out, fallback, workspace)

    return prepare


class _Operands(NamedTuple):
    """A pointwise call's Y and the operands the tile and lane GEMMs read: Y's flat memory and image
    stride, W flat, X ``[N, C, P]``, the residual's flat memory and image stride (-1: none), the bias."""

    y: np.ndarray
    y_flat: np.ndarray
    y_image: int
    w: np.ndarray
    x: np.ndarray
    r: np.ndarray
    r_image: int
    bias: np.ndarray


class _TileCall:
    """One pointwise Conv node bound to the tile GEMM: what every call shares, worked out once."""

    def __init__(
        self, node: Node, x_info: TensorInfo, w_info: TensorInfo, out: Out,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> None:  # fmt: skip
        self.node, self.out, self.fallback, self.workspace = node, out, fallback, workspace
        self.batch, self.channels, *spatial = (int(d) for d in x_info.shape)
        self.groups = node.attrs.group
        self.kernels, self.positions = int(w_info.shape[0]), math.prod(spatial)
        self.y_shape = (self.batch, self.kernels, *spatial)
        target = out[0] if out is not None else None
        ok = target is not None and target.shape == self.y_shape and target.dtype == np.float32
        self.target = target if ok else None
        bounds = clamp_bounds(node.attrs.fused)
        self.after = None if bounds is not None else node.attrs.fused
        self.low, self.high = (np.float32(b) for b in bounds or (-math.inf, math.inf))
        self.bounds = np.array([self.low, self.high], np.float32)
        self.no_bias = np.zeros(self.kernels, np.float32)
        self.residual_at = 3 if node.attrs.residual else None
        self.items: dict[int, list[np.ndarray]] = {}
        self.shares: dict[int, tuple[int, int]] = {}
        depth = self.channels // self.groups
        self.lanes = node.attrs.packed_weights and lanes_pay(
            self.kernels, depth, self.positions, self.groups, self.batch
        )

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        operands = self._operands(arrays) if runs_own() else None
        if operands is None:
            return [self.fallback(self.node, arrays, self.out, self.workspace)]
        pool = spinning()
        if pool is not None:
            self._job(operands, arrays[1], pool.workers + 1).run(pool)  # type: ignore[arg-type]
        elif self.lanes:
            self._lanes_on_python_pool(LANE_WEIGHTS.get(arrays[1], self.kernels), operands)  # type: ignore[arg-type]
        else:
            self._on_python_pool(operands)
        apply_activation(operands.y, self.after)
        return [operands.y]

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The product as one spin-pool job, shared out as a spinning run (or a one-thread one) shares
        it (``BoundCall``'s capture); None where the call copies X or applies an activation after."""
        x = arrays[0]
        if self.after is not None or not x.flags.c_contiguous or not runs_own():  # type: ignore[union-attr]
            return None
        pool = spinning()
        threads = pool.workers + 1 if pool is not None else intra_op_threads()
        operands = self._operands(arrays) if pool is not None or threads == 1 else None
        if operands is None:
            return None
        return [operands.y], [self._job(operands, arrays[1], threads)]  # type: ignore[arg-type]

    def _operands(self, arrays: Sequence[np.ndarray | None]) -> _Operands | None:
        """Y and the product's operands as the tiles read them; None where Y or the residual does not fit."""
        y = np.empty(self.y_shape, np.float32) if self.target is None else self.target
        residual = arrays[self.residual_at] if self.residual_at is not None else None
        flat_y = flat_images(y)
        flat_r = None if residual is None else _flat_residual(residual, self.y_shape)
        if flat_y is None or (residual is not None and flat_r is None):
            return None
        x, w, b = arrays[0], arrays[1], arrays[2] if len(arrays) > 2 else None
        r, r_image = (flat_y[0], -1) if flat_r is None else flat_r
        return _Operands(
            y, flat_y[0], flat_y[1], np.ascontiguousarray(w, np.float32).reshape(-1),  # type: ignore[arg-type]
            np.ascontiguousarray(x).reshape(self.batch, self.channels, self.positions),  # type: ignore[union-attr]
            r, r_image, self.no_bias if b is None else np.ascontiguousarray(b, np.float32),
        )  # fmt: skip

    def _job(self, ops: _Operands, raw_w: np.ndarray, threads: int) -> Job:
        """The product as a spin-pool job for ``threads`` threads: on the lane GEMM its kernel tiles
        shared out, on the tile GEMM its ``spin_shares``."""
        if self.lanes:
            parts, shares = self._lane_shares(threads)
            return jit_lane_gemm.share_job(LANE_WEIGHTS.get(raw_w, self.kernels), ops.x, ops.y_flat, ops.y_image,
                                           ops.r, ops.r_image, ops.bias, self.bounds, self.kernels, parts,
                                           shares)  # fmt: skip
        return tile_share_job(ops.w, ops.x, ops.y_flat, ops.y_image, ops.r, ops.r_image, ops.bias, self.bounds,
                              self.kernels, self.groups, self._spin_shares(threads))  # fmt: skip

    def _lanes_on_python_pool(self, packed: np.ndarray, ops: _Operands) -> None:
        """The product on the lane GEMM, its kernel tiles shared out on the Python pool."""
        threads = intra_op_threads()
        parts, shares = self._lane_shares(threads)

        def part(index: int) -> None:
            jit_lane_gemm.lane_share(packed, ops.x, ops.y_flat, ops.y_image, ops.r, ops.r_image, ops.bias, self.low,
                                     self.high, self.kernels, parts, index, shares)  # fmt: skip

        parallel_for(part, shares, threads)

    def _lane_shares(self, threads: int) -> tuple[int, int]:
        """(parts of a kernel tile's positions, shares) of the lane GEMM on ``threads`` threads: units of
        ``jit_lane_gemm.position_parts``, ``SPIN_SHARES_PER_THREAD`` shares a thread at most."""
        parts = jit_lane_gemm.position_parts(self.kernels, self.positions, threads)
        units = -(-self.kernels // jit_lane_gemm.TILE_KERNELS) * parts
        return parts, max(1, min(units, threads * SPIN_SHARES_PER_THREAD))

    def _spin_shares(self, threads: int) -> tuple[int, int]:
        """``spin_shares`` for this node on ``threads`` threads (worked out on the first call)."""
        found = self.shares.get(threads)
        if found is None:
            found = self.shares[threads] = spin_shares(self.batch, self.kernels, self.positions, self.groups, threads)
        return found

    def _on_python_pool(self, ops: _Operands) -> None:
        threads = intra_op_threads()
        items = self.items.get(threads)
        if items is None:
            items = self.items[threads] = work_items(self.batch, self.positions, threads)

        def part(index: int) -> None:
            jit_tile_gemm.gemm_items(ops.w, ops.x, ops.y_flat, ops.y_image, ops.r, ops.r_image, ops.bias, self.low,
                                     self.high, self.kernels, self.positions, self.groups, items[index],
                                     jit_tile_gemm.BLOCK_BYTES)  # fmt: skip

        parallel_for(part, len(items), threads)


def product_on_own_threads(w: np.ndarray, x: np.ndarray, y: np.ndarray, groups: int = 1) -> bool:
    """``y[n] = W @ x[n]`` for every image n, in ``groups`` groups (``jit_tile_gemm.gemm_items``), on
    hetflow's own threads (a batch's run; ``runs_own``), split by ``work_items``, or, grouped, as one job
    on a spinning run's pool (``spin_shares``): W ``[kernels, depth / groups]``, x ``[N, depth, P]``, y
    ``[N, kernels, P]``, float32; W and x C-contiguous, y's images each contiguous (a Concat's slice:
    Inception v2's stride-2 layers at batch 16, which then fell back to OpenBLAS on one thread, 7.0 -> 4.4
    ms in-run). Returns False, having done nothing, where the run neither owns its threads nor spins, on
    a spinning run an ungrouped product where BLAS multiplies in vectors as wide as the tiles
    (``threads.blas_is_narrow``), or where the arrays do not fit; the caller then runs BLAS.

    Why: on the Zen 5 VM (2026-11-24) OpenBLAS multiplies at ~90-110 GMAC/s on two cores and the tiles
    at ~210; im2col's and Winograd's products in a batch were OpenBLAS calls per image or element. On the
    Xeon VM (2026-12-02), in a spinning run at batch 16, BLAS's stacked calls per image and group ran
    AlexNet's grouped 3x3 layers at 64 GMAC/s (23.9 and 17.8 ms; the pool: alexnet 0.88x the time), but an
    ungrouped product stays with BLAS there: ZFNet's 96 -> 256 5x5/2 layer took 44.6 ms on it, 59.5 on the
    pool. On the Zen 5 VM again (2026-12-02), ResNet-50 at batch 16 ran its 3x3 stride-2 layers in
    20.5-23.9 ms each with their products on BLAS, ONNX Runtime in 8.6-9.5."""
    pool = spinning()
    # On a spinning run, a grouped product, or any where BLAS is the narrower (``blas_is_narrow``).
    takes = (groups > 1 or blas_is_narrow()) if pool is not None else runs_own()
    if not takes or x.ndim != 3 or y.ndim != 3:
        return False
    if not all(a.dtype == np.float32 and a.flags.c_contiguous for a in (w, x)) or y.dtype != np.float32:
        return False
    found = flat_images(y)  # a Concat's slice too: its images lie apart, each contiguous
    if found is None:
        return False
    flat_y, image = found
    batch, depth, positions = x.shape
    kernels = int(y.shape[1])
    if pool is not None:
        shares = spin_shares(batch, kernels, positions, groups, pool.workers + 1)
        tile_share_job(w.reshape(-1), x, flat_y, image, flat_y, -1, zero_bias(kernels), NO_BOUNDS, kernels, groups,
                       shares).run(pool)  # fmt: skip
        return True
    threads = intra_op_threads()
    items = work_items(batch, positions, threads)
    flat_w = w.reshape(-1)
    bias = zero_bias(kernels)
    if len(items) < threads and batch * kernels * depth * positions // groups >= ROW_SPLIT_MIN_MACS:
        # Too few columns to share out: each thread takes a range of W's row blocks over all of them.
        def rows(index: int) -> None:
            jit_tile_gemm.gemm_share(flat_w, x, flat_y, image, flat_y, -1, bias, _NO_LOW, _NO_HIGH, kernels,
                                     positions, groups, index, threads, threads, jit_tile_gemm.BLOCK_BYTES)  # fmt: skip

        parallel_for(rows, threads, threads)
        return True

    def part(index: int) -> None:
        jit_tile_gemm.gemm_items(flat_w, x, flat_y, image, flat_y, -1, bias, _NO_LOW, _NO_HIGH, kernels, positions,
                                 groups, items[index], jit_tile_gemm.BLOCK_BYTES)  # fmt: skip

    parallel_for(part, len(items), threads)
    return True


_NO_LOW, _NO_HIGH = np.float32(-np.inf), np.float32(np.inf)
#: No clamp, as a tile-GEMM job's (low, high) bounds array.
NO_BOUNDS = np.array([-np.inf, np.inf], np.float32)


def bands_on_own_threads(
    x: np.ndarray, w: np.ndarray, y: np.ndarray, geo: Geometry, buffer: np.ndarray, bias: np.ndarray | None = None,
    bounds: tuple[float, float] = (-math.inf, math.inf),
) -> bool:  # fmt: skip
    """``y[n] = clamp(W @ columns(x[n]) + bias, *bounds)`` for every image of a batch's 2-D im2col Conv, on
    hetflow's own threads: each thread takes whole images, and builds and multiplies each image's
    columns a band of output rows at a time in its own stretch of ``buffer`` (``jit_band_gemm.rows``,
    the bands of one image's spinning run), so the columns never leave the cache. W ``[K, C*kh*kw]``, x
    ``[N, C, H, W]``, y ``[N, K, OH*OW]``, float32, C-contiguous but for y, whose images need only each
    be contiguous (a Concat's slice); ``bias`` float32 ``[K]`` or None.
    Returns False, having done nothing, where the run does not own its threads, a spinning pool is
    running, the arrays do not fit, or ``buffer`` is too small.

    Why: a batch built each chunk's columns whole (7.4 MB an image for a 7x7 stride-2 first layer), then
    multiplied them back from memory: Inception v2's first layer at batch 16 ran at ~80 GMAC/s."""
    if spinning() is not None or not runs_own() or x.ndim != 4 or len(geo.axes) != 2:
        return False
    if not all(a.dtype == np.float32 and a.flags.c_contiguous for a in (x, w, buffer)) or y.dtype != np.float32:
        return False
    found = flat_images(y)  # a Concat's slice too
    if found is None:
        return False
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (int(w.shape[0]),)):
        return False
    batch, channels = int(x.shape[0]), int(x.shape[1])
    rows_axis, cols_axis = geo.axes
    kernels, depth = int(w.shape[0]), channels * rows_axis.kernel * cols_axis.kernel
    out_h, out_w = rows_axis.out, cols_axis.out
    threads = min(intra_op_threads(), batch)
    band_rows = max(1, min(out_h, BAND_BYTES // (4 * depth * out_w)))
    stretch = depth * band_rows * out_w
    if buffer.size < threads * stretch:
        return False
    (flat_y, image), flat_w, flat_buffer = found, w.reshape(-1), buffer.reshape(-1)
    bias = zero_bias(kernels) if bias is None else bias
    low, high = np.float32(bounds[0]), np.float32(bounds[1])
    window = (kernels, rows_axis.kernel, cols_axis.kernel, rows_axis.stride, cols_axis.stride, rows_axis.dilation,
              cols_axis.dilation, rows_axis.pad_begin, cols_axis.pad_begin, out_h, out_w)  # fmt: skip

    def part(index: int) -> None:
        cols = flat_buffer[index * stretch : (index + 1) * stretch]
        for n in range(batch * index // threads, batch * (index + 1) // threads):
            jit_band_gemm.rows(x[n : n + 1], flat_w, bias, low, high, flat_y, n * image, cols, *window, 0, out_h,
                               band_rows, jit_tile_gemm.BLOCK_BYTES)  # fmt: skip

    parallel_for(part, threads, threads)
    return True


@functools.cache
def zero_bias(size: int) -> np.ndarray:
    """A float32 zero bias of ``size`` for the tile GEMM's epilogue, shared between calls (never
    written)."""
    return np.zeros(size, np.float32)


def _flat_residual(residual: np.ndarray, y_shape: tuple[int, ...]) -> tuple[np.ndarray, int] | None:
    """A folded residual as a flat float32 array and its image stride, where it has Y's shape."""
    if residual.shape != y_shape or residual.dtype != np.float32:
        return None
    return flat_images(residual)


# -- im2col in bands ---------------------------------------------------------------------------------
#: Column bytes per band at most (``band_plan``): a band's columns stay in L2 while W passes over them.
BAND_BYTES = 512 << 10


def band_geometry(node: Node, x_info: TensorInfo, w_info: TensorInfo) -> Geometry | None:
    """The windows of an im2col Conv that ``prepare_bands`` runs in bands, else None: float32, one
    image, 2-D, group 1, no folded residual, an activation the tiles clamp, at most ``MAX_DEPTH`` column
    rows (C * kh * kw)."""
    if not _one_image_2d(x_info, w_info):
        return None
    attrs, w_shape = node.attrs, w_info.shape
    if attrs.group != 1 or attrs.residual or clamp_bounds(attrs.fused) is None:
        return None
    if int(w_shape[1]) * int(w_shape[2]) * int(w_shape[3]) > MAX_DEPTH:
        return None
    return geometry(conv_window(attrs, w_shape), x_info.shape[2:])


#: Columns up to this size only are built whole for the tile GEMM (they come back from L2 and L3 for
#: every row block of W); past it OpenBLAS keeps the layer. On the older VM OpenBLAS won from 7 MB
#: (ZFNet's 96 -> 256 5x5 layer took 4629 us whole against 3677), and 2 MB was the cap. On the Zen 5 VM
#: (2026-11-24), where OpenBLAS multiplies at ~90-110 GMAC/s and the tiles at ~210, whole columns win at
#: every size the zoo has at batch 1: ResNet-50's 128 -> 128 3x3 stride 2 (3.6 MB) 1383 -> ~790 us in
#: a run; A/B with a 16 MB cap against 4 MB, zfnet512 0.87, inception_v2 0.96, alexnet 0.97.
COLUMNS_MAX_BYTES = 16 << 20


def columns_geometry(node: Node, x_info: TensorInfo, w_info: TensorInfo) -> Geometry | None:
    """The windows of an im2col Conv that ``prepare_bands`` runs as whole columns on the tile GEMM
    (``_ColumnsCall``), else None: float32, one image, 2-D, group 1, at most ``COLUMNS_MAX_BYTES`` of
    columns, and what bands do not take: more than ``MAX_DEPTH`` column rows, or a folded residual
    (ResNet-50's 1x1 stride-2 projections, which OpenBLAS ran at ~80 GMAC/s inside a batch-1 run: 256 ->
    512 on 56x56, 1293 us against ORT's 441; whole columns, 624)."""
    if not _one_image_2d(x_info, w_info) or node.attrs.group != 1:
        return None
    w_shape = w_info.shape
    depth = int(w_shape[1]) * int(w_shape[2]) * int(w_shape[3])
    geo = geometry(conv_window(node.attrs, w_shape), x_info.shape[2:])
    if (depth <= MAX_DEPTH and not node.attrs.residual) or 4 * depth * math.prod(geo.out) > COLUMNS_MAX_BYTES:
        return None  # bands take the first; the second stays on OpenBLAS
    return geo


#: How ``im2col_on_tiles`` says one image's im2col Conv runs on the tile GEMM.
BANDS, COLUMNS = "bands", "columns"


def im2col_on_tiles(node: Node, x_info: TensorInfo, w_info: TensorInfo) -> tuple[str, Geometry] | None:
    """How a spinning run gives an im2col Conv to the tile GEMM, with its windows: ``BANDS``
    (``band_geometry``), else ``COLUMNS`` (``columns_geometry``); None where it stays on BLAS. The one
    decision ``prepare_bands`` binds and the estimator keys layers by."""
    geo = band_geometry(node, x_info, w_info)
    if geo is not None:
        return BANDS, geo
    geo = columns_geometry(node, x_info, w_info)
    return (COLUMNS, geo) if geo is not None else None


def _one_image_2d(x_info: TensorInfo, w_info: TensorInfo) -> bool:
    """float32 X and W of a 2-D Conv over one image, every dimension known."""
    x_shape, w_shape = x_info.shape, w_info.shape
    if x_info.dtype != np.float32 or w_info.dtype != np.float32 or len(x_shape) != 4 or len(w_shape) != 4:
        return False
    return all(isinstance(d, int) for d in (*x_shape, *w_shape)) and x_shape[0] == 1


def band_plan(depth: int, out_h: int, out_w: int, threads: int, workspace_bytes: int | None = None) -> tuple[int, int]:
    """(shares, band rows) of one image's im2col in bands: ``SPIN_SHARES_PER_THREAD`` ranges of output
    rows a thread (at most one a row), each taken a band of whole rows at a time, as many as fit in
    ``BAND_BYTES`` of columns (at least one), and with a band for every share within ``workspace_bytes``
    where given (one image's columns, as the im2col kernel declares: shares of whole rows can add up to
    more rows than the map, 4 shares of 14 rows for 55, and a plan past the declared workspace allocated
    its buffer, 0.8 MB past a memory budget)."""
    shares = max(1, min(out_h, threads * SPIN_SHARES_PER_THREAD))
    row_bytes = depth * out_w * 4
    band_rows = min(max(1, BAND_BYTES // row_bytes), -(-out_h // shares))
    if workspace_bytes is not None:
        band_rows = max(1, min(band_rows, workspace_bytes // (shares * row_bytes)))
    return shares, band_rows


def prepare_bands(
    fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
    batch_chunk: Callable[[Node, TensorInfo, TensorInfo], int | None] | None = None,
) -> Callable[[Node, Sequence[TensorInfo | None], Out, np.ndarray | None], BoundCall | None]:
    """The im2col kernel's ``prepare``: on a spinning run (``threads.spinning``), one image's Conv that
    ``im2col_on_tiles`` takes runs on the tile GEMM in bands or as whole columns, and a batch's Conv to
    which ``batch_chunk(node, x_info, w_info)`` gives a number of images runs as that many images'
    whole columns at a time (``_BatchColumnsCall``); elsewhere, or when the arrays do not fit,
    ``fallback(node, arrays, out, workspace)`` (im2col with BLAS and the shared epilogue)."""

    def prepare(
        node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
    ) -> BoundCall | None:
        x_info, w_info = inputs[0], inputs[1]
        if x_info is None or w_info is None:
            return None
        chunk = None if batch_chunk is None else batch_chunk(node, x_info, w_info)
        if chunk is not None:
            return _BatchColumnsCall.bind(node, chunk, x_info, w_info, out, fallback, workspace)
        found = im2col_on_tiles(node, x_info, w_info)
        if found is None:
            return None
        way, geo = found
        call = _BandCall if way == BANDS else _ColumnsCall
        return call(node, geo, x_info, w_info, out, fallback, workspace)  # type: ignore[arg-type]

    return prepare


class _BandCall:
    """One im2col Conv node bound to the band job: its window, buffers and bounds worked out once."""

    def __init__(
        self, node: Node, geo: Geometry, x_info: TensorInfo, w_info: TensorInfo, out: Out,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> None:  # fmt: skip
        self.node, self.out, self.fallback, self.workspace = node, out, fallback, workspace
        kernels = int(w_info.shape[0])
        rows, cols = geo.axes
        self.out_h, self.out_w = rows.out, cols.out
        self.depth = int(w_info.shape[1]) * rows.kernel * cols.kernel
        self.y_shape = (1, kernels, rows.out, cols.out)
        target = out[0] if out is not None else None
        ok = target is not None and target.shape == self.y_shape and target.dtype == np.float32
        self.target = target if ok else None
        low, high = clamp_bounds(node.attrs.fused) or (-math.inf, math.inf)
        self.bounds = np.array([low, high], np.float32)
        self.no_bias = np.zeros(kernels, np.float32)
        self.window = (0, kernels, rows.kernel, cols.kernel, rows.stride, cols.stride, rows.dilation,
                       cols.dilation, rows.pad_begin, cols.pad_begin, rows.out, cols.out)  # fmt: skip
        self.plans: dict[int, tuple[int, tuple[int, ...], np.ndarray]] = {}
        self.block = jit_band_gemm.new_job_block()

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        pool = spinning()
        y = np.empty(self.y_shape, np.float32) if self.target is None else self.target
        flat_y = flat_images(y) if pool is not None else None
        if flat_y is None:
            return [self.fallback(self.node, arrays, self.out, self.workspace)]
        x = np.ascontiguousarray(arrays[0], np.float32)
        shares, _ = self._pack(self.block, x, arrays, flat_y[0], pool.workers + 1)  # type: ignore[union-attr]
        pool.run(jit_band_gemm.job_address(), self.block, shares)  # type: ignore[union-attr]
        return [y]

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The bands as one spin-pool job on a spinning run (``BoundCall``'s capture); None elsewhere, or
        where X is not C-contiguous float32 (the call would read a copy)."""
        pool, x = spinning(), arrays[0]
        y = np.empty(self.y_shape, np.float32) if self.target is None else self.target
        flat_y = flat_images(y)
        if pool is None or flat_y is None or x.dtype != np.float32 or not x.flags.c_contiguous:  # type: ignore[union-attr]
            return None
        block = jit_band_gemm.new_job_block()
        shares, kept = self._pack(block, x, arrays, flat_y[0], pool.workers + 1)  # type: ignore[arg-type]
        return [y], [Job(jit_band_gemm.job_address(), block, shares, kept)]

    def _pack(
        self, block: np.ndarray, x: np.ndarray, arrays: Sequence[np.ndarray | None], flat_y: np.ndarray, threads: int
    ) -> tuple[int, tuple[np.ndarray, ...]]:  # fmt: skip
        """Fill ``block`` for the band job on ``threads`` threads; returns its shares and the arrays its
        addresses point into."""
        b = arrays[2] if len(arrays) > 2 else None
        w = np.ascontiguousarray(arrays[1], np.float32).reshape(-1)  # type: ignore[arg-type]
        bias = self.no_bias if b is None else np.ascontiguousarray(b, np.float32)
        shares, numbers, columns = self._plan(threads)
        jit_band_gemm.pack_job(block, x, w, bias, self.bounds, flat_y, columns, numbers)
        return shares, (x, w, bias, self.bounds, flat_y, columns)

    def _plan(self, threads: int) -> tuple[int, tuple[int, ...], np.ndarray]:
        """(shares, the job's numbers, the columns buffer) on ``threads`` threads (``band_plan``), worked
        out on the first call: the buffer holds a band for every share (``jit_band_gemm.rows``), in the
        im2col kernel's declared workspace (one image's columns) where it fits."""
        found = self.plans.get(threads)
        if found is None:
            declared = self.workspace.nbytes if self.workspace is not None else None
            shares, band_rows = band_plan(self.depth, self.out_h, self.out_w, threads, declared)
            size = shares * self.depth * band_rows * self.out_w
            workspace = self.workspace if self.workspace is not None and self.workspace.nbytes >= 4 * size else None
            columns = Scratch(workspace).take((size,), np.float32)
            numbers = (*self.window, band_rows, jit_tile_gemm.BLOCK_BYTES)
            found = self.plans[threads] = (shares, numbers, columns)
        return found


class _ColumnsCall:
    """One image's im2col Conv with more than ``MAX_DEPTH`` column rows on a spinning run: its columns
    built whole (in the im2col kernel's workspace), then multiplied on the tile GEMM as a pointwise Conv
    over them (``_TileCall``: split by row blocks of W where W outweighs the columns).

    Why: OpenBLAS's two threads multiply such products (ResNet-50's 3x3 layers on 7x7 to 28x28 maps:
    2304-4608 column rows, 49-784 columns) at ~75 GMAC/s, then an epilogue passes over Y; the tile GEMM
    on the spinning pool runs the same products at 121-127 GMAC/s (one layer alone, columns ready: 512
    -> 512 3x3 on 7x7, 1489 us through OpenBLAS, 952 on the tiles; 128 -> 128 3x3 stride 2 on 56x56,
    1495 -> 935). Elsewhere (no spinning pool) the fallback, im2col with BLAS, runs it."""

    def __init__(
        self, node: Node, geo: Geometry, x_info: TensorInfo, w_info: TensorInfo, out: Out,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> None:  # fmt: skip
        self.node, self.geo, self.out, self.fallback, self.workspace = node, geo, out, fallback, workspace
        rows, cols = geo.axes
        kernels, depth = int(w_info.shape[0]), int(w_info.shape[1]) * rows.kernel * cols.kernel
        shape = (1, depth, rows.out, cols.out)
        fits = workspace is not None and workspace.nbytes >= 4 * math.prod(shape)
        self.columns = Scratch(workspace if fits else None).take(shape, np.float32)
        self.arrays: Sequence[np.ndarray | None] = ()
        columns_info, weights_info = TensorInfo(shape, np.float32), TensorInfo((kernels, depth, 1, 1), np.float32)
        self.tiles = _TileCall(node, columns_info, weights_info, out, self._fall_back, None)

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if spinning() is None or not runs_own():
            return [self.fallback(self.node, arrays, self.out, self.workspace)]
        compiled_im2col(np.ascontiguousarray(arrays[0], np.float32), self.geo, self.columns)
        self.arrays = arrays
        return self.tiles([self.columns, *arrays[1:]])

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """The columns' fill and the tiles' product as spin-pool jobs (``BoundCall``'s capture); None off a
        spinning run, where X is not C-contiguous float32, or where the tile call does not capture."""
        x = arrays[0]
        if spinning() is None or not runs_own() or x.dtype != np.float32 or not x.flags.c_contiguous:  # type: ignore[union-attr]
            return None
        fill = im2col_job(x, self.geo, self.columns)  # type: ignore[arg-type]
        self.arrays = arrays
        found = self.tiles.capture([self.columns, *arrays[1:]])
        return None if found is None else (found[0], [fill, *found[1]])

    def _fall_back(self, node: Node, columns_arrays: Sequence[np.ndarray | None], out: Out,
                   workspace: np.ndarray | None) -> np.ndarray:  # fmt: skip
        """What the tile call runs where its arrays do not fit it: the im2col kernel on the Conv's own
        inputs (it rebuilds the columns)."""
        return self.fallback(node, self.arrays, out, self.workspace)


class _BatchColumnsCall:
    """A batch's ungrouped im2col Conv on a spinning run, ``chunk`` images at a time: their columns built
    whole (in the im2col kernel's workspace, which holds one chunk's), then multiplied on the tile GEMM as
    a pointwise Conv over them (``_TileCall``), the bias, a folded residual and a clamp applied as its
    tiles are stored.

    Why: where BLAS multiplies in narrower vectors than the tiles (``threads.blas_is_narrow``) these
    products ran on OpenBLAS at half the tiles' rate, and a folded residual took passes of its own over
    Y after them: ResNet-50 at batch 16 on the Zen 5 VM (2026-12-02) ran each 1x1 stride-2 projection
    in 17.6-22.7 ms, where ONNX Runtime ran it and the 1x1 layer beside it in 11.0-11.8 together; its
    3x3 stride-2 layers in 20.5-23.9 ms, ONNX Runtime in 8.6-9.5. After: 10.6-13.7 and 11.5-14.1 ms."""

    def __init__(
        self, node: Node, chunk: int, geo: Geometry, target: np.ndarray, depth: int,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> None:  # fmt: skip
        self.node, self.geo, self.fallback, self.workspace = node, geo, fallback, workspace
        self.out = (target,)
        batch, kernels = int(target.shape[0]), int(target.shape[1])
        rows, cols = geo.axes
        shape = (chunk, depth, rows.out, cols.out)
        fits = workspace is not None and workspace.nbytes >= 4 * math.prod(shape)
        self.columns = Scratch(workspace if fits else None).take(shape, np.float32)
        self.chunks = [(first, min(batch, first + chunk)) for first in range(0, batch, chunk)]
        weights_info = TensorInfo((kernels, depth, 1, 1), np.float32)
        self.tiles = [
            _TileCall(node, TensorInfo((last - first, *shape[1:]), np.float32), weights_info, (target[first:last],),
                      _never_falls_back, None)
            for first, last in self.chunks
        ]  # fmt: skip
        self.residual_at = 3 if node.attrs.residual else None

    @classmethod
    def bind(
        cls, node: Node, chunk: int, x_info: TensorInfo, w_info: TensorInfo, out: Out,
        fallback: Callable[[Node, Sequence[np.ndarray | None], Out, np.ndarray | None], np.ndarray],
        workspace: np.ndarray | None,
    ) -> _BatchColumnsCall | None:  # fmt: skip
        """The call, where the run hands the Conv a float32 Y of its shape whose images are each
        contiguous (the chunks' products are written straight into it); else None."""
        geo = geometry(conv_window(node.attrs, w_info.shape), x_info.shape[2:])
        target = out[0] if out is not None else None
        y_shape = (int(x_info.shape[0]), int(w_info.shape[0]), *geo.out)
        if target is None or target.shape != y_shape or target.dtype != np.float32 or flat_images(target) is None:
            return None
        depth = int(w_info.shape[1]) * math.prod(geo.kernel)
        return cls(node, chunk, geo, target, depth, fallback, workspace)

    def __call__(self, arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        if spinning() is None or not runs_own() or not self._fits(arrays):
            return [self.fallback(self.node, arrays, self.out, self.workspace)]
        x = np.ascontiguousarray(arrays[0], np.float32)
        for (first, last), tiles in zip(self.chunks, self.tiles):
            columns = self.columns[: last - first]
            compiled_im2col(x[first:last], self.geo, columns)
            tiles([columns, *self._chunk_operands(arrays, first, last)])
        return [self.out[0]]

    def capture(self, arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
        """Each chunk's columns fill and product as spin-pool jobs (``BoundCall``'s capture); None off a
        spinning run, where X is not C-contiguous float32, or where a product does not capture."""
        x = arrays[0]
        if spinning() is None or not runs_own() or x.dtype != np.float32 or not x.flags.c_contiguous:  # type: ignore[union-attr]
            return None
        if not self._fits(arrays):  # a residual the tiles do not read: the call falls back
            return None
        jobs: list[Job] = []
        for (first, last), tiles in zip(self.chunks, self.tiles):
            columns = self.columns[: last - first]
            jobs.append(im2col_job(x[first:last], self.geo, columns))  # type: ignore[index]
            found = tiles.capture([columns, *self._chunk_operands(arrays, first, last)])
            if found is None:
                return None
            jobs += found[1]
        return [self.out[0]], jobs

    def _fits(self, arrays: Sequence[np.ndarray | None]) -> bool:
        """Whether a folded residual is one the tiles read (float32, Y's shape, its images contiguous)."""
        if self.residual_at is None:
            return True
        residual = arrays[self.residual_at]
        return residual is not None and _flat_residual(residual, self.out[0].shape) is not None

    def _chunk_operands(self, arrays: Sequence[np.ndarray | None], first: int, last: int) -> list[np.ndarray | None]:
        """W, the bias and the chunk's images of a folded residual, as its tile call reads them."""
        operands = list(arrays[1:])
        if self.residual_at is not None:
            operands[self.residual_at - 1] = arrays[self.residual_at][first:last]  # type: ignore[index]
        return operands


def _never_falls_back(node: Node, arrays: Sequence[np.ndarray | None], out: Out, workspace: np.ndarray | None) -> np.ndarray:
    """A chunk's tile call's fallback: ``_BatchColumnsCall`` checks first what the tile call would fall back
    on (a spinning run, Y and the residual as the tiles read them)."""
    raise AssertionError(f"a chunk of {node.name}'s columns fell back from the tile GEMM")
