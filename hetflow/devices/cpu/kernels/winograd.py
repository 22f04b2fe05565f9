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
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from hetflow.devices.base import InputInfos
from hetflow.devices.cpu.kernels import jit_tile_gemm, own_gemm
from hetflow.devices.cpu.kernels.buffers import Scratch, aligned
from hetflow.devices.cpu.kernels.conv import FINISHING, FinishingBody, conv_kernel, target_y, window_of
from hetflow.devices.cpu.kernels.jit_winograd import (
    Coefficients,
    coefficients,
    input_transform,
    output_transform,
)
from hetflow.devices.cpu.kernels.weight_cache import WeightCache
from hetflow.devices.cpu.threads import SPIN_SHARES_PER_THREAD, spinning, split_matmul
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
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
    fitting = max(1, PASS_BYTES // max(1, first + second))
    images = max(1, -(-batch // -(-batch // fitting)))  # equal passes
    return images, aligned(first * images), aligned(second * images)


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


def winograd(
    node: Node, x: np.ndarray, w: np.ndarray, m: int, y: np.ndarray | None, scratch: Scratch,
    bias: np.ndarray | None = None, fused: FusedActivation | None = None,
) -> tuple[np.ndarray, bool]:
    """3x3 stride-1 Conv by Winograd F(m x m, 3 x 3); any H, W, padding and batch; x's dtype.

    Adds ``bias`` and applies ``fused`` on the way out; returns Y and whether the activation was applied
    (the caller applies any the compiled output transform does not).
    """
    geo = geometry(conv_window(node.attrs, w.shape), x.shape[2:])
    rows, cols = geo.axes
    batch, channels = x.shape[:2]
    kernels = w.shape[0]
    alpha = m + 2
    tiles = (-(-rows.out // m), -(-cols.out // m))
    count = batch * tiles[0] * tiles[1]
    if count == 0 or kernels == 0:  # an empty Y
        return target_y(y, (batch, kernels, rows.out, cols.out), x.dtype), True
    bt, at = _matrices(m, x.dtype)
    u = TRANSFORMED_WEIGHTS.get(w, m)
    images, first_bytes, second_bytes = _passes(node, x.shape, w.shape, x.dtype, m)
    inputs, outputs = scratch.region(first_bytes), scratch.region(second_bytes)
    y = target_y(y, (batch, kernels, rows.out, cols.out), x.dtype)
    activated = True
    for start in range(0, batch, images):
        part = slice(start, min(batch, start + images))
        count = (part.stop - part.start) * tiles[0] * tiles[1]
        inputs.reset()
        outputs.reset()
        v = inputs.take((alpha * alpha, channels, count), x.dtype)
        input_transform(x[part], bt, m, (rows.pad_begin, cols.pad_begin), tiles, v)
        products = outputs.take((alpha * alpha, kernels, count), x.dtype)
        multiply_elements(u, v, products)
        activated = output_transform(products, at, bias, y[part], tiles, fused)
    return y, activated


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
    # By whole elements (every share its own U[e] and V[e]: 16 or 36 of them), not by row blocks, where
    # each share would read all of V.
    shares, row_parts = min(elements, (pool.workers + 1) * SPIN_SHARES_PER_THREAD), 1
    flat_products = products.reshape(-1)
    block = jit_tile_gemm.new_job_block()
    jit_tile_gemm.pack_job(block, u.reshape(-1), v.reshape(1, elements * channels, count), flat_products,
                           flat_products.size, flat_products, -1, own_gemm.zero_bias(elements * kernels), _UNBOUNDED,
                           elements * kernels, count, elements, row_parts, jit_tile_gemm.BLOCK_BYTES)  # fmt: skip
    pool.run(jit_tile_gemm.job_address(), block, shares)


#: No clamp on the products: (low, high) of the tile GEMM's epilogue.
_UNBOUNDED = np.array([-np.inf, np.inf], np.float32)


def _finishing(m: int) -> FinishingBody:
    def finish(
        node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch, bias: np.ndarray | None
    ) -> tuple[np.ndarray, bool]:
        return winograd(node, x, w, m, y, scratch, bias, node.attrs.fused)

    return finish


@conv_kernel(WINOGRAD_F23, supports=_supports_winograd, workspace=winograd_workspace(WINOGRAD_TILE[WINOGRAD_F23]))
def winograd_f23(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """3x3 stride-1 Conv by Winograd F(2x2, 3x3): 16 GEMMs, 2.25x fewer multiplications."""
    return winograd(node, x, w, WINOGRAD_TILE[WINOGRAD_F23], y, scratch)[0]


@conv_kernel(WINOGRAD_F43, supports=_supports_winograd, workspace=winograd_workspace(WINOGRAD_TILE[WINOGRAD_F43]))
def winograd_f43(node: Node, x: np.ndarray, w: np.ndarray, y: np.ndarray | None, scratch: Scratch) -> np.ndarray:
    """3x3 stride-1 Conv by Winograd F(4x4, 3x3): 36 GEMMs, 4x fewer multiplications."""
    return winograd(node, x, w, WINOGRAD_TILE[WINOGRAD_F43], y, scratch)[0]


FINISHING[winograd_f23] = _finishing(WINOGRAD_TILE[WINOGRAD_F23])
FINISHING[winograd_f43] = _finishing(WINOGRAD_TILE[WINOGRAD_F43])
