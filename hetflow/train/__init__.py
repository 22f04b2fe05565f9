"""Training on the Graph hetflow runs: the ops' backward rules, losses, optimizers, a training loop,
pickle-free checkpoints and ONNX export; on the CPU or, with ``device="opencl:0"``, on an OpenCL device
(forward and backward kernels, loss and optimizer updates there; see ``hetflow.train.device``).

Example::

    from hetflow.train import Trainer, SGD, cosine
    trainer = Trainer("zoo:lenet", loss="cross_entropy", optimizer=SGD(0.05, momentum=0.9))
    trainer.fit(x, y, epochs=5, batch_size=64, validation=(x_test, y_test))
    trainer.export("trained.onnx")
"""

from hetflow.train.autograd import Tape, TrainingError
from hetflow.train.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from hetflow.train.loop import EpochStats, History, Trainer
from hetflow.train.optim import (
    SGD,
    Adam,
    AdamW,
    Optimizer,
    clip_by_global_norm,
    cosine,
    make_optimizer,
    step_decay,
)

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Checkpoint",
    "EpochStats",
    "History",
    "Optimizer",
    "Tape",
    "Trainer",
    "TrainingError",
    "clip_by_global_norm",
    "cosine",
    "load_checkpoint",
    "make_optimizer",
    "save_checkpoint",
    "step_decay",
]
