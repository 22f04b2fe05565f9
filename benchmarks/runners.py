"""One runner per runtime, same interface: a compiled model with its feed bound.

Shared by ``compare.py`` (speed, every runtime in one process) and ``peak_rss.py`` (memory, each runtime
in a process of its own). Each runtime is imported only when its runner is made, so a process that
measures one runtime's memory holds no other's libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np

RUNTIMES = ("hetflow", "ort", "openvino", "hetflow-parallel")
LABELS = {"hetflow": "hetflow", "ort": "ORT", "openvino": "OpenVINO", "hetflow-parallel": "hetflow parallel"}


class Runner(Protocol):
    """A compiled model with its feed bound: ``run()`` computes one batch."""

    def run(self) -> None: ...


class HetflowRunner:
    mode = "sequential"

    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import hetflow

        self.session = hetflow.InferenceSession(path, threads=threads, execution_mode=self.mode)
        self.feed = feed

    def run(self) -> None:
        self.session.run(None, self.feed)


class ParallelHetflowRunner(HetflowRunner):
    mode = "parallel"


class OrtRunner:
    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.feed = feed

    def run(self) -> None:
        self.session.run(None, self.feed)


class OpenVinoRunner:
    """OpenVINO on the ONNX file, the batch made static, f32, CPU pinning off (on 2 cores pinning makes
    whole runs take 2x now and then)."""

    def __init__(self, path: Path, feed: dict[str, np.ndarray], threads: int):
        import openvino as ov

        core = ov.Core()
        model = core.read_model(str(path))
        model.reshape({name: list(array.shape) for name, array in feed.items()})
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "ENABLE_CPU_PINNING": False,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": "f32",
        }
        self.request = core.compile_model(model, "CPU", config).create_infer_request()
        self.feed = feed

    def run(self) -> None:
        self.request.infer(self.feed, share_inputs=True)


RUNNER_TYPES: dict[str, Callable[..., Runner]] = {
    "hetflow": HetflowRunner, "ort": OrtRunner, "openvino": OpenVinoRunner, "hetflow-parallel": ParallelHetflowRunner,
}
