"""Ready training recipes: what ``hetflow train`` and the ``zoo:lenet-digits`` demo run."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from hetflow.frontends import ModelSource
from hetflow.graph import Graph
from hetflow.train.data import Dataset, load_dataset, random_shift
from hetflow.train.loop import EpochStats, History, Trainer
from hetflow.train.optim import Adam, cosine

#: LeNet on the digits: 8 epochs of Adam (2e-3, cosine decay) at batch 32 with +-2 pixel shifts reach
#: 98% test accuracy (97% by epoch 4 or 5), about 2 s per epoch on 2 idle cores.
DIGITS_EPOCHS = 8
DIGITS_BATCH = 32
DIGITS_LR = 2e-3


@dataclass
class RecipeResult:
    """A finished training run."""

    trainer: Trainer
    history: History
    dataset: Dataset
    seconds: float
    test_accuracy: float


def train_classifier(
    model: ModelSource | Graph,
    data: str = "digits",
    epochs: int = DIGITS_EPOCHS,
    batch_size: int = DIGITS_BATCH,
    lr: float = DIGITS_LR,
    seed: int = 0,
    progress: bool | None = None,
    on_epoch: Callable[[EpochStats], None] | None = None,
    device: str = "cpu",
) -> RecipeResult:
    """Train ``model`` from its current weights on data set ``data`` (Adam, cosine decay, random shifts)
    on ``device`` (see ``Trainer``) and measure its test accuracy.

    ``seconds`` covers the training epochs only (not loading the data or the final evaluation).
    """
    dataset = load_dataset(data, seed=seed)
    steps = epochs * -(-len(dataset.x_train) // batch_size)
    trainer = Trainer(model, optimizer=Adam(lr, schedule=cosine(steps)), device=device, seed=seed)
    started = time.perf_counter()
    history = trainer.fit(
        dataset.x_train,
        dataset.y_train,
        epochs=epochs,
        batch_size=batch_size,
        progress=progress,
        on_epoch=on_epoch,
        augment=random_shift,
    )
    seconds = time.perf_counter() - started
    accuracy = trainer.evaluate(dataset.x_test, dataset.y_test)["accuracy"]
    return RecipeResult(trainer, history, dataset, seconds, accuracy)
