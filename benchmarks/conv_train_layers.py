"""The training Conv layer by layer: hetflow's forward and backward vs PyTorch CPU's, side by side.

    python benchmarks/conv_train_layers.py [--model mentee] [--batch 128] [--repeat 5] [--threads 2]
                                           [--settle 0.2] [--json FILE]

Every Conv of a zoo CNN (the mentee's five by default), at its shapes in the network, with a fused Relu
as the training graph has it: the forward is ``Relu(Conv(X))``, the backward dX, dW and dB from dY
through the Relu's mask (no dX for a layer that reads the network's input, as in a step). hetflow runs
``conv_train`` (the CPU's training kernels); PyTorch runs ``conv2d`` + ``relu`` and
``threshold_backward`` + ``convolution_backward``, the ops its autograd calls. The two take turns,
a few calls each after a rest, after warm-up; the table gives min and median per layer and the ratio of minimums, and
shows where a step's time goes (``benchmarks/train_step.py`` times the whole step). PyTorch is a
benchmark peer only (``pip install torch``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_THREADS = 2
#: Calls in a row per framework between rests: the first after a rest pays for waking the threads up.
BURST = 3
# NOTE: before numpy / torch are imported, so that OpenBLAS and OpenMP start with the chosen count.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, str(DEFAULT_THREADS))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetflow.devices.cpu.kernels import conv_train  # noqa: E402
from hetflow.frontends import load_model  # noqa: E402
from hetflow.ops.activation import FusedActivation  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Layer:
    """One Conv of the network: its attributes and the shapes of X and W."""

    name: str
    attrs: object
    x_shape: tuple[int, ...]
    w_shape: tuple[int, ...]
    reads_input: bool


def conv_layers(model: str, batch: int) -> list[Layer]:
    """The Convs of zoo ``model`` with X's shape at ``batch``."""
    graph = load_model(f"zoo:{model}")
    inputs = set(graph.inputs)
    layers = []
    for node in graph.nodes:
        if node.op_type != "Conv":
            continue
        x_shape = [batch if isinstance(d, str) else int(d) for d in graph.values[node.inputs[0]].shape]
        w_shape = tuple(int(d) for d in graph.initializers[node.inputs[1]].shape)
        layers.append(Layer(node.name, node.attrs, tuple(x_shape), w_shape, node.inputs[0] in inputs))
    return layers


def _timed(calls: dict[str, Callable[[], object]], rounds: int, settle: float) -> dict[str, list[float]]:
    """Seconds of each call, ``BURST`` calls in a row per framework and round, the frameworks taking
    turns round by round after a warm-up burst, with ``settle`` seconds of rest before each burst."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(rounds + 1):
        for name, call in calls.items():
            time.sleep(settle)  # the other framework's worker threads may still be spinning
            for _ in range(BURST):
                start = time.perf_counter()
                call()
                if round_:  # round 0 warms up
                    samples[name].append(time.perf_counter() - start)
    return samples


def layer_calls(
    layer: Layer, rng: np.random.Generator, torch: object
) -> dict[str, dict[str, Callable[[], object]]]:
    """pass -> framework -> a call of that pass on one layer's random data (the same arrays for both)."""
    attrs = dataclasses.replace(layer.attrs, fused=FusedActivation("Relu"))
    x = rng.standard_normal(layer.x_shape).astype(np.float32)
    w = (rng.standard_normal(layer.w_shape) / np.sqrt(np.prod(layer.w_shape[1:]))).astype(np.float32)
    b = rng.standard_normal(layer.w_shape[0]).astype(np.float32) * np.float32(0.1)
    y = conv_train.conv_forward(x, w, b, attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    want_x = not layer.reads_input
    tx, tw, tb, ty, tdy = (torch.from_numpy(a) for a in (x, w, b, y, dy))
    stride, dilation = list(attrs.strides or (1, 1)), list(attrs.dilations or (1, 1))
    padding = _symmetric_pads(attrs)

    def torch_forward() -> object:
        return torch.relu(torch.nn.functional.conv2d(tx, tw, tb, stride, padding, dilation, attrs.group))

    def torch_backward() -> object:
        masked = torch.ops.aten.threshold_backward(tdy, ty, 0)
        return torch.ops.aten.convolution_backward(
            masked,
            tx,
            tw,
            [tw.shape[0]],
            stride,
            padding,
            dilation,
            False,
            [0, 0],
            attrs.group,
            [want_x, True, True],
        )

    return {
        "forward": {"hetflow": lambda: conv_train.conv_forward(x, w, b, attrs), "pytorch": torch_forward},
        "backward": {
            "hetflow": lambda: conv_train.conv_backward(x, w, dy, attrs, want_x, True, True, y=y),
            "pytorch": torch_backward,
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mentee", help="zoo CNN (mentee)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument(
        "--repeat", type=int, default=5, help=f"rounds of {BURST} timed calls per framework and pass (5)"
    )
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument(
        "--settle",
        type=float,
        default=0.2,
        help="seconds of rest before each burst of calls (0.2): "
        "PyTorch's OpenMP threads spin for a while after a call, on the cores the next call needs",
    )
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    rows = []
    print(
        f"training Conv + Relu of {args.model}, batch {args.batch}, {args.threads} threads, "
        f"{args.repeat} rounds of {BURST} calls"
    )
    print(
        f"{'layer':28} {'pass':8} {'hetflow min':>11} {'median':>8} {'pytorch min':>11} {'median':>8} {'ratio':>6}"
    )
    for layer in conv_layers(args.model, args.batch):
        passes = layer_calls(layer, rng, torch)
        label = f"{layer.x_shape[1]}->{layer.w_shape[0]} @{layer.x_shape[2]}x{layer.x_shape[3]}"
        for phase, calls in passes.items():
            with torch.no_grad():
                samples = _timed(calls, args.repeat, args.settle)
            mins = {name: min(times) for name, times in samples.items()}
            medians = {name: float(np.median(times)) for name, times in samples.items()}
            ratio = mins["hetflow"] / mins["pytorch"]
            print(f"{label:28} {phase:8} {mins['hetflow'] * 1e3:9.1f}ms {medians['hetflow'] * 1e3:6.1f}ms "
                  f"{mins['pytorch'] * 1e3:9.1f}ms {medians['pytorch'] * 1e3:6.1f}ms {ratio:6.2f}")  # fmt: skip
            rows.append({"layer": layer.name, "shape": label, "pass": phase, "ratio": ratio,
                         **{f"{name}_ms": [t * 1e3 for t in times] for name, times in samples.items()}})  # fmt: skip
    for phase in ("forward", "backward"):
        totals = {name: sum(min(row[f"{name}_ms"]) for row in rows if row["pass"] == phase)
                  for name in ("hetflow", "pytorch")}  # fmt: skip
        print(f"{'all layers':28} {phase:8} {totals['hetflow']:9.1f}ms {'':8} {totals['pytorch']:9.1f}ms "
              f"{'':8} {totals['hetflow'] / totals['pytorch']:6.2f}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "batch": args.batch, "threads": args.threads,
                                         "rows": rows}, indent=1))  # fmt: skip
    return 0


def _symmetric_pads(attrs: object) -> list[int]:
    """PyTorch's ``padding`` (one per axis) from ONNX pads, which must be the same at both ends."""
    pads = list(attrs.pads or (0, 0, 0, 0))
    half = len(pads) // 2
    if pads[:half] != pads[half:]:
        raise SystemExit(f"PyTorch's conv2d pads both ends alike; this layer pads {pads}")
    return pads[:half]


if __name__ == "__main__":
    sys.exit(main())
