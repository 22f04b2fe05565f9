"""Training losses with their backward rules: a fused, numerically stable softmax cross-entropy and
the mean squared error.

Losses are not graph nodes (inference models do not contain them), so they live in their own small
registry, ``LOSSES``, which the trainer and the gradient checks read; like the ops' rules, each one
gives its value and the gradient with respect to its scores in one call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LossResult:
    """A loss value and its gradient with respect to the scores it was given."""

    value: float
    grad: np.ndarray


def softmax_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> LossResult:
    """Mean over the batch of ``-log softmax(logits)[target]``, fused with its gradient.

    Computed from ``logits - max`` and a log-sum-exp, so no exponential overflows and no probability's
    logarithm is taken; the gradient is ``(softmax - onehot) / N``, never through a separate Softmax.

    Args:
        logits: ``[N, K]`` scores.
        targets: ``[N]`` integer class indices, or ``[N, K]`` target probabilities (e.g. one-hot).
    """
    if logits.ndim > 2 and all(d == 1 for d in logits.shape[2:]):
        # Classifiers that end in a 1x1 conv + global pool (SqueezeNet, DenseNet) give [N, K, 1, 1].
        flat = softmax_cross_entropy(logits.reshape(logits.shape[:2]), targets)
        return LossResult(flat.value, flat.grad.reshape(logits.shape))
    if logits.ndim != 2:
        raise ValueError(f"softmax cross-entropy needs [N, K] logits; got shape {list(logits.shape)}")
    batch = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    log_probs = shifted - log_sum
    probs = np.exp(log_probs)
    if targets.ndim == 1:
        labels = targets.astype(np.int64, copy=False)
        if labels.min(initial=0) < 0 or labels.max(initial=0) >= logits.shape[1]:
            raise ValueError(
                f"class labels must lie in [0, {logits.shape[1]}); got {labels.min()}..{labels.max()}"
            )
        value = -float(log_probs[np.arange(batch), labels].mean())
        grad = probs
        grad[np.arange(batch), labels] -= 1.0
    else:
        if targets.shape != logits.shape:
            raise ValueError(
                f"target probabilities {list(targets.shape)} must match logits {list(logits.shape)}"
            )
        value = -float((targets * log_probs).sum(axis=1).mean())
        grad = probs * targets.sum(axis=1, keepdims=True) - targets
    return LossResult(value, (grad / batch).astype(logits.dtype, copy=False))


def mean_squared_error(predictions: np.ndarray, targets: np.ndarray) -> LossResult:
    """``mean((predictions - targets) ** 2)`` over every element, and its gradient."""
    if predictions.shape != targets.shape:
        raise ValueError(f"targets {list(targets.shape)} must match predictions {list(predictions.shape)}")
    difference = predictions - targets.astype(predictions.dtype, copy=False)
    grad = (2.0 / difference.size) * difference
    return LossResult(float(np.mean(difference * difference)), grad.astype(predictions.dtype, copy=False))


#: Loss name -> function(scores, targets) -> LossResult.
LOSSES: dict[str, Callable[[np.ndarray, np.ndarray], LossResult]] = {
    "cross_entropy": softmax_cross_entropy,
    "mse": mean_squared_error,
}
#: Losses that read class scores before any Softmax: the trainer feeds them the Softmax's input.
READS_LOGITS = frozenset({"cross_entropy"})


def get_loss(name: str) -> Callable[[np.ndarray, np.ndarray], LossResult]:
    """The loss called ``name``; raises ValueError listing the known ones."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; known: {', '.join(sorted(LOSSES))}") from None
