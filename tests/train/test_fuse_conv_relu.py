"""``fuse_conv_relu``: which Relus fold into their Conv, and a fused training graph computes the same
forward values and gradients as the unfused one (float64, through the tape and the CPU's rules)."""

from __future__ import annotations

import numpy as np

from hetflow.train import Tape, Trainer
from hetflow.train.graph import fuse_conv_relu, parameter_names, training_graph
from hetflow.zoo.layers import LayerBuilder
from tests.train.test_trainer import as_float64


def conv_relu_net(seed: int = 0):
    """conv+relu -> conv+relu (its conv output also read by an Add) -> maxpool -> conv+relu -> GAP -> FC:
    the middle Relu must not fold (the Conv's output has a second reader)."""
    b = LayerBuilder("conv_relu_net", seed)
    x = b.input("data", (3, 9, 8))
    x = b.relu(b.conv(x, 5, 3, pad=1))
    shared = b.conv(x, 5, 3, pad=1)
    x = b.add(b.relu(shared), shared)
    x = b.max_pool(x, 2, 2)
    x = b.relu(b.conv(x, 6, 3, 2, pad=1, group=1))
    x = b.fc(b.flatten(b.global_avg_pool(x)), 4, gain=1.0)
    return b.model([b.softmax(x)])


def test_only_relus_that_alone_read_a_conv_fold():
    train = training_graph(as_float64(conv_relu_net()), reads_logits=True)
    before = [n.op_type for n in train.graph.nodes]
    assert fuse_conv_relu(train.graph) == 2
    after = train.graph.nodes
    assert len(after) == len(before) - 2
    assert [n.op_type for n in after].count("Relu") == 1
    fused = [n for n in after if n.op_type == "Conv" and n.attrs.fused is not None]
    assert [n.attrs.fused.op_type for n in fused] == ["Relu", "Relu"]
    # Each fused Conv writes its Relu's output name, so its readers are unchanged.
    readers = {name for node in after for name in node.inputs}
    assert all(node.outputs[0] in readers for node in fused)


def test_fused_graph_has_the_unfused_values_and_gradients():
    graph = as_float64(conv_relu_net())
    plain = training_graph(graph, reads_logits=True)
    fused = training_graph(graph, reads_logits=True)
    fuse_conv_relu(fused.graph)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 3, 9, 8))
    seed = rng.standard_normal((5, 4))
    results = []
    for train in (plain, fused):
        tape = Tape(train.graph, parameter_names(train.graph))
        forward = tape.forward({"data": x})
        scores = forward.values[train.scores].copy()
        results.append((scores, tape.backward(forward, {train.scores: seed})))
    (plain_scores, plain_grads), (fused_scores, fused_grads) = results
    np.testing.assert_allclose(fused_scores, plain_scores, rtol=1e-12, atol=1e-12)
    assert set(fused_grads) == set(plain_grads)
    for name, grad in plain_grads.items():
        np.testing.assert_allclose(fused_grads[name], grad, rtol=1e-10, atol=1e-12, err_msg=name)


def test_the_cpu_trainer_fuses_its_training_graph():
    trainer = Trainer(conv_relu_net())
    assert sum(n.attrs.fused is not None for n in trainer.training.graph.nodes if n.op_type == "Conv") == 2
    assert "Relu" in {n.op_type for n in trainer.training.graph.nodes}  # the unfusable one
