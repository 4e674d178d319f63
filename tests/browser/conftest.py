"""JupyterLab + chromium harness for the browser tests.

- ``jupyter_lab``: a JupyterLab server on a free 127.0.0.1 port, in a temporary workdir holding
  a copy of notebooks/, with a token, no browser, private Jupyter dirs, and the news popup
  turned off by a settings override. Yields a :class:`LabServer` once ``/api/status`` answers.
- ``chromium``: Debian's chromium (/usr/bin/chromium) launched through playwright.
- ``run_notebook``: opens a notebook in a new page, runs all cells from the Run menu, waits
  for every cell to finish and the kernel to be idle, and returns a :class:`NotebookRun`
  with the page's output text, console errors and screenshots under test-artifacts/.

Every browser test is marked ``browser``. A missing chromium or playwright skips it locally
and fails it under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from testenv import NOTEBOOKS_DIR, require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SERVER_START_TIMEOUT_S = 120
NOTEBOOK_TIMEOUT_S = float(os.environ.get("TOOLKIT_NOTEBOOK_TIMEOUT_S", "300"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


# ---- the server -----------------------------------------------------------------------

@dataclass(frozen=True)
class LabServer:
    url: str  # http://127.0.0.1:<port>
    token: str
    workdir: Path  # the server's root_dir, holding a copy of notebooks/*.ipynb
    log: Path

    def page_url(self, path: str, workspace: str | None = None) -> str:
        """The notebook's URL; with ``workspace``, in that JupyterLab workspace, reset first (no tabs
        restored from an earlier page: "Run All" then acts on this notebook alone)."""
        if workspace is None:
            return f"{self.url}/lab/tree/{path}?token={self.token}"
        return f"{self.url}/lab/workspaces/{workspace}/tree/{path}?token={self.token}&reset"

    def shutdown_sessions(self) -> None:
        """End every kernel session, so a notebook opened next starts a fresh kernel (widget models
        of an earlier run would otherwise be restored into the new page)."""
        import urllib.request

        def call(method: str, path: str) -> bytes:
            req = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
            with urllib.request.urlopen(req, timeout=30) as r:
                return bytes(r.read())

        for sess in json.loads(call("GET", "/api/sessions")):
            call("DELETE", f"/api/sessions/{sess['id']}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def isolated_lab_env(root: Path) -> tuple[dict[str, str], Path]:
    """Private Jupyter dirs under ``root`` and an app-settings dir for ``--LabApp.app_settings_dir``.

    The settings turn off "Would you like to receive official Jupyter news?" (it would cover the
    page) and the update check, and render every cell (JupyterLab's windowing empties the prompts
    of cells scrolled out of view, which the Run All loop reads)."""
    settings = root / "app-settings"
    settings.mkdir()
    (settings / "overrides.json").write_text(json.dumps({
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
        "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
    }))
    env = dict(os.environ)
    for var, sub in [
        ("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "user-settings"), ("JUPYTERLAB_WORKSPACES_DIR", "workspaces"),
    ]:
        env[var] = str(root / sub)
    return env, settings


def wait_ready(proc: subprocess.Popen[Any], url: str, token: str, log: Path) -> None:
    """Wait until the server at ``url`` answers ``/api/status`` (fail with its log if it exits)."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{_tail(log)}", pytrace=False)
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"jupyter lab not ready after {SERVER_START_TIMEOUT_S} s:\n{_tail(log)}", pytrace=False)
        time.sleep(0.5)


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def jupyter_lab(tmp_path_factory: pytest.TempPathFactory, artifacts_dir: Path) -> Iterator[LabServer]:
    root = tmp_path_factory.mktemp("lab")
    workdir = root / "work"
    shutil.copytree(NOTEBOOKS_DIR, workdir, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    env, settings = isolated_lab_env(root)
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser",
        "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}",
        f"--LabApp.app_settings_dir={settings}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = artifacts_dir / "jupyter-lab.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = LabServer(url=f"http://127.0.0.1:{port}", token=token, workdir=workdir, log=log)
    try:
        wait_ready(proc, server.url, token, log)
        yield server
    finally:
        stop(proc)


# ---- the browser ----------------------------------------------------------------------

@pytest.fixture(scope="session")
def chromium() -> Iterator[Any]:
    require(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} not found (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright is not installed (pip install -e '.[dev]')")
        raise
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# ---- running a notebook in the page ----------------------------------------------------

@dataclass
class NotebookRun:
    page: Any  # playwright Page, left open until the test ends
    console_errors: list[str] = field(default_factory=list)
    screenshots: list[Path] = field(default_factory=list)

    def output_text(self) -> str:
        """The text of every cell's output area, in cell order."""
        return "\n".join(self.page.locator(".jp-NotebookPanel:visible .jp-OutputArea-output").all_inner_texts())


_PROMPT_DONE = re.compile(r"^\[\d+\]:$")


def _code_cell_prompts(page: Any) -> list[str]:
    prompts = page.locator(".jp-NotebookPanel:visible .jp-CodeCell .jp-InputArea-prompt").all_inner_texts()
    return [p.strip() for p in prompts]


# The visible notebook's toolbar names a started kernel and its execution indicator reads idle.
# (Before the session starts the indicator also says idle, next to "No Kernel".)
_KERNEL_IDLE_JS = """() => {
    const panel = [...document.querySelectorAll('.jp-NotebookPanel')].find(e => e.offsetParent !== null);
    if (!panel || !panel.querySelector('.jp-Cell')) return false;
    const name = panel.querySelector('.jp-KernelName');
    const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
    return !!name && !/No Kernel/i.test(name.textContent || '') && !!indicator
        && indicator.getAttribute('data-status') === 'idle';
}"""


def _wait_kernel_idle(page: Any, timeout_s: float) -> None:
    page.wait_for_function(_KERNEL_IDLE_JS, timeout=timeout_s * 1000, polling=250)


def _accept_kernel_dialog(page: Any) -> None:
    """JupyterLab asks which kernel to start when a run finds none: take the preferred one."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    if dialog.count():
        dialog.locator(".jp-mod-accept").click()


def run_all_cells(page: Any, name: str, timeout_s: float, shot: Callable[[str], None],
                  output_text: Callable[[], str]) -> None:
    """In a page showing notebook ``name``: wait for its kernel, Run All Cells from the Run menu,
    and wait until every code cell has run and the kernel is idle again."""
    _wait_kernel_idle(page, timeout_s)
    shot("opened")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline = time.monotonic() + timeout_s
    stalled_since = 0.0
    while True:
        _accept_kernel_dialog(page)
        prompts = _code_cell_prompts(page)
        if prompts and all(_PROMPT_DONE.match(p) for p in prompts):
            break
        # Run All queues every cell ([*]) and drops the rest after a cell raises: idle with
        # unrun cells for a few seconds means it stopped
        if "[*]:" not in prompts and page.evaluate(_KERNEL_IDLE_JS):
            stalled_since = stalled_since or time.monotonic()
            if time.monotonic() - stalled_since > 3:
                shot("failed")
                raise AssertionError(f"{name}: Run All stopped, prompts {prompts}:\n{output_text()}")
        else:
            stalled_since = 0.0
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: cells not done after {timeout_s:.0f} s, prompts {prompts}")
        page.wait_for_timeout(250)
    _wait_kernel_idle(page, timeout_s)
    shot("ran")


@pytest.fixture
def run_notebook(
    jupyter_lab: LabServer, chromium: Any, artifacts_dir: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], NotebookRun]]:
    contexts: list[Any] = []
    test_name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)

    def run(name: str, timeout_s: float = NOTEBOOK_TIMEOUT_S) -> NotebookRun:
        context = chromium.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        result = NotebookRun(page=page)
        page.on("console", lambda m: result.console_errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: result.console_errors.append(f"pageerror: {e}"))
        stem = f"{test_name}-{Path(name).stem}"

        def shot(label: str) -> None:
            path = artifacts_dir / f"{stem}-{label}.png"
            page.screenshot(path=str(path), full_page=True)
            result.screenshots.append(path)

        try:
            jupyter_lab.shutdown_sessions()
            page.goto(jupyter_lab.page_url(name, workspace=f"{stem}-{len(contexts)}"), timeout=timeout_s * 1000)
            run_all_cells(page, name, timeout_s, shot, result.output_text)
        except Exception:
            try:
                shot("failed")
            finally:
                raise
        return result

    yield run
    for context in contexts:
        context.close()
