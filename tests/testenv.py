"""Where the tests find things, and the CI switch (CI=true turns missing-tool skips into failures)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"


def in_ci() -> bool:
    """CI=true (or 1/yes)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(condition: bool, why: str) -> None:
    """Skip locally, fail under CI, when something a test needs is missing."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{why} (required because CI=true)", pytrace=False)
    pytest.skip(why)
