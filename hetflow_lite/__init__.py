"""hetflow_lite: run a compiled package (``hetflow compile``) with numpy and the package's own library.

A compiled package is a model's captured run saved as machine code and memory images: its kernels as
one shared library, the weights and the arena as the run left them, and where every address in the
kernels' argument blocks points. Loading one imports no compiler (numba, llvmlite) and no ONNX, so a
process that only runs the model holds what the model needs and little more::

    from hetflow_lite import CompiledSession
    session = CompiledSession("squeezenet-b1.hetflow")
    (probabilities,) = session.run(None, {"data_0": image})
"""

from hetflow_lite.session import CompiledSession, PackageError

__all__ = ["CompiledSession", "PackageError"]
