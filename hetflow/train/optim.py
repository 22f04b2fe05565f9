"""Optimizers, learning-rate schedules and gradient clipping.

An optimizer updates parameter arrays in place from their gradients, keyed by parameter name; its
state (momentum buffers, Adam moments, the step count) is a flat dict of arrays so that checkpoints
store it without pickle.

Given a device's training kernels (``step(..., kernels=)``), an optimizer whose ``rule`` the device has
(``"sgd"``, ``"adam"``) runs each float32 update there (``device_update``), on the same host arrays and
state, so checkpoints and the numpy path read the same values; everything else updates with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from hetflow.train.device import TrainingKernels

#: step (0-based) -> multiplier of the base learning rate.
Schedule = Callable[[int], float]


def constant() -> Schedule:
    """The base learning rate at every step."""
    return lambda step: 1.0


def step_decay(step_size: int, gamma: float = 0.1) -> Schedule:
    """Multiply the rate by ``gamma`` every ``step_size`` steps."""
    if step_size < 1:
        raise ValueError(f"step_size must be >= 1; got {step_size}")
    return lambda step: gamma ** (step // step_size)


def cosine(total_steps: int, warmup: int = 0, floor: float = 0.0) -> Schedule:
    """Linear warm-up over ``warmup`` steps, then a half cosine from 1 to ``floor`` at ``total_steps``."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1; got {total_steps}")

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def clip_by_global_norm(grads: Mapping[str, np.ndarray], max_norm: float) -> float:
    """Scale every gradient in place so that their joint L2 norm is at most ``max_norm``.

    Returns:
        The norm before clipping.
    """
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if total > max_norm > 0:
        scale = max_norm / (total + 1e-12)
        for g in grads.values():
            g *= scale
    return total


class Optimizer:
    """Base: learning rate with a schedule, optional gradient clipping, per-parameter state.

    Args:
        lr: the base learning rate.
        schedule: multiplier of ``lr`` per step (``constant()`` by default).
        clip_norm: clip gradients to this global L2 norm before the update (None: no clipping).
        weight_decay: L2 penalty coefficient (how it is applied depends on the optimizer).
    """

    def __init__(
        self,
        lr: float,
        *,
        schedule: Schedule | None = None,
        clip_norm: float | None = None,
        weight_decay: float = 0.0,
    ):
        if lr <= 0:
            raise ValueError(f"learning rate must be positive; got {lr}")
        self.lr = lr
        self.schedule = schedule or constant()
        self.clip_norm = clip_norm
        self.weight_decay = weight_decay
        self.steps = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}

    #: Arrays of a parameter's size the optimizer keeps per parameter (momentum, moments).
    @property
    def state_slots(self) -> int:
        return 0

    @property
    def current_lr(self) -> float:
        """The learning rate the next step uses."""
        return self.lr * self.schedule(self.steps)

    #: The name of the device update kernel implementing this optimizer (``TrainingKernels.updates``),
    #: or None for numpy only.
    rule: ClassVar[str | None] = None

    def step(
        self,
        params: Mapping[str, np.ndarray],
        grads: Mapping[str, np.ndarray],
        kernels: TrainingKernels | None = None,
    ) -> None:
        """Update each parameter that has a gradient, in place.

        Args:
            kernels: a device's training kernels; float32 parameters are updated by its kernel for
                ``rule`` when it has one (gradient clipping stays on the host).
        """
        if self.clip_norm is not None:
            clip_by_global_norm(grads, self.clip_norm)
        lr = self.current_lr
        self.steps += 1
        device_kernel = kernels.updates.get(self.rule) if kernels is not None and self.rule else None
        for name, grad in grads.items():
            param = params[name]
            state = self.state.setdefault(name, {})
            grad = grad.astype(param.dtype, copy=False)
            if device_kernel is not None and param.dtype == np.float32 and param.flags.c_contiguous:
                assert kernels is not None
                self.device_update(device_kernel, kernels, param, grad, lr, state)
            else:
                self.update(name, param, grad, lr, state)

    def update(
        self, name: str, param: np.ndarray, grad: np.ndarray, lr: float, state: dict[str, np.ndarray]
    ) -> None:
        """The numpy update of one parameter, in place."""
        raise NotImplementedError

    def device_update(
        self,
        kernel: Callable[..., None],
        kernels: TrainingKernels,
        param: np.ndarray,
        grad: np.ndarray,
        lr: float,
        state: dict[str, np.ndarray],
    ) -> None:
        """The same update through a device ``kernel`` (state allocated with ``kernels.zeros_like``)."""
        raise NotImplementedError

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The state as ``{"<param>/<slot>": array, "__steps__": array}`` (for checkpoints)."""
        arrays = {
            f"{name}/{slot}": value for name, slots in self.state.items() for slot, value in slots.items()
        }
        arrays["__steps__"] = np.array(self.steps, np.int64)
        return arrays

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Restore what ``state_arrays`` returned."""
        self.state = {}
        for key, value in arrays.items():
            if key == "__steps__":
                self.steps = int(value)
                continue
            name, _, slot = key.rpartition("/")
            self.state.setdefault(name, {})[slot] = np.array(value)


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and L2 weight decay.

    ``v = momentum v + g + wd p``; ``p -= lr v`` (Nesterov: ``p -= lr (g + wd p + momentum v)``).
    """

    rule = "sgd"

    def __init__(self, lr: float = 0.01, *, momentum: float = 0.0, nesterov: bool = False, **options):
        super().__init__(lr, **options)
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        self.momentum = momentum
        self.nesterov = nesterov

    @property
    def state_slots(self) -> int:
        return 1 if self.momentum else 0

    def device_update(self, kernel, kernels, param, grad, lr, state) -> None:
        velocity = None
        if self.momentum:
            # NOTE: a zero velocity makes the first step's ``momentum * 0 + g`` the numpy path's copy of g.
            velocity = state.get("velocity")
            if velocity is None:
                velocity = state["velocity"] = kernels.zeros_like(param)
        kernel(
            param, grad, velocity, lr=lr, momentum=self.momentum, nesterov=self.nesterov,
            weight_decay=self.weight_decay,
        )  # fmt: skip

    def update(self, name, param, grad, lr, state) -> None:
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        if self.momentum:
            velocity = state.get("velocity")
            if velocity is None:
                velocity = state["velocity"] = grad.copy()
            else:
                velocity *= self.momentum
                velocity += grad
            grad = grad + self.momentum * velocity if self.nesterov else velocity
        param -= lr * grad


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; ``weight_decay`` adds an L2 term to the gradient."""

    rule = "adam"
    decoupled = False

    def __init__(
        self, lr: float = 1e-3, *, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, **options
    ):
        super().__init__(lr, **options)
        self.betas = betas
        self.eps = eps

    @property
    def state_slots(self) -> int:
        return 2

    def _advance(self, state: dict[str, np.ndarray], zeros_like: Callable[[np.ndarray], np.ndarray],
                 param: np.ndarray, lr: float) -> float:
        """Create the moments on the first step, count the step; returns the bias-corrected step size."""
        if "m" not in state:
            state["m"] = zeros_like(param)
            state["v"] = zeros_like(param)
            state["t"] = np.zeros((), np.int64)
        state["t"] += 1
        t = int(state["t"])
        beta1, beta2 = self.betas
        return lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)

    def device_update(self, kernel, kernels, param, grad, lr, state) -> None:
        step = self._advance(state, kernels.zeros_like, param, lr)
        kernel(
            param, grad, state["m"], state["v"], lr=lr, step=step, beta1=self.betas[0],
            beta2=self.betas[1], eps=self.eps, weight_decay=self.weight_decay, decoupled=self.decoupled,
        )  # fmt: skip

    def update(self, name, param, grad, lr, state) -> None:
        beta1, beta2 = self.betas
        if self.weight_decay and not self.decoupled:
            grad = grad + self.weight_decay * param
        step = self._advance(state, np.zeros_like, param, lr)
        m, v = state["m"], state["v"]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * grad * grad
        if self.weight_decay and self.decoupled:
            param -= lr * self.weight_decay * param
        param -= step * m / (np.sqrt(v) + self.eps)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): ``p -= lr wd p`` apart from the gradient."""

    decoupled = True

    def __init__(self, lr: float = 1e-3, *, weight_decay: float = 0.01, **options):
        super().__init__(lr, weight_decay=weight_decay, **options)


OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam, "adamw": AdamW}


def make_optimizer(name: str, **options) -> Optimizer:
    """An optimizer by name (``sgd``, ``adam``, ``adamw``)."""
    try:
        cls = OPTIMIZERS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}") from None
    return cls(**options)
