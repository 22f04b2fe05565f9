"""Fixtures of the estimator tests: one quick calibration per test session, shared by every module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tqdm import tqdm

from hetflow.estimate.calibrate import calibrate
from hetflow.estimate.profile import DeviceProfile


@pytest.fixture(scope="session")
def quick_profile() -> DeviceProfile:
    """A quick calibration of this machine's CPU (a few seconds; never saved to the user's home)."""
    return calibrate("cpu", quick=True, progress=False)


@pytest.fixture(scope="session")
def profile_path(quick_profile: DeviceProfile, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick profile saved as JSON, for what-if runs through ``--device FILE``."""
    return quick_profile.save(tmp_path_factory.mktemp("profiles") / "cpu-quick.json")


@pytest.fixture
def no_bar() -> Iterator[tqdm]:
    """A progress bar that shows nothing, for the calibration's sweeps called directly."""
    with tqdm(disable=True) as bar:
        yield bar
