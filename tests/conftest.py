"""Shared fixtures: real LOBSTER data location, device selection, GPU marker handling."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOBSTER_DIR = REPO_ROOT.parent / "shared" / "data" / "lobster"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests when no CUDA device is present (CI is CPU-only)."""
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def lobster_dir() -> Path:
    """Folder holding the real GOOG LOBSTER sample files.

    Taken from ``FOXHUNT_LOBSTER_DIR`` (CI sets it), else ``../shared/data/lobster``.
    When CI asked for real data and it is missing, the test fails rather than skips.
    """
    env = os.environ.get("FOXHUNT_LOBSTER_DIR")
    path = Path(env) if env else DEFAULT_LOBSTER_DIR
    if not any(path.glob("*_message_*.csv")) if path.is_dir() else True:
        if env or os.environ.get("CI"):
            pytest.fail(f"FOXHUNT_LOBSTER_DIR={path} holds no LOBSTER files, but real-data tests must run")
        pytest.skip(f"no LOBSTER data at {path}")
    return path
