"""Whole zoo models on the OpenCL device alone: every node placed on opencl:0, outputs within 1e-4
relative (``max|a - b| <= 1e-4 * max|b|``) of the CPU device's on the same random input."""

from __future__ import annotations

import numpy as np
import pytest

import hetflow

#: (model, batch): the smaller models at batch 2, the ImageNet ones at batch 1 to keep the suite fast.
MODELS = [
    ("lenet", 2),
    ("cifar10-quick", 2),
    ("lstm-gesture", 2),
    ("squeezenet", 1),
    ("mobilenetv2", 1),
    ("googlenet", 1),
    ("alexnet", 1),
    ("resnet50", 1),
]


@pytest.mark.parametrize("model, batch", MODELS)
def test_zoo_model_runs_on_opencl_alone(opencl, zoo_home, model, batch):
    cpu = hetflow.InferenceSession(f"zoo:{model}", device="cpu")
    session = hetflow.InferenceSession(f"zoo:{model}", device="opencl:0")
    assert set(session.placement().values()) == {"opencl:0"}
    feed = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in feed.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    bound = session.plan_for({d: batch for d in feed.shape if isinstance(d, str)})
    assert {step.device.id for step in bound.steps} == {"opencl:0"}
    got = session.run(None, {feed.name: x})
    expected = cpu.run(None, {feed.name: x})
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        assert float(np.abs(a - b).max()) <= 1e-4 * float(np.abs(b).max())
