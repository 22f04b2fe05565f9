"""Every CPU Conv algorithm against ONNX Runtime and the im2col kernel; what each one supports."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper

from hetflow.devices.cpu import CPUDevice
from hetflow.devices.cpu.kernels.winograd import TRANSFORMED_WEIGHTS, transforms
from hetflow.graph import Node
from hetflow.ops.activation import FusedActivation
from hetflow.ops.base import TensorInfo
from hetflow.ops.conv import (
    AUTO,
    DEPTHWISE,
    DIRECT_FMA,
    IM2COL,
    POINTWISE,
    WINOGRAD_F23,
    WINOGRAD_F43,
    ConvAttrs,
)
from tests.helpers import make_model, run_onnxruntime

KERNELS = {k.algorithm: k for k in CPUDevice().kernels.kernels["Conv"]}
WINOGRADS = (WINOGRAD_F23, WINOGRAD_F43)


def _infos(*arrays: np.ndarray | None) -> list[TensorInfo | None]:
    return [None if a is None else TensorInfo(a.shape, a.dtype) for a in arrays]


def _run(algorithm: str, attrs: ConvAttrs, x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None):
    node = Node("Conv", "conv", ["x", "w", "b" if b is not None else ""], ["y"], attrs)
    kernel = KERNELS[algorithm]
    assert kernel.reason_unsupported(node, _infos(x, w, b)) is None
    (y,) = kernel.fn(node, [x, w, b])
    return y


def _onnxruntime(attrs: ConvAttrs, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    onnx_attrs = {"group": attrs.group}
    if attrs.pads:
        onnx_attrs["pads"] = list(attrs.pads)
    if attrs.auto_pad != "NOTSET":
        onnx_attrs["auto_pad"] = attrs.auto_pad
    if attrs.strides:
        onnx_attrs["strides"] = list(attrs.strides)
    elem = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.DOUBLE
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    model = make_model(
        [helper.make_node("Conv", inputs, ["y"], **onnx_attrs)],
        [("x", elem, list(x.shape))],
        [("y", elem, None)],
        {"w": w, **({"b": b} if b is not None else {})},
    )
    model.ir_version = 8  # what the installed onnxruntime reads
    return run_onnxruntime(model, {"x": x})[0]


def _data(shape_x, shape_w, dtype=np.float32, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape_x).astype(dtype)
    w = rng.standard_normal(shape_w).astype(dtype)
    b = rng.standard_normal(shape_w[0]).astype(dtype) if bias else None
    return x, w, b


def _close(actual: np.ndarray, expected: np.ndarray, rtol_of_max: float) -> None:
    assert actual.shape == expected.shape and (actual.dtype == expected.dtype or expected.dtype == np.float64)
    scale = float(np.abs(expected).max())
    error = float(np.abs(actual.astype(np.float64) - expected).max())
    assert error <= rtol_of_max * scale, f"max error {error:.3g} vs max |y| {scale:.3g}"


# -- the Winograd matrices ---------------------------------------------------------------------------
@pytest.mark.parametrize("m", [2, 4])
def test_winograd_transforms_compute_a_1d_correlation(m):
    t = transforms(m)
    rng = np.random.default_rng(m)
    d, g = rng.standard_normal(m + 2), rng.standard_normal(3)
    expected = np.array([d[i : i + 3] @ g for i in range(m)])
    np.testing.assert_allclose(t.at @ ((t.g @ g) * (t.bt @ d)), expected, rtol=1e-12, atol=1e-12)
    # Lavin's integer input transform comes out of the construction.
    assert np.array_equal(t.bt, np.round(t.bt))


def test_f43_matrices_are_lavins():
    t = transforms(4)
    np.testing.assert_array_equal(t.bt[0], [4, 0, -5, 0, 1, 0])
    np.testing.assert_allclose(np.abs(t.g[1]) * 6, [1, 1, 1])
    assert Fraction(float(t.g[0][0])).limit_denominator() == Fraction(1, 4)


# -- every algorithm vs ONNX Runtime ----------------------------------------------------------------
SHAPES_3X3 = [
    # (x shape, K, pads)
    ((1, 3, 7, 9), 5, (1, 1, 1, 1)),
    ((3, 17, 13, 13), 5, (0, 0, 0, 0)),
    ((2, 5, 13, 13), 17, (2, 1, 0, 2)),
    ((1, 4, 3, 3), 3, (0, 0, 0, 0)),  # a 1x1 output
    ((1, 4, 1, 1), 3, (1, 1, 1, 1)),  # a 1x1 input
    ((2, 8, 6, 10), 8, (1, 2, 1, 0)),
]


@pytest.mark.parametrize("algorithm", [IM2COL, *WINOGRADS, DIRECT_FMA, AUTO])
@pytest.mark.parametrize(("x_shape", "kernels", "pads"), SHAPES_3X3)
def test_3x3_algorithms_match_onnxruntime(algorithm, x_shape, kernels, pads):
    x, w, b = _data(x_shape, (kernels, x_shape[1], 3, 3))
    attrs = ConvAttrs(pads=pads)
    expected = _onnxruntime(attrs, x, w, b)
    _close(_run(algorithm, attrs, x, w, b), expected, 1e-5)


@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_winograd_with_same_padding_and_float64(algorithm):
    x, w, b = _data((2, 3, 11, 8), (5, 3, 3, 3))
    attrs = ConvAttrs(auto_pad="SAME_LOWER")
    _close(_run(algorithm, attrs, x, w, b), _onnxruntime(attrs, x, w, b), 1e-5)
    # ONNX Runtime has no float64 Conv: the im2col kernel (checked against it above) is the reference.
    x, w, b = (a.astype(np.float64) for a in (x, w, b))
    _close(_run(algorithm, attrs, x, w, b), _run(IM2COL, attrs, x, w, b), 1e-12)


# NOTE: F(4,3)'s transforms have entries up to 8 (points +-2), so its float32 error grows with C faster than
# F(2,3)'s; on C = 256 it measures ~1.2e-5 of max|y| with OpenBLAS 0.3.31 — still 3x inside the 1e-4 that
# the zoo equivalence tests demand. The bound here catches a broken transform (errors ~1e-1) or a float32
# weight transform (~1e-4), not ulp-level differences between BLAS builds.
WINOGRAD_FLOAT32_BOUND = {WINOGRAD_F23: 1e-5, WINOGRAD_F43: 3e-5}


@pytest.mark.parametrize("algorithm", WINOGRADS)
def test_winograd_float32_error_on_a_deep_layer_is_far_below_the_zoo_tolerance(algorithm):
    x, w, _ = _data((1, 256, 14, 14), (256, 256, 3, 3), bias=False)
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    reference = _run(IM2COL, attrs, x.astype(np.float64), w.astype(np.float64))
    _close(_run(algorithm, attrs, x, w).astype(np.float64), reference, WINOGRAD_FLOAT32_BOUND[algorithm])


@pytest.mark.parametrize(("x_shape", "kernels", "group"), [((3, 6, 7, 9), 9, 1), ((2, 6, 5, 5), 4, 2)])
@pytest.mark.parametrize("algorithm", [POINTWISE, IM2COL, AUTO])
def test_pointwise_matches_onnxruntime(algorithm, x_shape, kernels, group):
    x, w, b = _data(x_shape, (kernels, x_shape[1] // group, 1, 1))
    attrs = ConvAttrs(group=group)
    _close(_run(algorithm, attrs, x, w, b), _onnxruntime(attrs, x, w, b), 1e-5)


@pytest.mark.parametrize("strides", [(1, 1), (2, 2)])
@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("algorithm", [DEPTHWISE, IM2COL, AUTO])
def test_depthwise_matches_onnxruntime(algorithm, multiplier, strides):
    x, w, b = _data((3, 5, 9, 7), (5 * multiplier, 1, 3, 3))
    attrs = ConvAttrs(group=5, pads=(1, 0, 2, 1), strides=strides)
    _close(_run(algorithm, attrs, x, w, b), _onnxruntime(attrs, x, w, b), 1e-5)


@pytest.mark.parametrize("algorithm", [POINTWISE, DEPTHWISE, IM2COL, *WINOGRADS, DIRECT_FMA])
def test_fused_activation_is_applied(algorithm):
    if algorithm == POINTWISE:
        x, w, b = _data((2, 3, 5, 7), (4, 3, 1, 1))
        attrs, plain = ConvAttrs(fused=FusedActivation("Relu")), ConvAttrs()
    elif algorithm == DEPTHWISE:
        x, w, b = _data((2, 3, 5, 7), (3, 1, 3, 3))
        attrs, plain = ConvAttrs(group=3, fused=FusedActivation("Relu")), ConvAttrs(group=3)
    else:
        x, w, b = _data((2, 3, 5, 7), (4, 3, 3, 3))
        attrs, plain = ConvAttrs(pads=(1, 1, 1, 1), fused=FusedActivation("Relu")), ConvAttrs(pads=(1, 1, 1, 1))
    expected = np.maximum(_onnxruntime(plain, x, w, b), 0)
    _close(_run(algorithm, attrs, x, w, b), expected, 1e-5)


def test_winograd_weights_are_transformed_once_per_array():
    x, w, b = _data((1, 4, 6, 6), (4, 4, 3, 3))
    TRANSFORMED_WEIGHTS.clear()
    _run(WINOGRAD_F43, ConvAttrs(), x, w, b)
    first = TRANSFORMED_WEIGHTS.get(w, 4)
    _run(WINOGRAD_F43, ConvAttrs(), x, w, b)
    assert TRANSFORMED_WEIGHTS.get(w, 4) is first
    assert TRANSFORMED_WEIGHTS.nbytes() == 36 * 4 * 4 * 4
    del w, first
    import gc

    gc.collect()
    assert TRANSFORMED_WEIGHTS.nbytes() == 0, "entries must die with their weight array"


# -- supports ---------------------------------------------------------------------------------------
def _reason(algorithm: str, attrs: ConvAttrs, x_shape, w_shape) -> str | None:
    node = Node("Conv", "conv", ["x", "w"], ["y"], attrs)
    infos = [TensorInfo(x_shape, np.dtype(np.float32)), TensorInfo(w_shape, np.dtype(np.float32))]
    return KERNELS[algorithm].reason_unsupported(node, infos)


@pytest.mark.parametrize("algorithm", WINOGRADS)
@pytest.mark.parametrize(
    ("attrs", "x_shape", "w_shape", "expected"),
    [
        (ConvAttrs(strides=(2, 2)), (1, 4, 9, 9), (4, 4, 3, 3), "stride"),
        (ConvAttrs(dilations=(2, 2)), (1, 4, 9, 9), (4, 4, 3, 3), "dilation"),
        (ConvAttrs(group=2), (1, 4, 9, 9), (4, 2, 3, 3), "group"),
        (ConvAttrs(), (1, 4, 9, 9), (4, 4, 5, 5), "3x3"),
        (ConvAttrs(), (1, 4, 9, 9, 9), (4, 4, 3, 3, 3), "2-D"),
        (ConvAttrs(), (1, 4, 9), (4, 4, 3), "2-D"),
    ],
)
def test_winograd_rejects(algorithm, attrs, x_shape, w_shape, expected):
    reason = _reason(algorithm, attrs, x_shape, w_shape)
    assert reason is not None and expected in reason


def test_pointwise_and_depthwise_reject_what_they_cannot_do():
    assert "1x1" in _reason(POINTWISE, ConvAttrs(), (1, 4, 9, 9), (4, 4, 3, 3))
    assert "1x1" in _reason(POINTWISE, ConvAttrs(pads=(1, 1, 1, 1)), (1, 4, 9, 9), (4, 4, 1, 1))
    assert "1x1" in _reason(POINTWISE, ConvAttrs(strides=(2, 2)), (1, 4, 9, 9), (4, 4, 1, 1))
    assert "group" in _reason(DEPTHWISE, ConvAttrs(), (1, 4, 9, 9), (4, 4, 3, 3))
    assert "group" in _reason(DEPTHWISE, ConvAttrs(group=2), (1, 4, 9, 9), (4, 2, 3, 3))
    assert _reason(DEPTHWISE, ConvAttrs(group=4), (1, 4, 9, 9), (8, 1, 3, 3)) is None
    assert _reason(IM2COL, ConvAttrs(group=2, strides=(3, 2)), (1, 4, 9, 9), (4, 2, 2, 3)) is None


def test_without_shapes_only_attribute_checks_are_possible():
    node = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs(kernel_shape=(3, 3)))
    assert KERNELS[WINOGRAD_F43].reason_unsupported(node, None) is None
    assert "channel" in KERNELS[DEPTHWISE].reason_unsupported(node, None)
    bare = Node("Conv", "conv", ["x", "w"], ["y"], ConvAttrs())
    assert "kernel size" in KERNELS[WINOGRAD_F23].reason_unsupported(bare, None)
    # A lookup without shapes finds the dispatcher, which runs anything.
    assert CPUDevice().kernels.lookup(bare).algorithm == AUTO


def _direct_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: ConvAttrs) -> np.ndarray:
    """Float64 convolution as a plain sum over kernel taps (explicit pads, strides, dilations, groups)."""
    rank = x.ndim - 2
    pads = attrs.pads or (0,) * (2 * rank)
    strides = attrs.strides or (1,) * rank
    dilations = attrs.dilations or (1,) * rank
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), *zip(pads[:rank], pads[rank:])])
    span = [d * (k - 1) + 1 for d, k in zip(dilations, w.shape[2:])]
    out = [(xp.shape[2 + a] - span[a]) // strides[a] + 1 for a in range(rank)]
    group, per_group = attrs.group, w.shape[0] // attrs.group
    y = np.zeros((x.shape[0], w.shape[0], *out))
    for tap in np.ndindex(*w.shape[2:]):
        window = tuple(slice(t * d, t * d + (o - 1) * s + 1, s) for t, d, o, s in zip(tap, dilations, out, strides))
        patch = xp[(slice(None), slice(None), *window)]  # [N, C, *out]
        for g in range(group):
            channels = patch[:, g * w.shape[1] : (g + 1) * w.shape[1]]
            taps = w[g * per_group : (g + 1) * per_group][(slice(None), slice(None), *tap)]
            y[:, g * per_group : (g + 1) * per_group] += np.einsum("kc,nc...->nk...", taps, channels)
    return y + b.reshape(1, -1, *(1,) * rank)


IM2COL_CASES = [
    ((3, 5, 9, 8), (7, 5, 3, 3), ConvAttrs(pads=(1, 2, 0, 1))),
    ((4, 3, 11, 10), (6, 3, 5, 5), ConvAttrs(pads=(2, 1, 2, 1), strides=(2, 3))),
    ((2, 4, 12, 12), (5, 4, 3, 3), ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2))),
    ((3, 4, 17), (6, 4, 4), ConvAttrs(pads=(1, 2))),  # 1-D
    ((2, 3, 5, 6, 4), (4, 3, 3, 2, 3), ConvAttrs(pads=(1, 0, 1, 1, 1, 1))),  # 3-D
    ((2, 6, 7, 7), (4, 3, 3, 3), ConvAttrs(pads=(1, 1, 1, 1), group=2)),  # grouped: always per image
]


@pytest.mark.parametrize("whole_chunk", [True, False], ids=["one-gemm-per-chunk", "one-gemm-per-image"])
@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), IM2COL_CASES)
def test_im2col_batch_paths_match_a_direct_sum(monkeypatch, whole_chunk, x_shape, w_shape, attrs):
    """Both ways im2col multiplies a chunk of images (one GEMM for the chunk, one per image) agree with
    an independent float64 direct convolution."""
    from hetflow.devices.cpu.kernels import conv as cpu_conv

    monkeypatch.setattr(cpu_conv, "WHOLE_CHUNK_MAX_POSITIONS", 1 << 30 if whole_chunk else 0)
    assert cpu_conv._whole_chunk(x_shape[0], attrs.group, 1) is (whole_chunk and attrs.group == 1)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    _close(_run(IM2COL, attrs, x, w, b), _direct_conv(x, w, b, attrs), 1e-5)


# -- the direct kernel ------------------------------------------------------------------------------
DIRECT_CASES = [  # windows Winograd does not cover, both variants (flat positions, kernels as lanes)
    ((2, 5, 13, 11), (7, 5, 5, 5), ConvAttrs(pads=(2, 1, 2, 1))),
    ((3, 4, 12, 12), (20, 4, 3, 3), ConvAttrs(pads=(2, 2, 2, 2), dilations=(2, 2))),
    ((1, 16, 28, 28), (32, 16, 5, 5), ConvAttrs(pads=(2, 2, 2, 2))),  # GoogLeNet's 5x5 reduce, one image
    ((4, 64, 6, 6), (40, 64, 3, 3), ConvAttrs(pads=(1, 1, 1, 1))),  # a small map: kernels as lanes
    ((2, 3, 9, 10), (4, 3, 2, 4), ConvAttrs(pads=(0, 3, 1, 0))),  # even, asymmetric window
    ((1, 2, 4, 4), (3, 2, 1, 1), ConvAttrs()),  # a 1x1 window
]


@pytest.mark.parametrize(("x_shape", "w_shape", "attrs"), DIRECT_CASES)
def test_direct_matches_a_direct_sum_within_its_workspace(x_shape, w_shape, attrs):
    from hetflow.devices.cpu.kernels import buffers

    rng = np.random.default_rng(11)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32)
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    kernel = KERNELS[DIRECT_FMA]
    assert kernel.reason_unsupported(node, _infos(x, w, b)) is None
    workspace = np.full(kernel.workspace(node, _infos(x, w, b)), 0xFF, np.uint8)  # dirty
    overflows = buffers.OVERFLOWS[0]
    (y,) = kernel.fn(node, [x, w, b], None, workspace)
    assert buffers.OVERFLOWS[0] == overflows  # fits the workspace it declared
    _close(y, _direct_conv(x, w, b, attrs), 1e-5)


def test_direct_float16_is_computed_in_float32():
    x, w, b = _data((2, 6, 9, 9), (5, 6, 3, 3))
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    y = _run(DIRECT_FMA, attrs, x.astype(np.float16), w.astype(np.float16), b.astype(np.float16))
    assert y.dtype == np.float16
    expected = _direct_conv(*(a.astype(np.float16).astype(np.float32) for a in (x, w, b)), attrs)
    _close(y, expected, 2e-3)


def test_direct_writes_into_a_concat_slice():
    x, w, b = _data((3, 4, 8, 8), (6, 4, 3, 3))
    attrs = ConvAttrs(pads=(1, 1, 1, 1))
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    concat = np.full((3, 10, 8, 8), np.nan, np.float32)
    (y,) = KERNELS[DIRECT_FMA].fn(node, [x, w, b], [concat[:, 2:8]])
    _close(concat[:, 2:8], _direct_conv(x, w, b, attrs), 1e-5)
    assert np.isnan(concat[:, :2]).all() and np.isnan(concat[:, 8:]).all()


@pytest.mark.parametrize(
    ("attrs", "x_shape", "w_shape", "dtype", "expected"),
    [
        (ConvAttrs(group=2), (1, 4, 9, 9), (4, 2, 3, 3), np.float32, "group"),
        (ConvAttrs(), (1, 4, 9, 9, 9), (4, 4, 3, 3, 3), np.float32, "2-D"),
        (ConvAttrs(), (1, 4, 9, 9), (4, 4, 3, 3), np.float64, "float32"),
    ],
)
def test_direct_rejects(attrs, x_shape, w_shape, dtype, expected):
    node = Node("Conv", "conv", ["x", "w"], ["y"], attrs)
    infos = [TensorInfo(x_shape, np.dtype(dtype)), TensorInfo(w_shape, np.dtype(dtype))]
    reason = KERNELS[DIRECT_FMA].reason_unsupported(node, infos)
    assert reason is not None and expected in reason


def test_direct_takes_a_deeper_strided_window():
    """Strided windows on any channel count run on the input's phase planes (the tuner measures them)."""
    x, w, b = _data((2, 37, 11, 11), (10, 37, 3, 3))
    attrs = ConvAttrs(strides=(2, 2), pads=(1, 1, 1, 1))
    node = Node("Conv", "conv", ["x", "w", "b"], ["y"], attrs)
    infos = [TensorInfo(x.shape, x.dtype), TensorInfo(w.shape, w.dtype), TensorInfo(b.shape, b.dtype)]
    assert KERNELS[DIRECT_FMA].reason_unsupported(node, infos) is None
    (y,) = KERNELS[DIRECT_FMA].fn(node, [x, w, b])
    _close(y, _direct_conv(x, w, b, attrs), 1e-5)


def test_direct_weights_are_blocked_once_per_array():
    from hetflow.devices.cpu.kernels.direct import BLOCKED_WEIGHTS
    from hetflow.devices.cpu.kernels.jit_direct import KERNEL_BLOCK

    x, w, b = _data((2, 3, 16, 16), (10, 3, 3, 3))
    BLOCKED_WEIGHTS.clear()
    _run(DIRECT_FMA, ConvAttrs(), x, w, b)
    first = BLOCKED_WEIGHTS.get(w, KERNEL_BLOCK)
    _run(DIRECT_FMA, ConvAttrs(), x, w, b)
    assert BLOCKED_WEIGHTS.get(w, KERNEL_BLOCK) is first
    assert BLOCKED_WEIGHTS.nbytes() == 16 * 3 * 9 * 4  # 10 kernels padded to two blocks of 8


def test_weight_cache_drops_a_collected_arrays_entries():
    from hetflow.devices.cpu.kernels.weight_cache import WeightCache

    calls = []
    cache = WeightCache(lambda w, p: calls.append(p) or w * p)
    w = np.ones(4, np.float32)
    assert cache.get(w, 2)[0] == 2 and cache.get(w, 2)[0] == 2
    assert calls == [2]  # the second call found the entry
    del w  # its finalizer records the id; the next call drops the entry
    other = np.full(4, 3, np.float32)
    assert cache.get(other, 2)[0] == 6
    assert cache.nbytes() == other.nbytes  # only the live array's entry is left


def test_weight_cache_finalizer_takes_no_lock():
    """The garbage collector may run an array's finalizer inside the cache's own locked section (on the
    same thread): the finalizer must not wait for the lock."""
    import threading

    from hetflow.devices.cpu.kernels.weight_cache import WeightCache

    cache = WeightCache(lambda w, p: w * p)
    w = np.ones(4, np.float32)
    cache.get(w, 2)

    def collect_inside_the_lock():
        nonlocal w
        with cache._lock:
            del w  # the finalizer runs here, the lock held

    worker = threading.Thread(target=collect_inside_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the finalizer deadlocked on the cache's lock"
    live = np.ones(4, np.float32)
    assert cache.get(live, 2)[0] == 2
    assert cache.nbytes() == live.nbytes  # the collected array's entry dropped, the live one's kept
