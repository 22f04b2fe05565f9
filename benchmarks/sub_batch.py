"""A batch run whole and as runs of fewer images (``InferenceSession(sub_batch=...)``), beside ONNX Runtime.

    python benchmarks/sub_batch.py [--models squeezenet,mobilenetv2] [--batch 16] [--repeat 8]

For every model: hetflow sessions on the cost model's algorithms (no tuning cache read) that run the
batch whole and in runs of 8, 4 and 2 images, and ONNX Runtime on the whole batch, all timed in one
process with their runs interleaved (``hetflow.bench.timing.side_by_side``). Reports each one's min /
median and its ratio to ONNX Runtime: what ``hetflow tune MODEL --batch B`` chooses between, and what
the choice is worth against the peer.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hetflow  # noqa: E402
from hetflow import zoo  # noqa: E402
from hetflow.bench.timing import side_by_side  # noqa: E402
from hetflow.runtime.sub_batch import candidates  # noqa: E402

DEFAULT_MODELS = "squeezenet,mobilenetv2,densenet121,shufflenet,googlenet,inception_v2,resnet50"


def _feed(session: hetflow.InferenceSession, batch: int) -> dict[str, np.ndarray]:
    value = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in value.shape]
    return {value.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def measure(name: str, batch: int, repeat: int, threads: int) -> dict[str, tuple[float, float]]:
    """label -> (min ms, median ms) for the whole batch, each split of it, and ONNX Runtime."""
    import onnxruntime as ort

    path = zoo.model_path(name)
    cache = Path(tempfile.mkdtemp(prefix="hetflow-sub-batch-")) / "never-written.jsonl"
    sizes = [batch, *reversed(candidates(batch))]
    sessions = {
        f"hetflow {size} a run": hetflow.InferenceSession(path, threads=threads, tuning_cache=cache, sub_batch=size)
        for size in sizes
    }  # fmt: skip
    feed = _feed(next(iter(sessions.values())), batch)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    peer = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    runs = {label: (lambda s=session: s.run(None, feed)) for label, session in sessions.items()}
    runs["ORT"] = lambda: peer.run(None, feed)
    for run in runs.values():
        run()  # plans made, untimed
    timings = side_by_side(runs, repeat)
    return {label: (t.min_ms, t.median_ms) for label, t in timings.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print("| model | runtime | min ms | median ms | / ORT (min) |")
    print("|---|---|---|---|---|")
    for name in args.models.split(","):
        results = measure(name, args.batch, args.repeat, args.threads)
        peer = results["ORT"][0]
        for label, (low, median) in results.items():
            print(f"| {name} | {label} | {low:.2f} | {median:.2f} | {low / peer:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
