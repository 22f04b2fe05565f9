"""One example through an LSTM (batch 1): hetflow's spinning GEMV steps vs its compiled sequence on
OpenBLAS's GEMV vs ONNX Runtime, side by side in one process.

    python benchmarks/lstm_one_column.py [--hidden 128,256,320,512] [--steps 100] [--repeat 30] [--threads 2]

Each case is a one-node ONNX LSTM (6 input features, seeded weights, Y_h only, as a classifier reads it).
"spin" is hetflow as it runs: one column's steps on the spinning pool, on W and R packed in panels
(``jit_gate_panels``), where R is large enough (``jit_lstm.column_spins``), else the compiled sequence;
"sequence" is the same session made with ``jit_lstm.VECTOR_MIN_BYTES`` out of reach, so its steps always
run the compiled sequence (OpenBLAS's GEMV at the session's threads). Outputs are checked against ONNX Runtime first; minimums are
the stable statistic (``hetflow.bench.timing.side_by_side``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from runners import table_of_cases

import hetflow
from hetflow.bench.timing import side_by_side
from hetflow.devices.cpu.kernels import jit_lstm

FEATURES = 6


def lstm_model(steps: int, hidden: int, seed: int = 0) -> onnx.ModelProto:
    """A one-layer LSTM over ``[steps, 1, FEATURES]`` returning its last hidden state."""
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(hidden)
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
        for name, shape in (("W", (1, 4 * hidden, FEATURES)), ("R", (1, 4 * hidden, hidden)), ("B", (1, 8 * hidden)))
    ]
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=hidden)
    graph = helper.make_graph(
        [node], "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, FEATURES])],
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, hidden])], weights,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


def sequence_session(path: str, threads: int, feeds: dict[str, np.ndarray]) -> hetflow.InferenceSession:
    """A session made (and run once) with one column's spinning steps turned off."""
    saved = jit_lstm.VECTOR_MIN_BYTES
    jit_lstm.VECTOR_MIN_BYTES = 1 << 62
    try:
        session = hetflow.InferenceSession(path, threads=threads)
        session.run(None, feeds)
    finally:
        jit_lstm.VECTOR_MIN_BYTES = saved
    return session


def measure(hidden: int, folder: Path, steps: int, repeat: int, threads: int) -> dict[str, object]:
    import onnxruntime as ort

    path = str(folder / f"lstm_h{hidden}.onnx")
    onnx.save(lstm_model(steps, hidden), path)
    feeds = {"x": np.random.default_rng(1).standard_normal((steps, 1, FEATURES)).astype(np.float32)}
    spin = hetflow.InferenceSession(path, threads=threads)
    sequence = sequence_session(path, threads, feeds)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    peer = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    reference = peer.run(None, feeds)[0]
    for session in (spin, sequence):
        np.testing.assert_allclose(session.run(None, feeds)[0], reference, rtol=1e-4, atol=1e-5)
    timings = side_by_side({
        "spin": lambda: spin.run(None, feeds),
        "sequence": lambda: sequence.run(None, feeds),
        "ort": lambda: peer.run(None, feeds),
    }, repeat)  # fmt: skip
    row: dict[str, object] = {"hidden": hidden, "r_mb": 16 * hidden * hidden / 1e6,
                              "spins": jit_lstm.column_spins(hidden, threads)}  # fmt: skip
    for label, timing in timings.items():
        row[f"{label}_min_ms"], row[f"{label}_median_ms"] = timing.min * 1e3, timing.median * 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", default="128,256,320,512")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    header = [
        f"LSTM, batch 1, {args.steps} steps, {FEATURES} features, {args.threads} threads, {args.repeat} repetitions",
        "| hidden | R MB | spins | spin min ms | sequence min ms | ORT min ms | spin / sequence | spin / ORT |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def line(hidden: int, row: dict) -> str:
        spin, sequence, peer = row["spin_min_ms"], row["sequence_min_ms"], row["ort_min_ms"]
        return (f"| {hidden} | {row['r_mb']:.2f} | {'yes' if row['spins'] else 'no'} | {spin:.3f} | {sequence:.3f} | "
                f"{peer:.3f} | {spin / sequence:.2f} | {spin / peer:.2f} |")  # fmt: skip

    hiddens = [int(h) for h in args.hidden.split(",")]
    table_of_cases(hiddens, lambda h, folder: measure(h, folder, args.steps, args.repeat, args.threads), header,
                   line, args.json)  # fmt: skip


if __name__ == "__main__":
    main()
