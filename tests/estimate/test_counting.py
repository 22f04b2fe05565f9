"""Counting is exact: params, MACs, im2col GEMM dims and bytes per layer against independent counts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from hetflow.devices.cpu.kernels.buffers import aligned
from hetflow.devices.cpu.threads import available_cores
from hetflow.estimate.predict import estimate
from tests.helpers import make_model


def _alexnet_conv1(batch: int | str = "N"):
    """AlexNet's conv1 as Caffe declares it: 227x227x3 input, 96 kernels of 11x11x3, stride 4, then ReLU."""
    rng = np.random.default_rng(0)
    return make_model(
        [helper.make_node("Conv", ["data", "w", "b"], ["conv1"], name="conv1", kernel_shape=[11, 11],
                          strides=[4, 4]),
         helper.make_node("Relu", ["conv1"], ["relu1"], name="relu1")],
        [("data", TensorProto.FLOAT, [batch, 3, 227, 227])],
        [("relu1", TensorProto.FLOAT, None)],
        {"w": rng.standard_normal((96, 3, 11, 11)).astype(np.float32), "b": np.zeros(96, np.float32)},
    )


def test_augur_worked_example_alexnet_conv1(quick_profile):
    # Augur section 2.1: [3025 x 363] x [363 x 96] for AlexNet's first layer on 227x227x3.
    report = estimate(_alexnet_conv1(), quick_profile, batch=1)
    conv = next(layer for layer in report.layers if layer.op == "Conv")
    assert (conv.gemm.n, conv.gemm.m, conv.gemm.k) == (96, 55 * 55, 11 * 11 * 3)
    assert (conv.gemm.n, conv.gemm.m, conv.gemm.k) == (96, 3025, 363)
    assert conv.output_shape == [1, 96, 55, 55]
    assert conv.params == 96 * 3 * 11 * 11 + 96
    assert conv.macs == 3025 * 363 * 96
    assert report.to_dict()["layers"][0]["gemm"] == {"n": 96, "m": 3025, "k": 363}


def test_batch_multiplies_macs_and_gemm_count_not_dims(quick_profile):
    one = estimate(_alexnet_conv1(), quick_profile, batch=1).layers[0]
    many = estimate(_alexnet_conv1(), quick_profile, batch=16).layers[0]
    assert many.macs == 16 * one.macs
    assert (many.gemm.n, many.gemm.m, many.gemm.k) == (one.gemm.n, one.gemm.m, one.gemm.k)
    assert many.gemm.count == 16
    assert many.params == one.params


def _small_net():
    """conv 3->10 3x3 pad 1 on 10x10, grouped conv 10->6 (2 groups) 3x3 stride 2, max pool 2, flatten, FC 54->10.

    Each group of c2 reads 5 channels: too many for a stem, so its parts would run im2col too and
    ``split_conv_groups`` leaves it grouped."""
    rng = np.random.default_rng(1)

    def weights(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="c1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="c2", kernel_shape=[3, 3], strides=[2, 2],
                         pads=[1, 1, 1, 1], group=2),
        helper.make_node("MaxPool", ["c2"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2],
                         pads=[0, 0, 1, 1]),
        helper.make_node("Flatten", ["p"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["y"], name="fc", transB=1),
    ]
    inits = {"w1": weights(10, 3, 3, 3), "b1": weights(10), "w2": weights(6, 5, 3, 3),
             "w3": weights(10, 54), "b3": weights(10)}
    return make_model(nodes, [("x", TensorProto.FLOAT, ["N", 3, 10, 10])], [("y", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("batch", [1, 3])
def test_small_net_counts_match_hand_counts(quick_profile, batch):
    report = estimate(_small_net(), quick_profile, batch=batch)
    layers = {layer.name: layer for layer in report.layers}
    c1, c2, pool, fc = layers["c1"], layers["c2"], layers["pool"], layers["fc"]
    # c1: 10 kernels of 3x3x3 + bias over 10x10 positions.
    assert c1.params == 10 * 27 + 10
    assert c1.macs == batch * 10 * 100 * 27
    assert (c1.gemm.n, c1.gemm.m, c1.gemm.k, c1.gemm.count) == (10, 100, 27, batch)
    # c2: 2 groups of 3 kernels over 5 channels, stride 2 -> 5x5.
    assert c2.output_shape == [batch, 6, 5, 5]
    assert c2.params == 6 * 5 * 9
    assert c2.macs == batch * 6 * 25 * 5 * 9
    assert (c2.gemm.n, c2.gemm.m, c2.gemm.k, c2.gemm.count) == (3, 25, 45, 2 * batch)
    # pool: 5x5 padded to 6x6 -> 3x3; no parameters or MACs.
    assert pool.output_shape == [batch, 6, 3, 3] and pool.params == 0 and pool.macs == 0
    assert fc.params == 54 * 10 + 10
    assert fc.macs == batch * 54 * 10
    assert (fc.gemm.n, fc.gemm.m, fc.gemm.k) == (10, batch, 54)
    # Bytes: every input read once, the output written once (float32).
    assert c1.bytes == 4 * (batch * 300 + 10 * 27 + 10 + batch * 1000)
    totals = report.totals()
    assert totals["params"] == 10 * 27 + 10 + 6 * 45 + 550
    assert totals["macs"] == sum(layer.macs for layer in report.layers)
    assert totals["weights_bytes"] == 4 * totals["params"]


def test_augur_memory_accounting_counts_every_blob_and_im2col_buffer(quick_profile):
    report = estimate(_small_net(), quick_profile, batch=2)
    blobs = [2 * 3 * 100, 2 * 10 * 100, 2 * 6 * 25, 2 * 6 * 9, 2 * 54, 2 * 10]  # input, c1, c2, pool, flat, fc
    assert report.memory.data_bytes == 4 * sum(blobs)
    # Augur's total counts every Conv's im2col buffer [N, C*taps, P], whatever algorithm runs it; each
    # layer's row carries its own kernel's: c1 (3 -> 10 channels, 3x3 pad 1) runs the direct kernel, which
    # reads X and writes Y where they lie (``jit_direct_same``: no scratch), the grouped c2 im2col.
    c1_im2col, c2_im2col = 4 * 2 * 27 * 100, 4 * 2 * 10 * 9 * 25
    assert report.memory.workspace_bytes == c1_im2col + c2_im2col
    assert report.layers[0].algorithm.endswith("direct_fma") and report.layers[1].algorithm.endswith("im2col")
    assert report.layers[0].workspace_bytes == 0
    assert report.layers[1].workspace_bytes == c2_im2col


def test_a_direct_conv_that_shrinks_the_map_counts_its_planes_and_products(quick_profile):
    """A valid 3x3 window (12x12 -> 10x10) runs on ``jit_direct``'s copies: per core 3 planes of 154
    floats (rows 12 long; 120 positions rounded up to 128 computed, the last tap 26 past them) and 8
    kernels' products of 128 positions, each for every core, aligned."""
    rng = np.random.default_rng(2)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="c", kernel_shape=[3, 3])
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "b": np.zeros(8, np.float32)}
    model = make_model([node], [("x", TensorProto.FLOAT, ["N", 3, 12, 12])], [("y", TensorProto.FLOAT, None)], inits)
    [layer] = estimate(model, quick_profile, batch=2).layers
    assert layer.algorithm.endswith("direct_fma")
    cores = available_cores()
    assert layer.workspace_bytes == aligned(cores * 4 * 3 * 154) + aligned(cores * 4 * 8 * 128)


def test_a_split_grouped_conv_counts_each_part(quick_profile):
    """A Conv of 2 groups that the CPU's pass splits (``split_conv_groups``, 3x3 stride 1: each part on
    Winograd or the direct kernel) is reported as the layers that run: a Split and a Concat that count
    nothing, and one Conv per group with half the kernels, together the grouped Conv's counts."""
    rng = np.random.default_rng(3)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="g", kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            group=2)
    inits = {"w": rng.standard_normal((64, 32, 3, 3)).astype(np.float32), "b": np.zeros(64, np.float32)}
    model = make_model([node], [("x", TensorProto.FLOAT, ["N", 64, 13, 13])], [("y", TensorProto.FLOAT, None)], inits)
    layers = estimate(model, quick_profile, batch=2).layers
    assert [layer.op for layer in layers] == ["Split", "Conv", "Conv", "Concat"]
    split, first, second, concat = layers
    assert split.params == split.macs == concat.params == concat.macs == 0
    for part in (first, second):
        assert part.output_shape == [2, 32, 13, 13]
        assert part.params == 32 * 32 * 9 + 32
        assert part.macs == 2 * 32 * 169 * 32 * 9
    assert first.params + second.params == 64 * 32 * 9 + 64
    assert first.macs + second.macs == 2 * 64 * 169 * 32 * 9


def test_a_large_weight_held_packed_counts_as_its_panels_not_twice(quick_profile, monkeypatch, tmp_path):
    """A fully connected layer whose weights pass ``dense.HELD_PACKED_BYTES`` (here lowered to 1 MiB) in
    a model read from a file: the session maps the raw weights from the file and holds their panels, so
    the planned total counts the panels as a kernel cache and the mapped weights not at all, while
    Augur's accounting keeps every weight."""
    import onnx

    from hetflow.devices.cpu.kernels import dense

    monkeypatch.setattr(dense, "HELD_PACKED_BYTES", 1 << 20)
    rng = np.random.default_rng(4)
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)
    inits = {"w": rng.standard_normal((500, 800)).astype(np.float32), "b": np.zeros(500, np.float32)}
    path = tmp_path / "fc.onnx"
    onnx.save(make_model([node], [("x", TensorProto.FLOAT, ["N", 800])], [("y", TensorProto.FLOAT, None)], inits),
              path)  # fmt: skip
    memory = estimate(str(path), quick_profile, batch=1).memory
    weights = (500 * 800 + 500) * 4
    assert memory.weights_bytes == weights and memory.mapped_bytes == 500 * 800 * 4
    assert memory.cache_bytes == 8 * 64 * 800 * 4  # 500 columns in 8 panels of 64
    held = weights - memory.mapped_bytes + memory.cache_bytes
    assert memory.planned_total_bytes == held + memory.input_bytes + memory.peak_bytes
