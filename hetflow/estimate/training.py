"""Training memory before training: weights, gradients, optimizer state and the activations a step keeps.

The numbers come from the trainer's own plan (``hetflow.train``: which activations the ops' backward
rules read, freed by liveness, optionally recomputed under a budget), simulated for the model's shapes at
a batch size, so they are the bytes a training step of ``hetflow.train.Trainer`` measures; nothing runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from hetflow.frontends import ModelSource
from hetflow.graph import Graph

#: Optimizer name -> per-parameter state arrays it keeps.
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes of one training step at ``batch``.

    Attributes:
        weights: every initializer (learnable parameters, BatchNormalization statistics, constants).
        gradients: the learnable parameters' gradients (one per trainable parameter).
        optimizer_state: the optimizer's per-parameter state (momentum, Adam's moments).
        activations: activations kept for the backward pass, at the step's peak.
        activation_gradients: gradients of activations (and of the parameters done so far) at the peak.
        scratch: the running kernel's or backward rule's temporaries at the peak (im2col columns...).
        step_peak: ``activations + activation_gradients + scratch``: a bound on the step's transient peak
            (checked against tracemalloc in the tests).
        tensors_peak: the peak of the activations and gradients alone, which ``Tape.peak_bytes`` measures.
        total: ``weights + optimizer_state + step_peak``: what a step holds at its peak.
        recomputed_total: ``total`` when every cheap activation is recomputed (checkpointing), the
            least a ``memory_budget`` can force.
    """

    model: str
    batch: int
    optimizer: str
    parameters: int
    weights: int
    gradients: int
    optimizer_state: int
    activations: int
    activation_gradients: int
    scratch: int
    step_peak: int
    tensors_peak: int
    total: int
    recomputed_total: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def table(self) -> str:
        rows = [
            ("weights", self.weights),
            ("gradients (parameters)", self.gradients),
            (f"optimizer state ({self.optimizer})", self.optimizer_state),
            ("activations kept for backward (at peak)", self.activations),
            ("gradients in flight (at peak)", self.activation_gradients),
            ("kernel / rule scratch (at peak)", self.scratch),
            ("total at the step's peak", self.total),
            ("total with checkpointing (recompute cheap activations)", self.recomputed_total),
        ]
        width = max(len(label) for label, _ in rows)
        lines = [f"training memory of {self.model} at batch {self.batch} ({self.parameters:,} parameters)"]
        lines += [f"  {label:<{width}}  {_size(value):>10}" for label, value in rows]
        return "\n".join(lines) + "\n"


def _size(count: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def training_memory(model: ModelSource | Graph, batch: int, optimizer: str = "adam") -> TrainingMemory:
    """Predict the memory of training ``model`` at ``batch`` with ``optimizer`` (sgd, momentum, adam, adamw).

    Raises:
        ValueError: an unknown optimizer or a batch below 1.
        TrainingError: the model has an op without a backward rule on its gradient path.
    """
    from hetflow.train import SGD, Adam, Trainer

    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"unknown optimizer {optimizer!r}; known: {', '.join(OPTIMIZER_SLOTS)}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1; got {batch}")
    chosen = {"sgd": SGD(0.01), "momentum": SGD(0.01, momentum=0.9)}.get(optimizer, Adam())
    trainer = Trainer(model, optimizer=chosen)
    tape = trainer.tape
    sizes = trainer.value_sizes(batch)
    running = list(trainer.training.running)
    scratch = trainer.scratch_bytes(batch)
    step = tape.simulate(sizes, running, recompute=(), scratch=scratch)
    tensors = tape.simulate(sizes, running, recompute=())
    least = tape.simulate(sizes, running, recompute=tape.recompute_candidates(), scratch=scratch)
    parameter_bytes = sum(trainer.params[name].nbytes for name in trainer.trainable)
    weights = sum(array.nbytes for array in trainer.training.graph.initializers.values())
    state = OPTIMIZER_SLOTS[optimizer] * parameter_bytes
    name = model if isinstance(model, str) else trainer.graph.name
    return TrainingMemory(
        model=str(name),
        batch=batch,
        optimizer=optimizer,
        parameters=sum(trainer.params[n].size for n in trainer.trainable),
        weights=weights,
        gradients=parameter_bytes,
        optimizer_state=state,
        activations=step.activations_at_peak,
        activation_gradients=step.gradients_at_peak,
        scratch=step.scratch_at_peak,
        step_peak=step.peak,
        tensors_peak=tensors.peak,
        total=weights + state + step.peak,
        recomputed_total=weights + state + least.peak,
    )
