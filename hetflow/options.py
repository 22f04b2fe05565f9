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
