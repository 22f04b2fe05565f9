"""``record_pool_indices``: which MaxPools get an Indices output, and a training graph with them (the
forward records the winners, the CPU's rule scatters by them) computes the same values and gradients
as one without."""

from __future__ import annotations

import numpy as np

from hetflow.graph import Node
from hetflow.ops import registry
from hetflow.ops.base import shape_only
from hetflow.ops.pool import MaxPoolAttrs
from hetflow.train import Tape, Trainer
from hetflow.train.graph import parameter_names, record_pool_indices, training_graph
from hetflow.train.kernels import training_kernel
from hetflow.zoo.layers import LayerBuilder
from tests.train.test_cpu_rules import _rule
from tests.train.test_fuse_conv_relu import conv_relu_net
from tests.train.test_trainer import as_float64


def test_2d_float_max_pools_get_indices():
    train = training_graph(as_float64(conv_relu_net()), reads_logits=True)
    assert record_pool_indices(train.graph) == 1
    (pool,) = [n for n in train.graph.nodes if n.op_type == "MaxPool"]
    indices = train.graph.values[pool.outputs[1]]
    assert indices.dtype == np.int64 and indices.shape == train.graph.values[pool.outputs[0]].shape
    assert record_pool_indices(train.graph) == 0  # already there


def test_graph_with_indices_has_the_same_values_and_gradients():
    graph = as_float64(conv_relu_net())
    plain = training_graph(graph, reads_logits=True)
    recorded = training_graph(graph, reads_logits=True)
    record_pool_indices(recorded.graph)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 9, 8))
    seed = rng.standard_normal((4, 4))
    results = []
    for train in (plain, recorded):
        tape = Tape(train.graph, parameter_names(train.graph))
        forward = tape.forward({"data": x})
        scores = forward.values[train.scores].copy()
        results.append((scores, tape.backward(forward, {train.scores: seed})))
    (plain_scores, plain_grads), (recorded_scores, recorded_grads) = results
    np.testing.assert_array_equal(recorded_scores, plain_scores)
    assert set(recorded_grads) == set(plain_grads)
    for name, grad in plain_grads.items():
        np.testing.assert_array_equal(recorded_grads[name], grad, err_msg=name)


def test_the_cpu_trainer_records_pool_indices():
    b = LayerBuilder("pools", 0)
    x = b.max_pool(b.relu(b.conv(b.input("data", (3, 8, 8)), 4, 3, pad=1)), 2, 2)
    trainer = Trainer(b.model([b.fc(b.flatten(x), 3)]))
    (pool,) = [n for n in trainer.training.graph.nodes if n.op_type == "MaxPool"]
    assert len(pool.outputs) == 2
    rng = np.random.default_rng(0)
    loss, _ = trainer.train_step(rng.standard_normal((2, 3, 8, 8)).astype(np.float32), np.array([0, 2]))
    assert np.isfinite(loss)


def test_max_pool_rule_scatters_by_indices_as_the_numpy_rule():
    """The CPU rule, given the training forward's Indices (and X only as a stand-in: it reads none of
    it), gives the numpy rule's dX."""
    attrs = MaxPoolAttrs(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1))
    node = Node("MaxPool", "pool", ["x"], ["y", "indices"], attrs)
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((2, 3, 7, 8)), rng.standard_normal((2, 3, 4, 4))
    y, indices = training_kernel(node)(node, [x])
    got = _rule(node)(node, [shape_only(x.shape, x.dtype)], [y, indices], [dy], [True])
    reference = registry.get("MaxPool").backward(node, [x], [y, indices], [dy], [True])
    # Overlapping windows: the same sums, added in output order rather than tap order.
    np.testing.assert_allclose(got[0], reference[0], rtol=1e-14, atol=1e-14)
