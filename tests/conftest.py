"""Shared fixtures. Paths and the CI switch live in testenv.py (tests/ is on pytest's pythonpath)."""

from __future__ import annotations

from pathlib import Path

import pytest
from testenv import ARTIFACTS_DIR


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """test-artifacts/ at the repository root (screenshots, server logs); ignored by git."""
    ARTIFACTS_DIR.mkdir(exist_ok=True)
    return ARTIFACTS_DIR
