"""Zoo demos: models with *trained* weights, built by training on real data the first time they are
asked for (then cached like every zoo model).

``lenet-digits``: the zoo's LeNet trained from its seeded random initialisation on scikit-learn's
handwritten digits (``hetflow.train.data``), about 98% test accuracy. Needs scikit-learn
(``pip install 'hetflow[train]'``).
"""

from __future__ import annotations

import numpy as np
import onnx

#: Test-split digits ``sample_digits`` draws from (the demo never trained on them).
SAMPLE_SEED = 0


def lenet_digits(seed: int) -> onnx.ModelProto:
    """Train ``zoo:lenet`` (weights of ``seed``) on the digits and return the trained model."""
    from hetflow.frontends.onnx_export import export_model
    from hetflow.train.recipes import train_classifier
    from hetflow.zoo import nets

    result = train_classifier(nets.lenet(seed), data="digits", seed=seed)
    graph = result.trainer.inference_graph()
    doc = (
        f"Caffe LeNet trained by hetflow on scikit-learn's digits (8x8 -> 1x28x28), "
        f"test accuracy {result.test_accuracy:.4f}"
    )
    model = export_model(graph, doc=doc)
    del model.metadata_props[:]
    return model


def sample_digits(count: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """``count`` real test digits ``[count, 1, 28, 28]`` and their labels (for ``--input`` or demos)."""
    from hetflow.train.data import load_digits

    data = load_digits(seed=SAMPLE_SEED)
    return data.x_test[:count], data.y_test[:count]


#: Zoo demos with real examples to show: model name -> sampler of ``count`` inputs and their labels.
DEMO_SAMPLES = {"zoo:lenet-digits": sample_digits}


def demo_inputs(model: str, count: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Real held-out examples and their labels for a demo model (``hetflow run`` without ``--input``),
    or None when ``model`` is not a demo with real data."""
    sampler = DEMO_SAMPLES.get(model)
    return None if sampler is None else sampler(count)
