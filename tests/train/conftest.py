"""Every training test that loads ``zoo:`` models uses the session's temporary HETFLOW_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _train_zoo_home(zoo_home: Path) -> Path:
    return zoo_home
