"""Checkpoints without pickle: one ``.npz`` of plain arrays plus a JSON header stored as text.

Layout of the archive: ``param/<name>`` (learnable parameters), ``buffer/<name>`` (BatchNormalization
running statistics), ``optim/<key>`` (optimizer state, see ``Optimizer.state_arrays``) and ``meta``, a
0-d unicode array holding JSON (epoch, step, loss name...). It is read back with
``allow_pickle=False``, so loading a checkpoint never executes anything.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    """What a checkpoint holds."""

    params: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def save_checkpoint(path: str | os.PathLike, checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` to ``path`` (an ``.npz``; numpy adds the suffix when it is missing)."""
    arrays: dict[str, np.ndarray] = {}
    for prefix, group in (
        ("param", checkpoint.params),
        ("buffer", checkpoint.buffers),
        ("optim", checkpoint.optimizer),
    ):
        for name, array in group.items():
            arrays[f"{prefix}/{name}"] = np.asarray(array)
    meta = dict(checkpoint.meta, format_version=FORMAT_VERSION)
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez(path, **arrays)


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by ``save_checkpoint`` (no pickle: object arrays are refused)."""
    with np.load(path, allow_pickle=False) as archive:
        groups: dict[str, dict[str, np.ndarray]] = {"param": {}, "buffer": {}, "optim": {}}
        meta: Mapping[str, Any] = {}
        for key in archive.files:
            if key == "meta":
                meta = json.loads(str(archive[key]))
                continue
            prefix, _, name = key.partition("/")
            if prefix not in groups:
                raise ValueError(f"{os.fspath(path)}: unexpected entry '{key}' in a checkpoint")
            groups[prefix][name] = archive[key]
    if meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{os.fspath(path)}: checkpoint format {meta.get('format_version')} is not {FORMAT_VERSION}"
        )
    return Checkpoint(groups["param"], groups["buffer"], groups["optim"], dict(meta))
