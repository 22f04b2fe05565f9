"""The training loop: ``Trainer(model, loss=..., optimizer=...).fit(x, y, epochs, batch_size)``."""

from __future__ import annotations

import fnmatch
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetflow.devices.cpu.kernels.buffers import StepBuffers, step_buffers
from hetflow.errors import BudgetError
from hetflow.frontends import ModelSource, load_model
from hetflow.frontends.onnx_export import save_model
from hetflow.graph import Graph
from hetflow.ops import registry
from hetflow.ops.base import TensorInfo, nbytes
from hetflow.ops.loss import READS_LOGITS, LossResult, get_loss
from hetflow.train.autograd import Tape, TrainingError
from hetflow.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from hetflow.train.device import training_devices
from hetflow.train.graph import (
    TrainingGraph,
    fuse_conv_relu,
    parameter_names,
    record_pool_indices,
    set_dropout_seed,
    training_graph,
)
from hetflow.train.optim import Adam, Optimizer

LossFn = Callable[[np.ndarray, np.ndarray], LossResult]


@dataclass
class EpochStats:
    """One epoch's summary: mean training loss and accuracy, validation metrics when given."""

    epoch: int
    train_loss: float
    train_accuracy: float | None
    seconds: float
    val_loss: float | None = None
    val_accuracy: float | None = None


@dataclass
class History:
    """Everything ``fit`` measured, epoch by epoch."""

    epochs: list[EpochStats] = field(default_factory=list)

    @property
    def last(self) -> EpochStats:
        return self.epochs[-1]


class Trainer:
    """Train a model's weights on the CPU or an accelerator, then export it as ONNX.

    Args:
        model: anything ``hetflow.load_model`` accepts (path, ``"zoo:NAME"``, ModelProto, Graph).
        loss: ``"cross_entropy"`` (reads the scores before a final Softmax / LogSoftmax, fused and
            numerically stable; integer labels or target probabilities) or ``"mse"``, or a function
            ``(scores, targets) -> LossResult``.
        optimizer: an ``Optimizer`` (default ``Adam(lr=1e-3)``).
        device: ``"cpu"``; an accelerator by name (``"opencl:0"``), which runs every node its kernels
            support forward and backward (the CPU the rest, see ``hetflow.train.device``), the loss and
            the optimizer's update; or ``"auto"``: the first accelerator that starts, else the CPU with
            one warning. A device named explicitly that cannot start raises DeviceUnavailableError.
        memory_budget: bytes (or ``"64MB"``) a step may hold: initializers, optimizer state, and a
            bound on the step's transient peak (kept activations, gradients, and the running kernel's or
            rule's scratch; see ``memory_report``). Under it the tape recomputes cheap activations
            (checkpointing); a step that cannot fit raises BudgetError before running. NOTE: the scratch
            is the ops' costed workspace (the CPU kernels'); an accelerator's kernels may add their own
            (packed GEMM panels) on top.
        freeze: glob patterns of parameter or node names whose parameters stay fixed.
        seed: seed of the shuffling and of Dropout's masks.

    Example::

        trainer = Trainer("zoo:lenet", optimizer=Adam(lr=1e-3))
        trainer.fit(x_train, y_train, epochs=5, batch_size=64, validation=(x_test, y_test))
        trainer.export("lenet-trained.onnx")
    """

    def __init__(
        self,
        model: ModelSource | Graph,
        loss: str | LossFn = "cross_entropy",
        optimizer: Optimizer | None = None,
        device: str = "cpu",
        memory_budget: int | str | None = None,
        freeze: Sequence[str] = (),
        seed: int = 0,
    ):
        self.devices = training_devices(device)
        self.graph = load_model(model)
        if isinstance(loss, str):
            self.loss_name = loss
            # The device's own version of the loss when it has one (it falls back to numpy itself).
            self._loss = self.devices.kernels.losses.get(loss) or get_loss(loss)
            reads_logits = loss in READS_LOGITS
        else:
            self.loss_name = getattr(loss, "__name__", "custom")
            self._loss = loss
            reads_logits = False
        self._train = training_graph(self.graph, reads_logits)
        if all(d.kind == "cpu" for d in self.devices.devices):
            # NOTE: only where the CPU runs every node: its training Conv computes the fused Relu in
            # place of two passes over the activation, and its MaxPool backward scatters by Indices
            # its forward records; an accelerator's rules do neither.
            fuse_conv_relu(self._train.graph)
            record_pool_indices(self._train.graph)
        self.optimizer = optimizer or Adam(lr=1e-3)
        self.memory_budget = _parse_budget(memory_budget)
        self._rng = np.random.default_rng(seed)
        self._seed = seed
        # The trainer owns its weights: copies, so that the loaded graph's arrays are never written, in
        # memory the device's update kernels can write in place.
        copy = self.devices.kernels.host_copy
        self.params = {
            name: copy(self.graph.initializers[name]) for name in parameter_names(self._train.graph)
        }
        self.buffers = {
            name: np.array(self.graph.initializers[name]) for name in self._train.running.values()
        }
        for name, array in {**self.params, **self.buffers}.items():
            self._train.graph.initializers[name] = array
        self._frozen: set[str] = set()
        self._tape: Tape | None = None
        self._planned_batch: int | None = None
        self._bound_graphs: dict[int, Graph] = {}
        # The steps' large outputs, reused from step to step. NOTE: not under a budget: the pool keeps
        # each shape's arrays between steps, more than the step's peak of live bytes.
        self._step_buffers = StepBuffers() if self.memory_budget is None else None
        self.freeze(*freeze)
        self.input_name = self.graph.input_values()[0].name
        self.steps = 0

    # -- parameters ----------------------------------------------------------------------------
    def freeze(self, *patterns: str) -> list[str]:
        """Keep the parameters matching ``patterns`` (parameter or node names, glob) fixed; returns them."""
        matched = self._match(patterns)
        self._frozen.update(matched)
        self._tape = None  # re-planned on the next step
        return matched

    def unfreeze(self, *patterns: str) -> list[str]:
        """Train the parameters matching ``patterns`` again (every one when none is given)."""
        matched = self._match(patterns) if patterns else sorted(self._frozen)
        self._frozen.difference_update(matched)
        self._tape = None
        return matched

    def train_only_head(self, layers: int = 1) -> list[str]:
        """Freeze everything but the parameters of the last ``layers`` layers that have any (fine-tuning an
        imported model: on-device personalisation). Returns the trainable parameter names."""
        owners: list[list[str]] = []
        for node in self._train.graph.nodes:
            owned = [name for name in node.inputs if name in self.params]
            if owned:
                owners.append(owned)
        head = {name for owned in owners[-layers:] for name in owned}
        self._frozen = set(self.params) - head
        self._tape = None
        return sorted(head)

    @property
    def device(self) -> str:
        """The id of the device the trainer runs on (``"cpu"``, ``"opencl:0"``...)."""
        return self.devices.primary.id

    @property
    def training(self) -> TrainingGraph:
        """The training form of the model (its graph, the value the loss reads, running statistics)."""
        return self._train

    @property
    def trainable(self) -> list[str]:
        """Names of the parameters the next step updates."""
        return [name for name in self.params if name not in self._frozen]

    def _match(self, patterns: Iterable[str]) -> list[str]:
        matched = []
        for node in self._train.graph.nodes:
            for name in node.inputs:
                if name in self.params and any(
                    fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(node.name, p) for p in patterns
                ):
                    matched.append(name)
        return sorted(set(matched))

    @property
    def tape(self) -> Tape:
        """The autograd tape for the current trainable set (re-planned after freezing)."""
        if self._tape is None:
            self._tape = Tape(self._train.graph, self.trainable, devices=self.devices)
            self._planned_batch = None
        return self._tape

    # -- memory --------------------------------------------------------------------------------
    def fixed_bytes(self) -> int:
        """Memory a step always holds: the graph's initializers (weights, statistics, constants) and the
        optimizer's per-parameter state."""
        weights = sum(array.nbytes for array in self._train.graph.initializers.values())
        state = self.optimizer.state_slots * sum(self.params[name].nbytes for name in self.trainable)
        return weights + state

    def value_sizes(self, batch: int) -> dict[str, int]:
        """Bytes of every value of the training graph at ``batch`` examples."""
        bound = self._bound(batch)
        return {name: nbytes(TensorInfo(value.shape, value.dtype)) for name, value in bound.values.items()}

    def scratch_bytes(self, batch: int) -> dict[str, tuple[int, int]]:
        """Node name -> temporary bytes of its forward kernel and of its backward rule at ``batch``.

        Forward: the op's costed workspace (im2col columns...) plus two arrays the size of its largest
        input or output (padding copies, epilogues). Backward: ``OpDef.backward_workspace``.
        """
        bound = self._bound(batch)
        scratch = {}
        for node in bound.nodes:
            opdef = registry.get(node.op_type, node.domain)
            inputs = [_info(bound, name) if name else None for name in node.inputs]
            outputs = [_info(bound, name) if name else None for name in node.outputs]
            largest = max((nbytes(info) for info in (*inputs, *outputs)), default=0)
            forward = (
                opdef.cost(node, inputs, [o for o in outputs if o is not None]).workspace_bytes + largest
            )
            backward = opdef.backward_workspace(node, inputs, outputs) if opdef.has_backward else 0
            scratch[node.name] = (forward, backward)
        return scratch

    def _bound(self, batch: int) -> Graph:
        from hetflow.passes import bind_batch

        cached = self._bound_graphs.get(batch)
        if cached is None:
            cached = bind_batch(self._train.graph, {self._batch_symbol(): batch})
            for name, value in cached.values.items():
                if value.shape is None or not all(isinstance(d, int) for d in value.shape):
                    raise TrainingError(f"value '{name}' has no static shape at batch {batch}")
            self._bound_graphs[batch] = cached
        return cached

    def _batch_symbol(self) -> str:
        shape = self.graph.values[self.input_name].shape or ()
        symbols = [d for d in shape if isinstance(d, str)]
        if not symbols:
            raise TrainingError(f"input '{self.input_name}' has no symbolic batch dimension")
        return symbols[0]

    def memory_report(self, batch: int) -> dict[str, int]:
        """Training memory at ``batch``.

        Keys: ``fixed_bytes`` (initializers and optimizer state), ``step_peak_bytes`` (activations and
        gradients the tape holds at its peak: what ``tape.peak_bytes`` measures), ``step_bound_bytes``
        (that plus every kernel's and rule's scratch: what a budget is checked against) and
        ``planned_step_bound_bytes`` (the bound with the recomputation the budget chose).
        """
        tape = self.tape
        sizes = self.value_sizes(batch)
        scratch = self.scratch_bytes(batch)
        running = list(self._train.running)
        return {
            "fixed_bytes": self.fixed_bytes(),
            "step_peak_bytes": tape.simulate_peak(sizes, running, recompute=()),
            "step_bound_bytes": tape.simulate_peak(sizes, running, recompute=(), scratch=scratch),
            "planned_step_bound_bytes": tape.simulate_peak(sizes, running, scratch=scratch),
        }

    def _plan_memory(self, batch: int) -> None:
        """Under a budget, choose what to recompute at this batch size so the step fits (once per size)."""
        if self.memory_budget is None or self._planned_batch == batch:
            return
        available = self.memory_budget - self.fixed_bytes()
        running = list(self._train.running)
        self.tape.plan_recompute(self.value_sizes(batch), available, running, self.scratch_bytes(batch))
        self._planned_batch = batch

    # -- steps ---------------------------------------------------------------------------------
    def train_step(
        self, x: np.ndarray, y: np.ndarray, timings: dict[str, float] | None = None
    ) -> tuple[float, int]:
        """One optimisation step on a batch; returns (loss, correctly classified examples).

        Args:
            timings: when given, receives the seconds of the step's phases: ``forward`` (with the loss),
                ``backward`` and ``update`` (benchmarks read it).
        """
        tape = self.tape
        self._plan_memory(len(x))
        set_dropout_seed(self._train, self._seed * 100003 + self.steps)
        started = time.perf_counter()
        with step_buffers(self._step_buffers):
            forward = tape.forward({self.input_name: x}, outputs=self._train.running)
            scores = forward.values[self._train.scores]
            result = self._loss(scores, y)
            forward_done = time.perf_counter()
            grads = tape.backward(forward, {self._train.scores: result.grad})
            backward_done = time.perf_counter()
        if self.memory_budget is not None and tape.peak_bytes + self.fixed_bytes() > self.memory_budget:
            # NOTE: the plan bounds what the tape measures (plus scratch); this guards that promise.
            raise BudgetError(
                f"a training step at batch {len(x)} held {tape.peak_bytes + self.fixed_bytes()} bytes; the "
                f"budget is {self.memory_budget}"
            )
        self.optimizer.step(self.params, grads, self.devices.kernels)
        for output, initializer in self._train.running.items():
            self.buffers[initializer][...] = forward.values[output]
        if timings is not None:
            timings.update(
                forward=forward_done - started,
                backward=backward_done - forward_done,
                update=time.perf_counter() - backward_done,
            )
        self.steps += 1
        return result.value, _correct(scores, y)

    def fit(
        self,
        x: np.ndarray,
        y: np.ndarray,
        epochs: int = 1,
        batch_size: int = 32,
        validation: tuple[np.ndarray, np.ndarray] | None = None,
        shuffle: bool = True,
        progress: bool | None = None,
        on_epoch: Callable[[EpochStats], None] | None = None,
        augment: Callable[[np.ndarray, np.random.Generator], np.ndarray] | None = None,
    ) -> History:
        """Train for ``epochs`` passes over ``(x, y)`` in batches of ``batch_size``.

        Args:
            validation: ``(x, y)`` evaluated (inference form) after every epoch.
            shuffle: visit the examples in a new seeded order every epoch.
            progress: show a tqdm bar with loss and accuracy on stderr (default: when it is a terminal).
            on_epoch: called with each epoch's statistics.
            augment: maps each training batch (with the trainer's seeded generator) before the step.
        """
        from tqdm import tqdm

        x = np.asarray(x, dtype=self.graph.values[self.input_name].dtype)
        y = np.asarray(y)
        if len(x) != len(y):
            raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
        show = sys.stderr.isatty() if progress is None else progress
        history = History()
        batches = -(-len(x) // batch_size)
        for epoch in range(epochs):
            started = time.perf_counter()
            order = self._rng.permutation(len(x)) if shuffle else np.arange(len(x))
            total_loss, total_correct, seen = 0.0, 0, 0
            bar = tqdm(
                range(batches),
                desc=f"epoch {epoch + 1}/{epochs}",
                unit="batch",
                disable=not show,
                leave=False,
                file=sys.stderr,
            )
            for batch in bar:
                index = order[batch * batch_size : (batch + 1) * batch_size]
                inputs = x[index] if augment is None else augment(x[index], self._rng)
                loss, correct = self.train_step(inputs, y[index])
                total_loss += loss * len(index)
                total_correct += correct
                seen += len(index)
                bar.set_postfix(loss=f"{total_loss / seen:.4f}", acc=f"{total_correct / seen:.3f}")
            bar.close()
            stats = EpochStats(
                epoch + 1,
                total_loss / seen,
                total_correct / seen if y.ndim == 1 else None,
                time.perf_counter() - started,
            )
            if validation is not None:
                metrics = self.evaluate(*validation)
                stats.val_loss, stats.val_accuracy = metrics["loss"], metrics.get("accuracy")
            history.epochs.append(stats)
            if on_epoch is not None:
                on_epoch(stats)
        return history

    # -- inference -----------------------------------------------------------------------------
    def _inference_graph(self) -> Graph:
        graph = self.graph.copy()
        graph.initializers.update(
            {name: array.copy() for name, array in {**self.params, **self.buffers}.items()}
        )
        return graph

    def predict(self, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
        """The model's output (inference form: BatchNormalization with running statistics, no Dropout)."""
        return self._run_inference(x, batch_size, self.graph.outputs[0])

    def _run_inference(self, x: np.ndarray, batch_size: int, output: str) -> np.ndarray:
        graph = self.graph.copy()
        graph.initializers.update({**self.params, **self.buffers})
        tape = Tape(graph, (), devices=self.devices)
        x = np.asarray(x, dtype=self.graph.values[self.input_name].dtype)
        pieces = [
            tape.forward({self.input_name: x[i : i + batch_size]}, outputs=[output]).values[output]
            for i in range(0, len(x), batch_size)
        ]
        return np.concatenate(pieces)

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = 256) -> dict[str, float]:
        """Loss and (for class labels) accuracy of the inference form on ``(x, y)``."""
        scores = self._run_inference(x, batch_size, self._train.scores)
        y = np.asarray(y)
        metrics = {"loss": self._loss(scores, y).value}
        if y.ndim == 1:
            metrics["accuracy"] = _correct(scores, y) / len(y)
        return metrics

    # -- persistence ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> None:
        """Write a checkpoint (weights, running statistics, optimizer state) without pickle."""
        meta: dict[str, Any] = {
            "steps": self.steps,
            "optimizer_steps": self.optimizer.steps,
            "loss": self.loss_name,
            "optimizer": type(self.optimizer).__name__,
        }
        save_checkpoint(path, Checkpoint(self.params, self.buffers, self.optimizer.state_arrays(), meta))

    def load(self, path: str | os.PathLike) -> None:
        """Restore a checkpoint written by ``save`` for this model."""
        checkpoint = load_checkpoint(path)
        for target, source in ((self.params, checkpoint.params), (self.buffers, checkpoint.buffers)):
            unknown = set(source) - set(target)
            if unknown:
                raise ValueError(f"checkpoint has tensors this model lacks: {sorted(unknown)[:5]}")
            for name, array in source.items():
                if target[name].shape != array.shape:
                    raise ValueError(
                        f"checkpoint tensor '{name}' has shape {array.shape}; "
                        f"the model's is {target[name].shape}"
                    )
                target[name][...] = array
        self.optimizer.load_state_arrays(checkpoint.optimizer)
        self.steps = int(checkpoint.meta.get("steps", 0))

    def export(self, path: str | os.PathLike) -> Graph:
        """Write the trained model as ONNX (the inference graph with the trained weights) and return it."""
        graph = self._inference_graph()
        save_model(graph, path)
        return graph

    def inference_graph(self) -> Graph:
        """The inference graph with the current weights (what ``export`` writes)."""
        return self._inference_graph()


def _info(graph: Graph, name: str) -> TensorInfo:
    value = graph.values[name]
    return TensorInfo(value.shape, value.dtype)


def _correct(scores: np.ndarray, y: np.ndarray) -> int:
    if scores.ndim > 2 and all(d == 1 for d in scores.shape[2:]):
        scores = scores.reshape(scores.shape[:2])
    if y.ndim != 1 or scores.ndim != 2:
        return 0
    return int(np.sum(scores.argmax(axis=1) == y))


def _parse_budget(budget: int | str | None) -> int | None:
    if budget is None:
        return None
    from hetflow.estimate.predict import parse_bytes

    return parse_bytes(budget)
