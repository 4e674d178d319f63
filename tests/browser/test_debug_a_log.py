"""``toolkit.dashboard(log=...)`` in JupyterLab: debug-a-log.ipynb run through the page (one notebook start).

The buffer figure plotly drew must carry the "llama.cpp log" reference marks at the bytes the log
prints (read here from the log's own lines, not by the toolkit's parser) with their legend entry; after
the n_gpu_layers slider moves one stop down, the model bars change and the marks stay where they were.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from conftest import NotebookRun
from test_dashboard import BADGE, PANEL_CSS, UPDATE_TIMEOUT_S, badge_state, wait_new_event
from testenv import REPO_ROOT

LOG = REPO_ROOT / "tests" / "data" / "sched-debug" / "rpc1-small_f32-ngl3-c1024-b2048-ub512-faon-DEBUG.txt"
LOGGED_BYTES = re.compile(r"^\S+:\s+(\S+)\s+(?:model|output|KV|compute) buffer size =\s+[\d.]+ MiB \((\d+) bytes\)")

# the buffer figure as plotly holds it in the page, once it shows reserve ``ev``: traces and legend texts
FIGURE_JS = """(ev) => {
    const el = document.querySelector('__PANEL__ .toolkit-fig-buffers');
    const gd = el && (el.classList.contains('js-plotly-plot') ? el : el.querySelector('.js-plotly-plot'));
    if (!gd || !gd.data || !gd.layout.meta || gd.layout.meta.event !== ev) return null;
    const traces = {};
    for (const t of gd.data) traces[t.name] = {x: Array.from(t.x || []), bytes: Array.from(t.customdata || [])};
    return {traces, legend: [...gd.querySelectorAll('.legendtext')].map(e => e.textContent)};
}""".replace("__PANEL__", PANEL_CSS)


def figure(page: Any, event: int) -> dict[str, Any]:
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while (got := page.evaluate(FIGURE_JS, event)) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the buffer figure does not show reserve {event}")
        page.wait_for_timeout(100)
    return got


def test_the_dashboard_of_a_log_shows_its_reference_marks(run_notebook: Any, artifacts_dir: Path) -> None:
    run: NotebookRun = run_notebook("debug-a-log.ipynb")
    page = run.page
    page.locator(BADGE).first.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    st = badge_state(page)
    assert st is not None and st["decision"] == "rebuilt", st
    expected = [(m.group(1), int(m.group(2))) for line in LOG.read_text().splitlines()
                if (m := LOGGED_BYTES.match(line))]
    assert len(expected) == 7

    before = figure(page, st["index"])
    marks = before["traces"]["llama.cpp log"]
    assert list(zip(marks["x"], marks["bytes"], strict=True)) == expected
    assert "llama.cpp log" in before["legend"]
    # the rebuilt run allocates what the log printed: the compute bars stand at the compute marks
    assert before["traces"]["compute allocated"]["bytes"] == [b for _, b in expected[-2:]]

    # -ngl one lower through the slider: layer 2's weights leave the server, the marks stay
    handle = page.locator(".jp-NotebookPanel:visible .toolkit-control-n_gpu_layers .noUi-handle")
    handle.focus()
    handle.press("ArrowLeft")
    st = wait_new_event(page, st["index"])
    assert st["decision"] == "reused", st
    after = figure(page, st["index"])
    assert after["traces"]["model"]["bytes"] != before["traces"]["model"]["bytes"]
    assert after["traces"]["llama.cpp log"] == marks
    fig = page.locator(".jp-NotebookPanel:visible .toolkit-fig-buffers").first
    fig.scroll_into_view_if_needed()
    shot = artifacts_dir / "dashboard-log-marks.png"
    fig.screenshot(path=str(shot))
    run.screenshots.append(shot)
    errors = [e for e in run.console_errors if "favicon" not in e]
    assert errors == [], errors
