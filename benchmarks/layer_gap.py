"""Where a model's time goes against ONNX Runtime: each layer's hetflow time beside ORT's, per algorithm.

    python benchmarks/layer_gap.py --model resnet50 [--batch 1] [--runs 20] [--threads 2] [--layers]

``compare.py`` says how much slower or faster a whole run is; this says which layers make the
difference. In one process it times ``--runs`` observed hetflow runs (every node called and timed on
its own, as ``hetflow profile`` does, so replayed runs are a little faster than the sum) and ``--runs``
ONNX Runtime runs with ORT's profiler on, in alternating blocks of ``BLOCK`` runs, each block after an
untimed run (a runtime's threads keep spinning a while after its run and would slow the other's first
layers); then it matches the nodes: ORT names a fused node by its node name or by the last output of
the chain it fused (``r2_nchwc`` for Conv+BN+Relu ending in ``r2``), and hetflow's fused node carries
that chain's output. Reported per hetflow algorithm (and per layer with ``--layers``): the sums of the
nodes' median and minimum milliseconds on each side and the ratio of the medians. Nodes left over on
both sides pair up by op type in order (the runtimes may fold a residual Add into different Convs of a
block); the rest count on hetflow's side only, under "unmatched". hetflow's times include the Python
around each observed call (10-20 us a node on the 2-vCPU VMs), which a replayed run does not pay and
ORT's kernel times do not count: on networks of small layers compare the whole runs too
(``compare.py``), or take ``--replayed``: each hetflow layer then reads the time it takes replayed alone
on its real inputs, as a run replays it (``hetflow.estimate.validate.layer_seconds``, what
``hetflow estimate --validate`` measures), after the alternating blocks.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hetflow import InferenceSession, zoo

#: ORT kernel-time events end in this; the rest of the name is the node's.
ORT_SUFFIX = "_kernel_time"
#: ORT's NCHWc transformer appends this to the nodes it rewrites.
NCHWC_SUFFIX = "_nchwc"
#: ORT's activation fusion names the node it makes with this prefix ("fused fc1", a FusedGemm).
FUSED_PREFIX = "fused "
#: Runs of one runtime in a row, after one untimed run, before the other runtime's.
BLOCK = 5


@dataclass
class Layer:
    """One hetflow node and the ORT node matched to it (if any), with their per-run times in seconds."""

    name: str
    op_type: str
    algorithm: str
    keys: tuple[str, ...]
    hetflow: list[float] = field(default_factory=list)
    ort: list[float] = field(default_factory=list)


def _feed(session: InferenceSession, batch: int) -> dict[str, np.ndarray]:
    feed = session.get_inputs()[0]
    shape = [batch if isinstance(d, str) else d for d in feed.shape]
    return {feed.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def _ort_session(path: Path, threads: int, profile_dir: str):  # noqa: ANN202
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(profile_dir) / "ort")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ort_times(profile: Path, timed: list[bool]) -> dict[str, tuple[str, list[float]]]:
    """ORT node name (suffixes stripped) -> its op type and the seconds of each run ``timed`` marks (one
    flag per run), in the order ORT runs the nodes."""
    times: dict[str, tuple[str, list[float]]] = {}
    for event in json.loads(profile.read_text()):
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith(ORT_SUFFIX):
            key = name[: -len(ORT_SUFFIX)].removesuffix(NCHWC_SUFFIX).removeprefix(FUSED_PREFIX)
            times.setdefault(key, (event.get("args", {}).get("op_name", ""), []))[1].append(event["dur"] / 1e6)
    return {key: (op, [t for t, keep in zip(values, timed) if keep]) for key, (op, values) in times.items()}


def _match(layers: list[Layer], ort_times: dict[str, tuple[str, list[float]]]) -> None:
    """Give each layer its ORT node's times: by name or fused output first; then the layers left and
    ORT's nodes left of one op type pair up in order (the two runtimes may fold a residual Add into
    different Convs of a block)."""
    for layer in layers:
        key = next((key for key in layer.keys if key in ort_times), None)
        if key is not None:
            layer.ort = ort_times.pop(key)[1]
    for op_type in {layer.op_type for layer in layers if not layer.ort}:
        left = [layer for layer in layers if not layer.ort and layer.op_type == op_type]
        theirs = [times for op, times in ort_times.values() if op == op_type]
        if len(left) == len(theirs):
            for layer, times in zip(left, theirs):
                layer.ort = times


def measure(model: str, batch: int, runs: int, threads: int, replayed: bool = False) -> list[Layer]:
    """Both runtimes on ``model`` at ``batch``, in alternating blocks of ``BLOCK`` runs; the layers in
    hetflow's order (with ``replayed``, hetflow's times are each layer's replayed alone instead)."""
    path = zoo.model_path(model)
    session = InferenceSession(path, threads=threads)
    feeds = _feed(session, batch)
    layers: dict[str, Layer] = {}

    def observe(step, seconds: float) -> None:  # noqa: ANN001
        layer = layers.get(step.node.name)
        if layer is None:
            keys = (step.node.name, *step.node.outputs)
            layer = layers[step.node.name] = Layer(step.node.name, step.node.op_type, step.kernel.algorithm, keys)
        layer.hetflow.append(seconds)

    timed: list[bool] = []  # one flag per ORT run: whether it is counted
    with tempfile.TemporaryDirectory() as profile_dir:
        ort_session = _ort_session(path, threads, profile_dir)
        for _ in range(3):
            session.run(None, feeds)
            ort_session.run(None, feeds)
            timed.append(False)
        for first in range(0, runs, BLOCK):
            count = min(BLOCK, runs - first)
            session.run(None, feeds)
            for _ in range(count):
                session.run(None, feeds, observer=observe)
            for untimed in [True] + [False] * count:
                ort_session.run(None, feeds)
                timed.append(not untimed)
        ort_times = _ort_times(Path(ort_session.end_profiling()), timed)
    _match(list(layers.values()), ort_times)
    if replayed:
        from hetflow.estimate.validate import layer_seconds

        for name, seconds in layer_seconds(session, feeds).items():
            if name in layers:
                layers[name].hetflow = [seconds]
    return list(layers.values())


def _ms(values: list[float], pick) -> float:  # noqa: ANN001
    return float(pick(values)) * 1e3 if values else 0.0


def report(layers: list[Layer], per_layer: bool) -> str:
    """The per-algorithm table (and the per-layer one)."""
    lines = []
    if per_layer:
        lines.append(f"{'layer':14s} {'op':10s} {'algorithm':16s} {'hetflow ms':>10s} {'ORT ms':>8s} {'ratio':>6s}")
        for layer in layers:
            h, o = _ms(layer.hetflow, np.median), _ms(layer.ort, np.median)
            ratio = f"{h / o:6.2f}" if o else "     -"
            lines.append(f"{layer.name:14s} {layer.op_type:10s} {layer.algorithm:16s} {h:10.3f} {o:8.3f} {ratio}")
        lines.append("")
    groups: dict[str, list[Layer]] = defaultdict(list)
    for layer in layers:
        group = f"{layer.op_type}/{layer.algorithm}" if layer.ort else "unmatched"
        groups[group].append(layer)
    lines.append(f"{'op/algorithm':28s} {'layers':>6s} {'hetflow med (min) ms':>22s} {'ORT med (min) ms':>18s} {'ratio':>6s}")
    total_h = total_o = 0.0
    for group, members in sorted(groups.items(), key=lambda item: -sum(_ms(m.hetflow, np.median) for m in item[1])):
        h = sum(_ms(m.hetflow, np.median) for m in members)
        h_min = sum(_ms(m.hetflow, np.min) for m in members)
        o = sum(_ms(m.ort, np.median) for m in members)
        o_min = sum(_ms(m.ort, np.min) for m in members)
        total_h, total_o = total_h + h, total_o + o
        ratio = f"{h / o:6.2f}" if o else "     -"
        lines.append(f"{group:28s} {len(members):6d} {h:13.2f} ({h_min:6.2f}) {o:10.2f} ({o_min:6.2f}) {ratio}")
    lines.append(f"{'all':28s} {len(layers):6d} {total_h:13.2f} {'':8s} {total_o:10.2f} {'':8s} {total_h / total_o:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a zoo model name")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", action="store_true", help="also print every layer")
    parser.add_argument("--replayed", action="store_true",
                        help="hetflow's layers timed replayed alone (as runs replay them), not observed")
    args = parser.parse_args(argv)
    mode = "replayed alone" if args.replayed else "observed"
    print(f"{args.model} at batch {args.batch}, {args.threads} threads, {args.runs} runs each, in alternating blocks "
          f"(hetflow's layers {mode})")
    print(report(measure(args.model, args.batch, args.runs, args.threads, args.replayed), args.layers))


if __name__ == "__main__":
    sys.exit(main())
