"""`make lab` as a newcomer meets it: the printed URL opens quickstart.ipynb with a running kernel.

The server is started with the command `make lab` runs (``python -m toolkit.lab`` plus LAB_ARGS,
from the repository root) in a copy of the repository's notebooks and README, with private
Jupyter dirs. The test reads the URL the command prints, opens exactly that URL in chromium,
runs the notebook from the Run menu and finds the dashboard's badge; the file browser lists the
repository root (README.md and notebooks/).
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from conftest import CHROMIUM, _free_port, isolated_lab_env, run_all_cells, stop, wait_ready
from testenv import NOTEBOOKS_DIR, REPO_ROOT

URL_RE = re.compile(r"JupyterLab: (http://127\.0\.0\.1:(\d+)/lab/tree/(\S+)\?token=(\w+))")


def _makefile_lab_recipe() -> str:
    text = (REPO_ROOT / "Makefile").read_text()
    m = re.search(r"^lab:.*\n((?:\t.*\n)+)", text, re.M)
    assert m, "Makefile has no lab target"
    return m.group(1)


def test_makefile_lab_runs_toolkit_lab() -> None:
    # the browser test below starts `python -m toolkit.lab $(LAB_ARGS)`: make sure that is the recipe
    recipe = _makefile_lab_recipe()
    assert "$(PY) -m toolkit.lab $(LAB_ARGS)" in recipe, recipe


def _read_url(proc: subprocess.Popen[str], log: Path, timeout_s: float = 60) -> re.Match[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        with log.open("w") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                raise AssertionError(f"toolkit.lab exited with {proc.returncode}: {log.read_text()}") from None
            continue
        m = URL_RE.search(line)
        if m:
            return m
    raise AssertionError(f"no URL printed within {timeout_s} s: {log.read_text()}")


def test_make_lab_url_opens_quickstart(chromium: Any, artifacts_dir: Path, tmp_path: Path) -> None:
    assert os.access(CHROMIUM, os.X_OK)
    repo = tmp_path / "repo"
    shutil.copytree(NOTEBOOKS_DIR, repo / "notebooks", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    shutil.copy(REPO_ROOT / "README.md", repo / "README.md")
    env, settings = isolated_lab_env(tmp_path)
    env["LAB_PORT"] = str(_free_port())
    lab_args = ["--no-browser", f"--LabApp.app_settings_dir={settings}"]
    log = artifacts_dir / "make-lab.log"
    proc = subprocess.Popen([sys.executable, "-m", "toolkit.lab", *lab_args], cwd=repo, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        m = _read_url(proc, log)
        url, port, path, token = m.group(1), m.group(2), m.group(3), m.group(4)
        assert port == env["LAB_PORT"] and path == "notebooks/quickstart.ipynb"
        wait_ready(proc, f"http://127.0.0.1:{port}", token, log)

        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))

        def shot(label: str) -> None:
            page.screenshot(path=str(artifacts_dir / f"make-lab-{label}.png"), full_page=True)

        def output_text() -> str:
            return "\n".join(page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").all_inner_texts())

        try:
            page.goto(url, timeout=120_000)
            run_all_cells(page, path, 300, shot, output_text)
            body = page.inner_text("body")
            assert "Could not find path" not in body
            # the notebook's own tab, and the dashboard it draws
            assert page.locator(".lm-TabBar-tabLabel", has_text="quickstart.ipynb").count() >= 1
            assert page.locator(".jp-NotebookPanel:visible .toolkit-badge").count() >= 1, output_text()
            # the server's root is the repository: its file browser lists README.md and notebooks/
            listing = page.evaluate(
                "async (t) => (await (await fetch('/api/contents/?token=' + t)).json()).content.map(c => c.name)",
                token)
            assert "README.md" in listing and "notebooks" in listing, listing
            page.goto(f"http://127.0.0.1:{port}/lab/tree/README.md?token={token}")
            page.wait_for_selector(".jp-FileEditor, .jp-RenderedMarkdown", timeout=60_000)
        except Exception:
            shot("failed")
            raise
        finally:
            context.close()
        assert not [e for e in errors if "favicon" not in e], errors
    finally:
        stop(proc)
