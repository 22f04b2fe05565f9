"""PyTorch as a benchmark peer: the same network and training step, built from a hetflow Graph.

torch is imported lazily and only here (and in ``benchmarks/``): hetflow never depends on it.
``torch_available()`` says whether the peer can run; the builders raise ImportError otherwise.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hetflow.graph import Graph

#: A training step filling ``timings`` with its phases' seconds and returning the loss.
StepFn = Callable[[dict[str, float]], float]


def torch_available() -> bool:
    """Whether PyTorch is installed (the peer's columns are measured only then)."""
    return importlib.util.find_spec("torch") is not None


def torch_model(graph: Graph, logits: str) -> Any:
    """An ``nn.Sequential`` computing ``graph`` up to ``logits`` with its weights (a chain of Conv, Relu,
    MaxPool, AveragePool, Flatten and Gemm nodes, as the zoo's CNNs are).

    Raises:
        ValueError: a node the translation does not cover, or asymmetric padding.
    """
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


def torch_train_step(
    graph: Graph,
    logits: str,
    x: np.ndarray,
    y: np.ndarray,
    lr: float = 0.01,
    momentum: float = 0.9,
    threads: int | None = None,
) -> StepFn:
    """A PyTorch SGD step (softmax cross-entropy on ``logits``) of ``graph``'s network on ``(x, y)``,
    split into forward (with the loss), backward and update like ``Trainer.train_step(timings=)``."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    net = torch_model(graph, logits)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    loss_fn = torch.nn.CrossEntropyLoss()
    x_torch, y_torch = torch.from_numpy(x), torch.from_numpy(np.asarray(y, np.int64))

    def step(timings: dict[str, float]) -> float:
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
        return float(loss.item())

    return step
