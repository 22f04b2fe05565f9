"""The cost models a DeviceProfile parameterises, and the small numerical tools that fit them.

Kept apart from calibration (which measures) and prediction (which walks a graph) so both read the
same formulas: a model evaluated at predict time is exactly the one fitted at calibrate time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hetflow.estimate.profile import FEATURES, GemmModel, MemoryModel
from hetflow.ops.base import Cost, GemmDims

#: Unit of the "overhead" and "calls" features: their coefficients read as microseconds.
MICROSECOND = 1e-6
#: Coefficients for an (op, algorithm) the profile has never seen: overhead + GEMM + memory + arithmetic.
FALLBACK_COEF = (5.0, 1.0, 1.0, 1.0, 1.0, 2.0, 1.0)


# -- GEMM ----------------------------------------------------------------------------------------
def _position(value: float, knots: Sequence[float]) -> tuple[int, float]:
    """Index ``i`` and weight ``w`` so that ``log value`` lies ``w`` of the way from knot i to i+1.

    Clamped at both ends (no extrapolation of the tabulated terms).
    """
    if len(knots) < 2:
        return 0, 0.0
    logs = np.log(np.asarray(knots, dtype=np.float64))
    pos = float(np.interp(math.log(max(value, 1e-12)), logs, np.arange(len(logs), dtype=np.float64)))
    index = min(int(pos), len(knots) - 2)
    return index, pos - index


def _trilinear(grid: np.ndarray, positions: Sequence[tuple[int, float]]) -> float:
    total = 0.0
    for corner in range(8):
        weight = 1.0
        index = []
        for axis, (i, frac) in enumerate(positions):
            upper = (corner >> axis) & 1
            if grid.shape[axis] == 1:
                if upper:
                    weight = 0.0
                index.append(0)
                continue
            weight *= frac if upper else 1.0 - frac
            index.append(i + upper)
        if weight:
            total += weight * float(grid[tuple(index)])
    return total


def gemm_base_seconds(model: GemmModel, n: int, m: int, k: int) -> float:
    """The GEMM model without its grid correction (fixed cost + arithmetic + per-element terms)."""
    n, m, k = float(n), float(m), float(k)
    return (model.overhead_s + n * m * k / (model.peak_gflops * 0.5e9)
            + m * k * model.columns_s + n * k * model.weights_s + n * m * model.output_s)


def gemm_correction(model: GemmModel, n: int, m: int, k: int) -> float:
    """``log(measured / base)`` interpolated over the calibration grid (0 without a grid)."""
    grid = np.asarray(model.residual, dtype=np.float64)
    if grid.ndim != 3 or not grid.size:
        return 0.0
    positions = [_position(size, model.knots[axis]) for axis, size in (("n", n), ("m", m), ("k", k))]
    return _trilinear(grid, positions)


def gemm_seconds(model: GemmModel, n: int, m: int, k: int) -> float:
    """Predicted seconds of one ``[n x k] @ [k x m]`` product."""
    if n * m * k <= 0:
        return 0.0
    return gemm_base_seconds(model, n, m, k) * math.exp(gemm_correction(model, n, m, k))


def stacked_gemm_seconds(model: GemmModel, dims: GemmDims) -> float:
    """Predicted seconds of ``dims.count`` products of one shape, one after another.

    NOTE: the grid times one matmul call, its fixed cost included; a stack of products pays that once
    (the per-product overhead is the op models' "calls" feature).
    """
    single = gemm_seconds(model, dims.n, dims.m, dims.k)
    return single + (dims.count - 1) * max(single - model.overhead_s, 0.1 * single)


def split_gemm_seconds(one_thread: GemmModel, dims: GemmDims, threads: int) -> float:
    """Predicted seconds of ``dims`` when a run splits its products over its own ``threads``
    (``hetflow.devices.cpu.threads.split_matmul``): each part is one single-threaded BLAS call, so the
    time is the largest part's on the one-thread model: a stack split by products, one product by its
    columns. Products under ``MIN_MACS_PER_SPLIT`` in all run unsplit, on one thread."""
    from hetflow.devices.cpu.threads import MIN_MACS_PER_SPLIT

    if threads <= 1 or dims.count * dims.n * dims.m * dims.k < MIN_MACS_PER_SPLIT:
        return stacked_gemm_seconds(one_thread, dims)
    if dims.count > 1:
        return stacked_gemm_seconds(one_thread, GemmDims(dims.n, dims.m, dims.k, -(-dims.count // threads)))
    parts = min(threads, dims.m)
    return gemm_seconds(one_thread, dims.n, -(-dims.m // parts), dims.k)


# -- memory --------------------------------------------------------------------------------------
def bandwidth(model: MemoryModel, working_set: float) -> float:
    """Bytes per second for a pass over ``working_set`` bytes (log-log interpolation, clamped)."""
    sizes = np.log(np.maximum(np.asarray(model.working_set_bytes, dtype=np.float64), 1.0))
    rates = np.log(np.asarray(model.bandwidth_gbs, dtype=np.float64))
    rate = float(np.interp(math.log(max(working_set, 1.0)), sizes, rates))
    return math.exp(rate) * 1e9


# -- per-op features -----------------------------------------------------------------------------
def features(
    cost: Cost, gemm: GemmModel, memory: MemoryModel, strided: bool = False, split: tuple[GemmModel, int] | None = None
) -> np.ndarray:
    """The physical terms of one node's time, in seconds, in ``FEATURES`` order.

    overhead: one microsecond (its coefficient is the fixed cost per call in us); gemm: the GEMM
    model's time for ``cost.gemm`` (``count`` products) plus any MACs outside it at the peak rate, or,
    with ``split`` (the one-thread GEMM model and the run's threads), the time of the products split
    over the run's own threads (``split_gemm_seconds``);
    calls: one microsecond per GEMM call, or per loop (``cost.loops``: a per-plane kernel's planes);
    io: inputs + outputs over the bandwidth of the working set, plus the bytes streamed again at each
    GEMM call (``cost.streamed_bytes``) over the bandwidth of their own size;
    workspace / strided_workspace: the scratch buffer written and read back, in the second slot when it
    is gathered through a strided window (``strided``: a stride > 1, much slower per byte); flops:
    elementwise work at the measured rate, or at the bandwidth of the working set (8 bytes per
    operation, one numpy pass) when that is slower.
    """
    gemm_time = 0.0
    macs_left = float(cost.macs)
    calls = 0
    if cost.gemm is not None and cost.gemm.n * cost.gemm.m * cost.gemm.k > 0:
        dims = cost.gemm
        gemm_time = split_gemm_seconds(split[0], dims, split[1]) if split else stacked_gemm_seconds(gemm, dims)
        macs_left = max(0.0, macs_left - float(dims.n) * dims.m * dims.k * dims.count)
        calls = dims.count
    else:
        calls = cost.loops
    gemm_time += macs_left / (gemm.peak_gflops * 0.5e9)
    io_bytes = float(cost.bytes_read + cost.bytes_written)
    working_set = io_bytes + cost.workspace_bytes
    rate = bandwidth(memory, working_set)
    io_time = io_bytes / rate
    if cost.streamed_bytes:
        io_time += calls * cost.streamed_bytes / bandwidth(memory, cost.streamed_bytes)
    scratch = 2.0 * cost.workspace_bytes / rate
    per_operation = max(1.0 / (memory.elementwise_gflops * 1e9), 8.0 / rate)
    values = (
        MICROSECOND,
        gemm_time,
        calls * MICROSECOND,
        io_time,
        0.0 if strided else scratch,
        scratch if strided else 0.0,
        cost.flops * per_operation,
    )
    assert len(values) == len(FEATURES)
    return np.asarray(values, dtype=np.float64)


# -- the residual curve --------------------------------------------------------------------------
def curve_factor(knots: Sequence[float], values: Sequence[float], base_seconds: float) -> float:
    """The factor a key's residual curve applies to its linear model's ``base_seconds`` (1 without one).

    The curve is piecewise linear in log(base) through (``knots``, ``values``), values being
    log(measured / base), clamped at the end knots: no extrapolation past the calibrated range.
    """
    if not knots or base_seconds <= 0:
        return 1.0
    return math.exp(float(np.interp(math.log(base_seconds), knots, values)))


#: Nearest-sample correction: how far apart (in natural log of each feature's seconds) two layers may
#: be and still share their residual, and the weight of "no correction" against a sample at distance 0.
NEIGHBOUR_BANDWIDTH = 0.35
NEIGHBOUR_PRIOR = 0.25
#: Features under a tenth of a microsecond count as absent: their log would otherwise dominate distances.
NEIGHBOUR_FLOOR_S = 1e-7


def neighbour_point(features: np.ndarray) -> list[float]:
    """Where a layer lies for the nearest-sample correction: log seconds of each feature (floored)."""
    return [round(float(v), 4) for v in np.log(np.maximum(np.asarray(features, dtype=np.float64), NEIGHBOUR_FLOOR_S))]


def neighbour_factor(neighbours: Sequence[Sequence[float]], features: np.ndarray) -> float:
    """The factor the calibration samples nearest to ``features`` apply to a key's model (1 with none).

    ``neighbours``: per sample its ``neighbour_point`` followed by log(measured / model). The model
    (linear terms times the size curve) still misses what one shape family does differently (DenseNet's
    3x3 convolutions with 32 outputs ran 2x slower than the Winograd fit said, although a probe of that
    very shape was in it); a layer close to a sample takes that sample's residual, weighted by a
    Gaussian of their distance and shrunk towards no correction (``NEIGHBOUR_PRIOR``).
    """
    if not neighbours:
        return 1.0
    table = np.asarray(neighbours, dtype=np.float64)
    point = np.asarray(neighbour_point(features))
    distance = np.sqrt(((table[:, :-1] - point) ** 2).sum(axis=1))
    weights = np.exp(-((distance / NEIGHBOUR_BANDWIDTH) ** 2))
    return math.exp(float(weights @ table[:, -1]) / (float(weights.sum()) + NEIGHBOUR_PRIOR))


def fit_curve(base: np.ndarray, seconds: np.ndarray, ridge: float = 0.5) -> tuple[list[float], list[float]]:
    """Knots and values of a residual curve: log(seconds / base) as a piecewise-linear function of log(base).

    A linear model over physical features misses how efficiency changes with size (on this machine its
    small convolutions ran 30-50% slower than it predicted, its large ones 20-60% faster); the curve is
    that trend, fitted by least squares on hat functions at quantiles of log(base) (four knots from 12
    samples on, two from 6, none below), pulled towards 0 by ``ridge`` so a sparse stretch stays flat.
    """
    count = len(base)
    if count < 6:
        return [], []
    x = np.log(np.maximum(base, 1e-12))
    y = np.log(np.maximum(seconds, 1e-12) / np.maximum(base, 1e-12))
    quantiles = (0.05, 0.35, 0.65, 0.95) if count >= 12 else (0.1, 0.9)
    knots = np.unique(np.quantile(x, quantiles))
    if len(knots) < 2:
        return [], []
    hats = np.stack([np.interp(x, knots, np.eye(len(knots))[i]) for i in range(len(knots))], axis=1)
    rows = np.vstack([hats, np.sqrt(ridge) * np.eye(len(knots))])
    targets = np.concatenate([y, np.zeros(len(knots))])
    values = np.linalg.lstsq(rows, targets, rcond=None)[0]
    return [round(float(k), 5) for k in knots], [round(float(v), 5) for v in values]


# -- fitting -------------------------------------------------------------------------------------
def nnls(a: np.ndarray, b: np.ndarray, max_iterations: int = 200) -> np.ndarray:
    """Non-negative least squares ``min ||a x - b||, x >= 0`` (Lawson-Hanson active set)."""
    rows, cols = a.shape
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    gradient = a.T @ (b - a @ x)
    tolerance = 1e-10 * max(1.0, float(np.abs(gradient).max(initial=0.0)))
    for _ in range(max_iterations):
        if passive.all() or gradient[~passive].max(initial=-1.0) <= tolerance:
            break
        candidates = np.where(~passive, gradient, -np.inf)
        passive[int(np.argmax(candidates))] = True
        while True:
            trial = np.zeros(cols)
            trial[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if trial[passive].min(initial=1.0) > 0:
                x = trial
                break
            blocked = passive & (trial <= 0)
            steps = x[blocked] / np.maximum(x[blocked] - trial[blocked], 1e-300)
            alpha = float(steps.min(initial=1.0))
            x = x + alpha * (trial - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        gradient = a.T @ (b - a @ x)
    return x


def fit_relative(
    design: np.ndarray, seconds: np.ndarray, prior: Sequence[float] | None = None, strength: float = 0.02
) -> np.ndarray:
    """Non-negative coefficients minimising the *relative* error of ``design @ coef ~ seconds``.

    Rows are divided by their target, so a 10 us kernel weighs as much as a 100 ms one. With a
    ``prior``, each coefficient is also pulled (weight ``strength``, relative to the prior value)
    towards it: with many samples the data decides, with one or two the fit keeps the prior's physical
    proportions and scales them, instead of collapsing onto one feature that cannot extrapolate.
    Features that are zero in every row get a zero coefficient.
    """
    weights = 1.0 / np.maximum(seconds, 1e-12)
    used = np.abs(design).max(axis=0) > 0
    scale = np.where(used, np.abs(design * weights[:, None]).max(axis=0), 1.0)
    scale[scale == 0] = 1.0
    rows = design * weights[:, None] / scale
    targets = np.ones(len(seconds))
    if prior is not None:
        # coef_j = x_j / scale_j; the row sqrt(strength) * x_j / (prior_j * scale_j) = sqrt(strength)
        # pulls coef_j towards prior_j.
        anchors = np.diag(1.0 / (np.asarray(prior, dtype=np.float64) * scale)) * np.sqrt(strength)
        rows = np.vstack([rows, anchors[used]])
        targets = np.concatenate([targets, np.full(int(used.sum()), np.sqrt(strength))])
    coef = np.zeros(design.shape[1])
    coef[used] = nnls(rows[:, used], targets)
    return coef / scale


def mape(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute relative error."""
    return float(np.mean(np.abs(predicted - measured) / np.maximum(measured, 1e-12)))
