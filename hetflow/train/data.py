"""Real data sets for training demos and tests.

``digits``: scikit-learn's handwritten digits (1,797 8x8 grey images of 0-9, shipped inside the
package, no download), scaled to [0, 1] and brought to LeNet's 1x28x28 input: each pixel becomes a 3x3
block (24x24), centred with a 2-pixel border, as MNIST centres its digits in a 28x28 frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Data sets ``load_dataset`` knows.
DATASETS = ("digits",)


@dataclass(frozen=True)
class Dataset:
    """A train/test split of images ``[N, C, H, W]`` (float32) and integer labels ``[N]``."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def digits_to_28(images: np.ndarray) -> np.ndarray:
    """``[N, 8, 8]`` digit images (0..16) -> ``[N, 1, 28, 28]`` float32 in [0, 1]."""
    scaled = np.asarray(images, np.float32) / np.float32(16.0)
    upsampled = scaled.repeat(3, axis=1).repeat(3, axis=2)
    framed = np.zeros((len(images), 1, 28, 28), np.float32)
    framed[:, 0, 2:26, 2:26] = upsampled
    return framed


def load_digits(test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """scikit-learn's digits, split per class (stratified) into train and test with ``seed``.

    Raises:
        ImportError: scikit-learn is missing (``pip install hetflow[train]``).
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as error:
        raise ImportError("the digits data set needs scikit-learn: pip install 'hetflow[train]'") from error
    bunch = sklearn_digits()
    x = digits_to_28(bunch.images)
    y = bunch.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        test[members[: round(len(members) * test_fraction)]] = True
    return Dataset("digits", x[~test], y[~test], x[test], y[test])


def load_dataset(name: str, seed: int = 0) -> Dataset:
    """A data set by name (see ``DATASETS``)."""
    if name == "digits":
        return load_digits(seed=seed)
    raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")


def random_shift(images: np.ndarray, rng: np.random.Generator, pixels: int = 2) -> np.ndarray:
    """Each image moved by a random whole-pixel offset in ``[-pixels, pixels]`` on both spatial axes
    (zeros shifted in): cheap augmentation against the few hundred digits per class overfitting."""
    shifted = np.zeros_like(images)
    height, width = images.shape[-2:]
    offsets = rng.integers(-pixels, pixels + 1, size=(len(images), 2))
    for i, (dy, dx) in enumerate(offsets):
        source = images[i, ..., max(0, -dy) : height - max(0, dy), max(0, -dx) : width - max(0, dx)]
        shifted[
            i, ..., max(0, dy) : max(0, dy) + source.shape[-2], max(0, dx) : max(0, dx) + source.shape[-1]
        ] = source
    return shifted
