"""quickstart.ipynb run through JupyterLab's UI in chromium: the graph text shows, no console errors."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import nbformat
from conftest import NotebookRun
from testenv import NOTEBOOKS_DIR


def _expected_stdout(name: str) -> str:
    """What the notebook's code cells print, run here in-process (the measured expectation)."""
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    out = io.StringIO()
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        for cell in nb.cells:
            if cell.cell_type == "code":
                exec(compile(cell.source, name, "exec"), namespace)
    return out.getvalue()


def test_quickstart_runs_in_jupyterlab(run_notebook: Callable[[str], NotebookRun]) -> None:
    expected = [ln.strip() for ln in _expected_stdout("quickstart.ipynb").splitlines() if ln.strip()]
    assert any(ln.startswith("graph: ") for ln in expected)
    run = run_notebook("quickstart.ipynb")
    shown = {ln.strip() for ln in run.output_text().splitlines()}
    missing = [ln for ln in expected if ln not in shown]
    assert missing == [], f"not shown in the page: {missing}; screenshots: {run.screenshots}"
    assert run.console_errors == []
