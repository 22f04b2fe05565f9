"""Fully connected layers at a batch: hetflow's dense kernel vs hetflow on OpenBLAS vs ONNX Runtime.

    python benchmarks/dense_layers.py [--repeat 50] [--threads 2] [--json rows.json]

Each case is a one-node ONNX Gemm (``transB=1``, a bias, a Relu where the zoo network has one) with the
weights of a zoo model's layer, run through three sessions side by side (``hetflow.bench.timing``,
interleaved, each warmed before its timed call): hetflow as it runs (the dense kernel where
``kernels.dense.runs_dense``), hetflow with the node's ``packed_weights`` cleared before its first run
(OpenBLAS, which packs the weights on every call, or for one example a compiled GEMV: what ran before
the dense kernel; given the model in memory, so its raw weights are resident), and ONNX Runtime, which
packs them once per session. The dense session reads the model from a file, so a large layer's session
holds its weights only packed, as a zoo model's does. Outputs are checked equal first; minimums are the stable statistic.
"""

from __future__ import annotations

import argparse
import dataclasses
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
    """``rows`` examples through a ``inputs`` -> ``outputs`` layer of ``network``."""

    network: str
    rows: int
    inputs: int
    outputs: int
    relu: bool

    @property
    def label(self) -> str:
        return f"{self.network} {self.inputs} -> {self.outputs}{' relu' if self.relu else ''} x{self.rows}"


CASES = [
    Case("lenet", 16, 800, 500, True),
    Case("cifar10-quick", 16, 1024, 64, False),
    Case("mentee", 16, 2048, 512, True),
    Case("mentee", 16, 512, 256, True),
    Case("mentee", 4, 2048, 512, True),
    Case("lstm-gesture", 64, 512, 11, False),
    Case("(1000 classes)", 16, 1024, 1000, False),
    Case("(wide)", 64, 512, 2048, True),
    # Large weights, held only packed at every batch (``runtime.held_weights``): OpenBLAS packs them again
    # on every call from two rows up; one example's GEMV reads them where they lie.
    Case("alexnet", 1, 9216, 4096, True),
    Case("alexnet", 2, 9216, 4096, True),
    Case("alexnet", 16, 9216, 4096, True),
    Case("alexnet", 16, 4096, 4096, True),
    Case("alexnet", 1, 4096, 1000, False),
    Case("vgg19", 1, 25088, 4096, True),
    Case("vgg19", 16, 25088, 4096, True),
]


def model(case: Case, rng: np.random.Generator) -> onnx.ModelProto:
    """The case as a one-node ONNX model."""
    weights = (rng.standard_normal((case.outputs, case.inputs)) / np.sqrt(case.inputs)).astype(np.float32)
    bias = rng.standard_normal(case.outputs).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["g" if case.relu else "y"], transB=1)]
    if case.relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"]))
    graph = helper.make_graph(
        nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [case.rows, case.inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weights, "w"), numpy_helper.from_array(bias, "b")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def on_blas(session: hetflow.InferenceSession) -> hetflow.InferenceSession:
    """``session`` with its Gemm nodes' packing cleared: they bind to OpenBLAS on the first run."""
    for node in session.graph.nodes:
        if node.op_type == "Gemm":
            node.attrs = dataclasses.replace(node.attrs, packed_weights=False)
    return session


def measure(case: Case, repeat: int, threads: int, folder: Path) -> dict[str, object]:
    """The three sessions on ``case``: outputs checked equal, then timed side by side."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    path = folder / "case.onnx"
    proto = model(case, rng)
    onnx.save(proto, path)
    feed = {"x": rng.standard_normal((case.rows, case.inputs)).astype(np.float32)}
    dense = hetflow.InferenceSession(path, threads=threads)
    # NOTE: given in memory, the OpenBLAS session keeps its raw weights resident, as before the dense
    # kernel (from the file, a large layer's raw array is a mapping of it, unaligned where raw_data lies).
    blas = on_blas(hetflow.InferenceSession(proto, threads=threads))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    want = peer.run(None, feed)[0]
    for session in (dense, blas):
        np.testing.assert_allclose(session.run(None, feed)[0], want, rtol=1e-4, atol=1e-4)
    calls = {
        "dense": lambda: dense.run(None, feed),
        "blas": lambda: blas.run(None, feed),
        "ort": lambda: peer.run(None, feed),
    }
    timings = side_by_side(calls, repeat)
    row: dict[str, object] = {**asdict(case)}
    for label, timing in timings.items():
        row[f"{label}_min_ms"], row[f"{label}_median_ms"] = timing.min_ms, timing.median_ms
    row["dense_over_blas"] = timings["dense"].min / timings["blas"].min
    row["dense_over_ort"] = timings["dense"].min / timings["ort"].min
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    header = (
        "| layer | dense min / median ms | OpenBLAS min / median ms | ORT min / median ms | dense / OpenBLAS | dense / ORT |",
        "|---|---|---|---|---|---|",
    )

    def line(case: Case, row: dict) -> str:
        times = " | ".join(f"{row[f'{k}_min_ms']:.3f} / {row[f'{k}_median_ms']:.3f}" for k in ("dense", "blas", "ort"))
        return f"| {case.label} | {times} | {row['dense_over_blas']:.2f} | {row['dense_over_ort']:.2f} |"

    table_of_cases(CASES, lambda case, folder: measure(case, args.repeat, args.threads, folder), header, line,
                   args.json)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
