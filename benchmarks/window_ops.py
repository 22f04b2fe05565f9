"""hetflow vs ONNX Runtime on single window ops: the zoo's pools and depthwise convolutions, batch 1.

    python benchmarks/window_ops.py [--repeat 30] [--threads 2] [--json rows.json]

Each case is a one-node ONNX model (a depthwise Conv is followed by its Relu, which both runtimes fuse)
run through both runtimes' sessions, so both pay their per-run overhead (~10-20 us) as they would inside
a network. The shapes are the ones the zoo models run at batch 1 (GoogLeNet, Inception-v2, ResNet-50,
SqueezeNet, ShuffleNet, MobileNet-v2). Timing: ``hetflow.bench.timing.side_by_side`` (interleaved,
each runtime warmed before its timed call); minimums are the stable statistic.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import hetflow
from hetflow.bench.timing import side_by_side

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners import table_of_cases  # noqa: E402


@dataclass(frozen=True)
class Case:
    """One window op: ``op`` on a ``[1, channels, size, size]`` input."""

    op: str  # MaxPool, AveragePool or Depthwise
    channels: int
    size: int
    kernel: int
    stride: int
    pads: tuple[int, int, int, int]

    @property
    def label(self) -> str:
        return f"{self.op} {self.channels}x{self.size}x{self.size} {self.kernel}x{self.kernel}/{self.stride}"


CASES = [
    Case("MaxPool", 64, 112, 3, 2, (0, 0, 1, 1)),  # ResNet-50, Inception-v2, GoogLeNet's first pool
    Case("MaxPool", 64, 111, 3, 2, (0, 0, 0, 0)),  # SqueezeNet's first pool
    Case("MaxPool", 192, 56, 3, 2, (0, 0, 1, 1)),  # GoogLeNet
    Case("MaxPool", 480, 28, 3, 1, (1, 1, 1, 1)),  # GoogLeNet's inception pools
    Case("MaxPool", 1024, 7, 3, 1, (1, 1, 1, 1)),  # Inception-v2
    Case("AveragePool", 256, 28, 3, 1, (1, 1, 1, 1)),  # Inception-v2
    Case("AveragePool", 576, 14, 3, 1, (1, 1, 1, 1)),  # Inception-v2
    Case("Depthwise", 32, 112, 3, 1, (1, 1, 1, 1)),  # MobileNet-v2
    Case("Depthwise", 96, 112, 3, 2, (1, 1, 1, 1)),  # MobileNet-v2
    Case("Depthwise", 144, 56, 3, 1, (1, 1, 1, 1)),  # MobileNet-v2
    Case("Depthwise", 272, 14, 3, 1, (1, 1, 1, 1)),  # ShuffleNet
    Case("Depthwise", 544, 7, 3, 1, (1, 1, 1, 1)),  # ShuffleNet
    Case("Depthwise", 960, 7, 3, 1, (1, 1, 1, 1)),  # MobileNet-v2
]


def model(case: Case, rng: np.random.Generator) -> onnx.ModelProto:
    """The case as a one-node ONNX model (a depthwise Conv with bias, then Relu)."""
    window = {"kernel_shape": [case.kernel] * 2, "strides": [case.stride] * 2, "pads": list(case.pads)}
    initializers = []
    if case.op == "Depthwise":
        weights = rng.standard_normal((case.channels, 1, case.kernel, case.kernel)).astype(np.float32)
        bias = rng.standard_normal(case.channels).astype(np.float32)
        initializers = [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")]
        nodes = [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], group=case.channels, **window),
            helper.make_node("Relu", ["c"], ["y"]),
        ]
    else:
        nodes = [helper.make_node(case.op, ["x"], ["y"], **window)]
    shape = [1, case.channels, case.size, case.size]
    graph = helper.make_graph(
        nodes, "window_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def measure(case: Case, repeat: int, threads: int, folder: Path) -> dict[str, object]:
    """Both runtimes on ``case``: their outputs checked equal, then timed side by side."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    path = folder / "case.onnx"
    onnx.save(model(case, rng), path)
    feed = {"x": rng.standard_normal((1, case.channels, case.size, case.size)).astype(np.float32)}
    ours = hetflow.InferenceSession(path, threads=threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(ours.run(None, feed)[0], peer.run(None, feed)[0], rtol=1e-4, atol=1e-4)
    timings = side_by_side({"hetflow": lambda: ours.run(None, feed), "ort": lambda: peer.run(None, feed)}, repeat)
    hetflow_ms, ort_ms = timings["hetflow"], timings["ort"]
    return {
        **asdict(case),
        "hetflow_min_ms": hetflow_ms.min_ms, "hetflow_median_ms": hetflow_ms.median_ms,
        "ort_min_ms": ort_ms.min_ms, "ort_median_ms": ort_ms.median_ms,
        "ratio": hetflow_ms.min_ms / ort_ms.min_ms,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    header = (
        "| op | hetflow min ms | hetflow median ms | ORT min ms | ORT median ms | hetflow / ORT (min) |",
        "|---|---|---|---|---|---|",
    )

    def line(case: Case, row: dict) -> str:
        return (
            f"| {case.label} | {row['hetflow_min_ms']:.3f} | {row['hetflow_median_ms']:.3f} | "
            f"{row['ort_min_ms']:.3f} | {row['ort_median_ms']:.3f} | {row['ratio']:.2f} |"
        )

    table_of_cases(CASES, lambda case, folder: measure(case, args.repeat, args.threads, folder), header, line,
                   args.json)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
