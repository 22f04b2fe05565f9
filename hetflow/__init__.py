"""hetflow: run and train neural networks on whatever compute a machine has, and predict their cost.

Public API::

    import hetflow
    sess = hetflow.InferenceSession("zoo:googlenet")
    graph = hetflow.load_model("model.onnx")
    report = hetflow.estimate("zoo:alexnet", device="cpu", batch=16)   # per-layer time and memory
"""

from hetflow.estimate.predict import estimate
from hetflow.frontends import load_model
from hetflow.runtime.session import InferenceSession, NodeArg

__version__ = "0.1.0"

__all__ = ["InferenceSession", "NodeArg", "__version__", "estimate", "load_model"]
