"""CPU kernels: Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution (Lavin & Gray, 2016).

A 3x3 stride-1 convolution computes each m x m output tile from an a x a input tile (a = m + 2) as
``Y = A^T [(G g G^T) * (B^T d B)] A``: per tile element, the products over input channels are a GEMM, so
the whole layer is a^2 independent GEMMs ``[K, C] x [C, tiles]`` with (m + 2)^2 / (9 m^2) of direct
convolution's multiplications (0.44x for F(2,3), 0.25x for F(4,3)).

Layout: ``V [a*a, C, T]`` (T = N * tiles_h * tiles_w tiles), so that the products are one batched BLAS
``matmul`` ``[a*a, K, C] x [a*a, C, T]``; the transforms on either side of it are compiled
(``jit_winograd``): the input transform reads X directly (padding and partial tiles read as zero) and
writes V; the output transform reads the products and writes Y's rows with the bias added, the fused
activation applied and the partial tiles cropped. (They were a gather copy, two Kronecker-matrix GEMMs
and a scatter copy in numpy: 1.8x slower on VGG-19's 64x224x224 layer, on one core.)

U depends only on the weights: it is computed once per weight array (in float64, then rounded) and
kept in ``TRANSFORMED_WEIGHTS`` for as long as that array lives, so a session's steady-state run never
redoes it. The transform matrices come from Cook-Toom interpolation at the points 0, 1, -1 (F(2,3)) and
0, 1, -1, 2, -2 (F(4,3)) plus infinity, built exactly with fractions; the fractions live in G (applied
offline in float64) so that B^T and A^T are small integers. F(6,3) was measured too: no faster than
F(4,3) on the 2-core reference machine and with twice its float32 error, so it is not offered.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from hetflow.devices.base import BoundCall, InputInfos, PrepareFn, with_capture
from hetflow.devices.cpu.kernels import jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.buffers import Out, Scratch, aligned
from hetflow.devices.cpu.kernels.conv import (
    FINISHING,
    PREPARES,
    FinishingBody,
    conv_kernel,
    target_y,
    window_of,
    with_epilogue,
)
from hetflow.devices.cpu.kernels.jit_winograd import (
    Coefficients,
    coefficients,
    input_job,
    input_transform,
    output_job,
    output_transform,
)
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.spin_pool import Job
from hetflow.devices.cpu.threads import SPIN_SHARES_PER_THREAD, spinning, split_matmul
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import WINOGRAD_F23, WINOGRAD_F43, WINOGRAD_TILE, conv_window, winograd_unsupported
from hetflow.ops.spatial import geometry

#: Interpolation points of F(m, 3) besides infinity (m + 1 of them).
POINTS: dict[int, tuple[Fraction, ...]] = {
    2: tuple(Fraction(p) for p in (0, 1, -1)),
    4: tuple(Fraction(p) for p in (0, 1, -1, 2, -2)),
}


@dataclass(frozen=True)
class Transforms:
    """The matrices of F(m x m, r x r): ``Y = AT [(G g G^T) * (BT d BT^T)] AT^T``.

    Attributes:
        m: output tile edge.
        r: filter edge.
        at: ``[m, a]`` output transform.
        g: ``[a, r]`` filter transform.
        bt: ``[a, a]`` input transform.
    """

    m: int
    r: int
    at: np.ndarray
    g: np.ndarray
    bt: np.ndarray

    @property
    def alpha(self) -> int:
        return self.m + self.r - 1


def _evaluation_matrix(points: tuple[Fraction, ...], size: int) -> list[list[Fraction]]:
    """Rows evaluate a polynomial of ``size`` coefficients at each point, then at infinity (top coeff)."""
    rows = [[p**i for i in range(size)] for p in points]
    rows.append([Fraction(0)] * (size - 1) + [Fraction(1)])
    return rows


def _inverse(matrix: list[list[Fraction]]) -> list[list[Fraction]]:
    """Exact Gauss-Jordan inverse of a small square matrix of fractions."""
    n = len(matrix)
    rows = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(matrix)]
    for col in range(n):
        pivot = next(i for i in range(col, n) if rows[i][col] != 0)
        rows[col], rows[pivot] = rows[pivot], rows[col]
        rows[col] = [v / rows[col][col] for v in rows[col]]
        for i in range(n):
            if i != col and rows[i][col] != 0:
                factor = rows[i][col]
                rows[i] = [a - factor * b for a, b in zip(rows[i], rows[col])]
    return [row[n:] for row in rows]


@cache
def transforms(m: int, r: int = 3) -> Transforms:
    """Cook-Toom matrices of F(m, r).

    Linear convolution of an r-tap filter with an m-sample signal is evaluation at a = m + r - 1 points,
    pointwise product and interpolation; correlation (what Conv computes) is its transpose, so
    ``AT = Vm^T``, ``G = Vr`` and ``BT = (Va^-1)^T`` with V the evaluation matrices. Each row of BT is
    then scaled to integers and G's row divided by the same factor.
    """
    points = POINTS[m]
    alpha = m + r - 1
    bt = [list(col) for col in zip(*_inverse(_evaluation_matrix(points, alpha)))]
    g = _evaluation_matrix(points, r)
    at = [list(col) for col in zip(*_evaluation_matrix(points, m))]
    for i in range(alpha):
        scale = math.lcm(*(v.denominator for v in bt[i]))
        bt[i] = [v * scale for v in bt[i]]
        g[i] = [v / scale for v in g[i]]

    def as_array(rows: list[list[Fraction]]) -> np.ndarray:
        return np.array([[float(v) for v in row] for row in rows])

    return Transforms(m, r, as_array(at), as_array(g), as_array(bt))


# -- transformed weights, once per weight array --------------------------------------------------------
#: Transformed weights U ``[a*a, K, C]`` per (weight array, tile size m).
TRANSFORMED_WEIGHTS = WeightCache(lambda w, m: transform_weights(w, m))  # defined below


def transform_weights(w: np.ndarray, m: int) -> np.ndarray:
    """U = G g G^T for every (k, c), as ``[a*a, K, C]`` in w's dtype (computed in float64)."""
    kernels, channels = w.shape[:2]
    g = transforms(m).g
    u = np.kron(g, g) @ w.reshape(kernels * channels, 9).T.astype(np.float64)  # [a*a, K*C]
    alpha = m + 2
    return np.ascontiguousarray(u.astype(w.dtype).reshape(alpha * alpha, kernels, channels))


# -- the kernel ----------------------------------------------------------------------------------------
def _supports_winograd(node: Node, inputs: InputInfos) -> str | None:
    spec = window_of(node, inputs)
    if isinstance(spec, str):
        return spec
    return winograd_unsupported(spec, node.attrs.group)


#: The transformed input and the products of one pass hold at most this much (at least one image's): a
#: batch whose V and M would hold more goes through in equal passes of whole images, so VGG-19 at batch
#: 16 works in 120 MB (F(4,3), 64 kernels on 224x224: 30 MB an image), not 882 MB. Smaller passes cost
#: time, U being read again by each: VGG-19 at batch 16 took 1.00x as long with 128 MB, 1.12x with 64,
#: 1.32x with 32.
PASS_BYTES = 128 * 2**20
#: A layer whose U is small takes passes of at most this many times U's bytes (but ``MIN_PASS_BYTES`` at
#: least): reading U again costs such a pass ~3% more traffic. GoogLeNet's and Inception v2's 64 -> 192
#: layers at 56x56 (U 1.8 MB, 7.2 MB of V and M an image) had held 110 MB at batch 16, the largest
#: workspace of either network, so most of its arena.
PASS_PER_U = 16
MIN_PASS_BYTES = 16 * 2**20


def _image_scratch(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, m: int
) -> tuple[int, int]:
    """Bytes of one image's transformed input ``V [a*a, C, T]`` and products ``M [a*a, K, T]``."""
    rows, cols = geometry(conv_window(node.attrs, w_shape), x_shape[2:]).axes
    channels, kernels = int(x_shape[1]), int(w_shape[0])
    elements = (m + 2) ** 2 * (-(-rows.out // m)) * (-(-cols.out // m)) * np.dtype(dtype).itemsize
    return elements * channels, elements * kernels


def _passes(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, m: int
) -> tuple[int, int, int]:
    """Images per pass (``PASS_BYTES``), and the bytes of one pass's V ``[a*a, C, T]`` and M ``[a*a, K,
    T]``."""
    batch = int(x_shape[0])
    first, second = _image_scratch(node, x_shape, w_shape, dtype, m)
    fitting = max(1, pass_bytes(w_shape, dtype, m) // max(1, first + second))
    images = max(1, -(-batch // -(-batch // fitting)))  # equal passes
    return images, aligned(first * images), aligned(second * images)


def transformed_weight_bytes(w_shape: Sequence[int], dtype: np.dtype, m: int) -> int:
    """Bytes of U ``[(m+2)^2, K, C]`` for weights of ``w_shape`` ``[K, C, 3, 3]`` (``transform_weights``)."""
    return (m + 2) ** 2 * int(w_shape[0]) * int(w_shape[1]) * np.dtype(dtype).itemsize


def pass_bytes(w_shape: tuple[int, ...], dtype: np.dtype, m: int) -> int:
    """The most bytes of V and M one pass of a layer with weights ``w_shape`` holds (``PASS_PER_U``)."""
    return min(PASS_BYTES, max(MIN_PASS_BYTES, PASS_PER_U * transformed_weight_bytes(w_shape, dtype, m)))


def images_per_pass(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, m: int
) -> int:
    """How many of the batch's images one pass transforms and multiplies (``PASS_BYTES``)."""
    return _passes(node, x_shape, w_shape, dtype, m)[0]


def _winograd_scratch(
    node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...], dtype: np.dtype, m: int
) -> tuple[int, int]:
    """Bytes of one pass's transformed input ``V [a*a, C, T]`` and products ``M [a*a, K, T]``."""
    return _passes(node, x_shape, w_shape, dtype, m)[1:]


def winograd_workspace(m: int) -> Callable[[Node, tuple[int, ...], tuple[int, ...], np.dtype], int]:
    return lambda node, x_shape, w_shape, dtype: sum(_winograd_scratch(node, x_shape, w_shape, dtype, m))


@cache
def _matrices(m: int, dtype: np.dtype) -> tuple[Coefficients, Coefficients]:
    """(B^T, A^T) of F(m, 3) in ``dtype``, as the compiled transforms take them."""
    found = transforms(m)
    return coefficients(found.bt, dtype), coefficients(found.at, dtype)


@dataclass(frozen=True)
class _Pass:
    """One pass of a layer (``PASS_BYTES``): its images of X and Y, and the scratch its V and M take."""

    x: np.ndarray
    v: np.ndarray
    products: np.ndarray
    y: np.ndarray


@dataclass(frozen=True)
class _Layer:
    """What a Winograd layer works out before its passes: the transforms, U, the tiling, the passes."""

    bt: Coefficients
    at: Coefficients
    u: np.ndarray
    pads: tuple[int, int]
    tiles: tuple[int, int]
    y: np.ndarray
    passes: tuple[_Pass, ...]


def _layer(node: Node, x: np.ndarray, w: np.ndarray, m: int, y: np.ndarray | None, scratch: Scratch) -> _Layer:
    """Lay the layer out: its Y (``y`` when it fits), and its passes over the batch, each with V and M in
    the same two regions of ``scratch`` (a pass's values are dead once it has written Y). No pass when Y
    is empty."""
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    rows, cols = geo.axes
    batch, channels = x.shape[:2]
    kernels = w.shape[0]
    alpha = m + 2
    tiles = (-(-rows.out // m), -(-cols.out // m))
    bt, at = _matrices(m, x.dtype)
    y = target_y(y, (batch, kernels, rows.out, cols.out), x.dtype)
    if batch * tiles[0] * tiles[1] == 0 or kernels == 0:
        return _Layer(bt, at, np.empty(0, x.dtype), (rows.pad_begin, cols.pad_begin), tiles, y, ())
    images, first_bytes, second_bytes = _passes(node, x.shape, w.shape, x.dtype, m)
    inputs, outputs = scratch.region(first_bytes), scratch.region(second_bytes)
    passes = []
    for start in range(0, batch, images):
        part = slice(start, min(batch, start + images))
        count = (part.stop - part.start) * tiles[0] * tiles[1]
        inputs.reset()
        outputs.reset()
        v = inputs.take((alpha * alpha, channels, count), x.dtype)
        products = outputs.take((alpha * alpha, kernels, count), x.dtype)
        passes.append(_Pass(x[part], v, products, y[part]))
    u = TRANSFORMED_WEIGHTS.get(w, m)
    return _Layer(bt, at, u, (rows.pad_begin, cols.pad_begin), tiles, y, tuple(passes))


def winograd(
    node: Node, x: np.ndarray, w: np.ndarray, m: int, y: np.ndarray | None, scratch: Scratch,
    bias: np.ndarray | None = None, fused: FusedActivation | None = None,
) -> tuple[np.ndarray, bool]:
    """3x3 stride-1 Conv by Winograd F(m x m, 3 x 3); any H, W, padding and batch; x's dtype.

    Adds ``bias`` and applies ``fused`` on the way out; returns Y and whether the activation was applied
    (the caller applies any the compiled output transform does not).
    """
    layer = _layer(node, x, w, m, y, scratch)
    activated = True
    for step in layer.passes:
        input_transform(step.x, layer.bt, m, layer.pads, layer.tiles, step.v)
        multiply_elements(layer.u, step.v, step.products)
        activated = output_transform(step.products, layer.at, bias, step.y, layer.tiles, fused)
    return layer.y, activated


def winograd_jobs(
    node: Node, x: np.ndarray, w: np.ndarray, m: int, y: np.ndarray | None, scratch: Scratch,
    bias: np.ndarray | None = None, fused: FusedActivation | None = None,
) -> tuple[np.ndarray, list[Job]] | None:
    """``winograd`` as the spin-pool jobs a captured run replays (each pass's input transform, products
    and output transform, split as a spinning run splits them), and the Y they write; None where the jobs
    cannot do all of it: X or W not float32 and C-contiguous, Y's images not contiguous, or an activation
    the output transform leaves."""
    if not all(a.dtype == np.float32 and a.flags.c_contiguous for a in (x, w)):
        return None
    layer = _layer(node, x, w, m, y, scratch)
    jobs: list[Job] = []
    for step in layer.passes:
        finish = output_job(step.products, layer.at, bias, step.y, layer.tiles, fused)
        if finish is None:
            return None
        jobs += [input_job(step.x, layer.bt, m, layer.pads, layer.tiles, step.v),
                 multiply_job(layer.u, step.v, step.products), finish]  # fmt: skip
    return layer.y, jobs


def multiply_elements(u: np.ndarray, v: np.ndarray, products: np.ndarray) -> None:
    """``products[e] = u[e] @ v[e]`` for every tile element e (``[a*a, K, C] x [a*a, C, T]``).

    On a spinning run or hetflow's own threads, float32 and contiguous, the a*a products are one grouped
    pointwise product on the tile GEMM (``jit_tile_gemm``: a*a groups of K kernels over C channels and T
    positions), shared out by whole elements; elsewhere ``split_matmul`` (single-threaded BLAS per part).
    Summed inside runs at batch 1 with T <= 64, BLAS -> tiles: F(2,3) layers resnet50 4678 -> 4244 us,
    inception_v2 3385 -> 3063, googlenet 2218 -> 2087. On the Zen 5 VM (2026-11-24) larger T gains more,
    one layer alone, spinning, BLAS -> tiles: F(4,3) 64 -> 64 on 56x56 (T = 196) 338 -> 149 us, 64 -> 192
    on 56x56 928 -> 414, 64 -> 64 on 112x112 (T = 784) 1303 -> 543; F(2,3) 128 -> 128 on 28x28 532 -> 244
    (on the older VM the tiles had lost 5% at T = 196). A batch's run on hetflow's own threads shares the
    same grouped product out by columns (``own_gemm.product_on_own_threads``): A/B at batch 16 vgg19 0.75,
    inception_v2 and googlenet 0.88, resnet50 0.94."""
    pool = spinning()
    elements, kernels, channels = u.shape
    count = v.shape[2]
    arrays_fit = all(a.dtype == np.float32 and a.flags.c_contiguous for a in (u, v, products))
    if not arrays_fit:
        split_matmul(u, v, out=products)
        return
    if pool is None:
        as_images = (v.reshape(1, elements * channels, count), products.reshape(1, elements * kernels, count))
        if not own_gemm.product_on_own_threads(u, *as_images, groups=elements):
            split_matmul(u, v, out=products)
        return
    multiply_job(u, v, products).run(pool)


def multiply_job(u: np.ndarray, v: np.ndarray, products: np.ndarray) -> Job:
    """``multiply_elements`` (float32, C-contiguous) as a spin-pool job on the tile GEMM: shared out by
    whole elements (each share its own U[e] and V[e], 16 or 36 of them), not by row blocks, where each
    share would read all of V; one chunk without a spinning pool."""
    pool = spinning()
    elements, kernels, channels = u.shape
    count = v.shape[2]
    shares = 1 if pool is None else min(elements, (pool.workers + 1) * SPIN_SHARES_PER_THREAD)
    flat_products = products.reshape(-1)
    return jit_tile_gemm.share_job(u.reshape(-1), v.reshape(1, elements * channels, count), flat_products,
                                   flat_products.size, flat_products, -1, own_gemm.zero_bias(elements * kernels),
                                   own_gemm.NO_BOUNDS, elements * kernels, count, elements, 1, jit_tile_gemm.BLOCK_BYTES,
                                   shares)  # fmt: skip


def _finishing(m: int) -> FinishingBody:
    def finish(
        node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None
    ) -> tuple[np.ndarray, bool]:
        return winograd(node, x, w, m, y, scratch, bias, node.attrs.fused)

    return finish


def _prepare(algorithm: str) -> PrepareFn:
    """``Kernel.prepare`` of a Winograd algorithm: a float32 node whose Y the memory plan places, called as
    ``run_conv`` calls it, and captured as its transforms' and products' jobs (``winograd_jobs``), which a
    captured run replays with no Python between them. In a run, a Python step after compiled ones paid
    far more than alone (its interpreter state evicted): resnet50 at batch 1, each F(2,3)/F(4,3) layer
    0.08-0.24 ms more in the run than alone, against 0.02-0.14 for the captured pointwise layers."""
    m = WINOGRAD_TILE[algorithm]
    fallback = with_epilogue(algorithm)

    def prepare(
        node: Node, inputs: Sequence[TensorInfo | None], out: Out, workspace: np.ndarray | None
    ) -> BoundCall | None:
        x_info, w_info = inputs[0], inputs[1]
        target = out[0] if out is not None else None
        if x_info is None or w_info is None or target is None or node.attrs.residual:
            return None
        if not all(info.dtype == np.float32 for info in (x_info, w_info, target)):
            return None

        def call(arrays: Sequence[np.ndarray | None]) -> list[np.ndarray]:
            return [fallback(node, arrays, out, workspace)]

        def capture(arrays: Sequence[np.ndarray | None]) -> tuple[list[np.ndarray], list[Job]] | None:
            x, w = arrays[0], arrays[1]
            b = arrays[2] if len(arrays) > 2 else None
            bias = None if b is None else np.ascontiguousarray(b, np.float32)
            found = winograd_jobs(node, x, w, m, target, Scratch(workspace), bias, node.attrs.fused)  # type: ignore[arg-type]
            return None if found is None else ([found[0]], found[1])

        return with_capture(call, capture)

    return prepare


@conv_kernel(WINOGRAD_F23, supports=_supports_winograd, workspace=winograd_workspace(WINOGRAD_TILE[WINOGRAD_F23]),
             prepare=_prepare(WINOGRAD_F23))  # fmt: skip
def winograd_f23(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """3x3 stride-1 Conv by Winograd F(2x2, 3x3): 16 GEMMs, 2.25x fewer multiplications."""
    return winograd(node, x, w, WINOGRAD_TILE[WINOGRAD_F23], y, scratch)[0]


@conv_kernel(WINOGRAD_F43, supports=_supports_winograd, workspace=winograd_workspace(WINOGRAD_TILE[WINOGRAD_F43]),
             prepare=_prepare(WINOGRAD_F43))  # fmt: skip
def winograd_f43(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """3x3 stride-1 Conv by Winograd F(4x4, 3x3): 36 GEMMs, 4x fewer multiplications."""
    return winograd(node, x, w, WINOGRAD_TILE[WINOGRAD_F43], y, scratch)[0]


FINISHING[winograd_f23] = _finishing(WINOGRAD_TILE[WINOGRAD_F23])
FINISHING[winograd_f43] = _finishing(WINOGRAD_TILE[WINOGRAD_F43])
PREPARES[WINOGRAD_F23] = _prepare(WINOGRAD_F23)
PREPARES[WINOGRAD_F43] = _prepare(WINOGRAD_F43)
