"""Every notebook under notebooks/ runs top to bottom in a fresh kernel, within a time limit."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from testenv import NOTEBOOKS_DIR

CELL_TIMEOUT_S = 300  # one cell (a JAX compile on 2 cores is the slow case)
NOTEBOOK_TIMEOUT_S = 600  # the whole notebook

NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert any(p.name == "quickstart.ipynb" for p in NOTEBOOKS)


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a private Jupyter data/runtime dir: the kernel is this interpreter's ipykernel, not a
    # user-level "python3" kernelspec that may point at another Python
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "jupyter-runtime"))
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(path, work / path.name)
    nb = nbformat.read(work / path.name, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(work)}}
    )
    t0 = time.monotonic()
    client.execute()  # raises CellExecutionError naming the failing cell
    elapsed = time.monotonic() - t0
    assert elapsed < NOTEBOOK_TIMEOUT_S, f"{path.name} took {elapsed:.0f} s, limit {NOTEBOOK_TIMEOUT_S} s"
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert errors == []
