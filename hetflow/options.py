"""Options and the environment variables that set their defaults (read here and nowhere else)."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming hetflow's data directory (zoo cache, tuning logs, device profiles).
HOME_ENV = "HETFLOW_HOME"
DEFAULT_HOME = Path("~/.cache/hetflow")


def home_dir() -> Path:
    """hetflow's per-user data directory: ``$HETFLOW_HOME`` if set, else ``~/.cache/hetflow``.

    The directory is not created here; writers create the sub-directory they need.
    """
    configured = os.environ.get(HOME_ENV, "").strip()
    return Path(configured).expanduser() if configured else DEFAULT_HOME.expanduser()


#: Environment variable: ``0`` makes OpenCL devices copy between host and device even where they share
#: host memory (the discrete-GPU path, testable on a CPU device); unset or ``1``: the device decides.
OPENCL_UNIFIED_ENV = "HETFLOW_OPENCL_UNIFIED"


def opencl_unified_default() -> bool | None:
    """False when ``$HETFLOW_OPENCL_UNIFIED`` is ``0`` (force copies), else None (the device decides)."""
    configured = os.environ.get(OPENCL_UNIFIED_ENV, "").strip()
    return False if configured == "0" else None
