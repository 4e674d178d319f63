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


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print how many inputs each fuzz target tried (tests/fuzzcount.py collects them)."""
    from fuzzcount import OUTCOMES, TRIED

    for target, n in sorted(TRIED.items()):
        how = ", ".join(f"{k} {v}" for k, v in sorted(OUTCOMES.get(target, {}).items()))
        terminalreporter.write_line(f"fuzz: {target}: {n} inputs tried" + (f" ({how})" if how else ""))
