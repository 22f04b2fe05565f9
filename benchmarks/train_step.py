"""One training step of the mentee net (zoo) at batch 128: hetflow vs PyTorch CPU, side by side.

    python benchmarks/train_step.py [--model mentee] [--batch 128] [--repeat 10] [--threads 2] [--json FILE]

Both frameworks train the same network from the same weights (the zoo's, copied into an equivalent
``torch.nn.Sequential`` built from hetflow's graph) on the same random CIFAR-10-shaped batch, with SGD
(momentum 0.9) and softmax cross-entropy on the logits. Each step is split into forward (with the loss),
backward and update; the frameworks are interleaved step by step after warm-up steps, with the same
thread count, and the table gives min and median per phase and the hetflow / PyTorch ratio of minimums.
PyTorch is a benchmark peer only (``pip install torch``); hetflow never imports it. Run on a quiet
machine: other processes on the cores make both sides slower by different amounts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEFAULT_THREADS = 2
# NOTE: before numpy / torch are imported, so that OpenBLAS and OpenMP start with the chosen count.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, str(DEFAULT_THREADS))

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetflow.graph import Graph  # noqa: E402
from hetflow.train import SGD, Trainer  # noqa: E402

PHASES = ("forward", "backward", "update", "step")


def torch_model(graph: Graph, logits: str):
    """An ``nn.Sequential`` computing ``graph`` up to ``logits`` with its weights (a chain of Conv, Relu,
    MaxPool, AveragePool, Flatten and Gemm nodes, as the zoo's CNNs are)."""
    import torch
    from torch import nn

    layers = []
    for node in graph.nodes:
        attrs = node.attrs
        if node.op_type == "Conv":
            w = graph.initializers[node.inputs[1]]
            pads = attrs.pads or (0,) * 4
            if pads[:2] != pads[2:]:
                raise ValueError(f"{node.name}: asymmetric padding")
            conv = nn.Conv2d(
                w.shape[1] * attrs.group,
                w.shape[0],
                tuple(w.shape[2:]),
                stride=attrs.strides or 1,
                padding=tuple(pads[:2]),
                dilation=attrs.dilations or 1,
                groups=attrs.group,
                bias=len(node.inputs) > 2,
            )
            conv.weight.data = torch.from_numpy(w.copy())
            if len(node.inputs) > 2:
                conv.bias.data = torch.from_numpy(graph.initializers[node.inputs[2]].copy())
            layers.append(conv)
        elif node.op_type == "Relu":
            layers.append(nn.ReLU())
        elif node.op_type in ("MaxPool", "AveragePool"):
            cls = nn.MaxPool2d if node.op_type == "MaxPool" else nn.AvgPool2d
            layers.append(
                cls(attrs.kernel_shape, stride=attrs.strides or None, ceil_mode=bool(attrs.ceil_mode))
            )
        elif node.op_type == "Flatten":
            layers.append(nn.Flatten())
        elif node.op_type == "Gemm":
            w = graph.initializers[node.inputs[1]]
            weight = w if attrs.transB else w.T
            linear = nn.Linear(weight.shape[1], weight.shape[0])
            linear.weight.data = torch.from_numpy(np.array(weight))
            linear.bias.data = torch.from_numpy(graph.initializers[node.inputs[2]].copy())
            layers.append(linear)
        else:
            raise ValueError(f"{node.name}: {node.op_type} is not translated")
        if node.outputs[0] == logits:
            break
    return nn.Sequential(*layers)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mentee", help="zoo model (a plain CNN chain) (mentee)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=10, help="timed steps per framework (10)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per framework first (2)")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()

    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    trainer = Trainer(f"zoo:{args.model}", optimizer=SGD(0.01, momentum=0.9))
    logits = trainer.training.scores
    net = torch_model(trainer.graph, logits)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    shape = [args.batch if isinstance(d, str) else d for d in trainer.graph.values[trainer.input_name].shape]
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, args.batch)
    x_torch, y_torch = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step(timings: dict[str, float]) -> float:
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(x_torch), y_torch)
        forward_done = time.perf_counter()
        loss.backward()
        backward_done = time.perf_counter()
        optimizer.step()
        timings.update(
            forward=forward_done - started,
            backward=backward_done - forward_done,
            update=time.perf_counter() - backward_done,
        )
        return loss.item()

    def hetflow_step(timings: dict[str, float]) -> float:
        loss, _ = trainer.train_step(x, y, timings)
        return loss

    steps = {"hetflow": hetflow_step, "pytorch": torch_step}
    first = {name: step({}) for name, step in steps.items()}
    print(f"step-0 loss: hetflow {first['hetflow']:.6f}, pytorch {first['pytorch']:.6f} (same weights)")
    for _ in range(args.warmup - 1):
        for step in steps.values():
            step({})
    samples = {name: {phase: [] for phase in PHASES} for name in steps}
    for _ in range(args.repeat):
        for name, step in steps.items():  # interleaved, so both see the same machine state
            timings: dict[str, float] = {}
            step(timings)
            timings["step"] = timings["forward"] + timings["backward"] + timings["update"]
            for phase in PHASES:
                samples[name][phase].append(timings[phase])

    rows = []
    print(f"{args.model} training step, batch {args.batch}, {args.threads} threads, {args.repeat} steps each")
    print(f"{'phase':<9} {'hetflow min':>12} {'median':>9} {'pytorch min':>12} {'median':>9} {'ratio':>7}")
    for phase in PHASES:
        ours, theirs = samples["hetflow"][phase], samples["pytorch"][phase]
        row = {
            "phase": phase,
            "hetflow_min_s": min(ours),
            "hetflow_median_s": float(np.median(ours)),
            "pytorch_min_s": min(theirs),
            "pytorch_median_s": float(np.median(theirs)),
            "ratio_of_minimums": min(ours) / min(theirs),
        }
        rows.append(row)
        print(
            f"{phase:<9} {row['hetflow_min_s'] * 1e3:10.1f}ms {row['hetflow_median_s'] * 1e3:7.1f}ms "
            f"{row['pytorch_min_s'] * 1e3:10.1f}ms {row['pytorch_median_s'] * 1e3:7.1f}ms "
            f"{row['ratio_of_minimums']:7.2f}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"model": args.model, "batch": args.batch, "threads": args.threads, "rows": rows}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
