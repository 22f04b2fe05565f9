"""Project-wide pytest hooks and fixtures: the zoo's temporary home, summary tables that tests report
through ``user_properties``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hetflow.options import HOME_ENV

#: ``user_properties`` key under which tests/test_zoo.py reports (model, batch, mse, max error).
ZOO_MSE_PROPERTY = "zoo_mse"


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Point HETFLOW_HOME at one session temporary directory, so every test module that uses zoo
    models builds each of them once and none touches the user's home."""
    home = tmp_path_factory.mktemp("hetflow_home")
    previous = os.environ.get(HOME_ENV)
    os.environ[HOME_ENV] = str(home)
    yield home
    if previous is None:
        os.environ.pop(HOME_ENV, None)
    else:
        os.environ[HOME_ENV] = previous


#: The cores CI runs the suite on (.ci/run): what ``ci_cores`` makes the process see.
CI_CORES = 2


@pytest.fixture
def ci_cores(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make hetflow see CI's core count (its affinity mask), for tests whose expected numbers scale
    with the cores: per-core workspaces (the direct Conv's, the pools'), BLAS threads, range splits. On
    a 16-core machine those tests would otherwise check other budgets than the ones they were
    written for."""
    cores = set(range(CI_CORES))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores, raising=False)
    return CI_CORES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the zoo models' hetflow-vs-ONNX Runtime errors, one row per model and batch."""
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == ZOO_MSE_PROPERTY and getattr(report, "when", "call") == "call":
                    rows.append(value)
    if not rows:
        return
    terminalreporter.section("zoo: hetflow vs ONNX Runtime")
    terminalreporter.write_line(f"{'model':16s} {'batch':>5s} {'MSE':>12s} {'max|diff|':>12s} {'max|ORT|':>12s}")
    for name, batch, mse, max_error, scale in sorted(rows):
        terminalreporter.write_line(f"{name:16s} {batch:5d} {mse:12.3e} {max_error:12.3e} {scale:12.3e}")
