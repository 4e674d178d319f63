"""The dashboard in a real browser: quickstart.ipynb run through JupyterLab's UI in chromium.

After the notebook ran, the test types into the dashboard's max_nodes box and moves the n_ctx
slider as a user would, and checks that the badge switches between REUSED and REBUILT exactly
as the seed's rule says (max_nodes <= the scheduler's, same parallel, same op_offload -> reused),
that the buffer bars change with n_ctx, and that the page logged no console errors.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import NotebookRun

BADGE = ".jp-NotebookPanel:visible .toolkit-badge"
# the same in CSS (":visible" is playwright's): the notebook panel that is not hidden
PANEL_CSS = ".jp-NotebookPanel:not(.lm-mod-hidden)"
UPDATE_TIMEOUT_S = 120


def badge_state(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """(sel) => { const b = document.querySelector(sel);
                      return b ? {decision: b.dataset.decision, index: Number(b.dataset.index ?? -1),
                                  text: b.innerText, requested: Number(b.dataset.requested),
                                  held: Number(b.dataset.held)} : null; }""",
        f"{PANEL_CSS} .toolkit-badge")


def wait_new_event(page: Any, after: int) -> dict[str, Any]:
    """Wait until the badge shows an event newer than ``after`` (or an error)."""
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while True:
        st = badge_state(page)
        if st is not None and (st["index"] > after or st["decision"] == "error"):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"badge did not update after event {after}: {st}")
        page.wait_for_timeout(100)


def buffer_bars(page: Any, event: int) -> dict[str, list[float]]:
    """The buffer-size figure's bar values (bytes) as plotly drew them in the page, once the
    figure shows reserve ``event`` (its layout.meta.event); {} before that."""
    return page.evaluate(
        """(ev) => { const el = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .toolkit-fig-buffers');
                   // the FigureWidget's own element is plotly's graph div
                   const gd = el && (el.classList.contains('js-plotly-plot')
                                     ? el : el.querySelector('.js-plotly-plot'));
                   const out = {};
                   if (!gd || !gd.data || !gd.layout.meta || gd.layout.meta.event !== ev) return out;
                   for (const t of gd.data) if (t.type === 'bar') out[t.name] = Array.from(t.customdata || []);
                   return out; }""", event)


def wait_bars(page: Any, event: int) -> dict[str, list[float]]:
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while not (bars := buffer_bars(page, event)).get("KV"):
        if time.monotonic() > deadline:
            raise AssertionError(f"buffer figure does not show event {event}")
        page.wait_for_timeout(100)
    return bars


def set_max_nodes(page: Any, value: int) -> None:
    box = page.locator(".jp-NotebookPanel:visible .toolkit-control-max_nodes input")
    box.fill(str(value))
    box.press("Enter")                  # the Text widget syncs on Enter (continuous_update=False)


def expected_decision(requested: int, held: int) -> str:
    # the seed's rule for a max_nodes-only change (flags unchanged)
    return "reused" if requested <= held else "rebuilt"


def drive_dashboard(run: NotebookRun, artifacts_dir: Path, label: str) -> list[str]:
    """Reuse, rebuild and an n_ctx change through the page; returns the decisions seen."""
    page = run.page
    page.locator(BADGE).first.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    st = badge_state(page)
    assert st is not None and st["decision"] in ("rebuilt", "reused"), st
    seen = [st["decision"]]
    held = st["held"]
    assert held and held > 0, st

    # 1. a smaller max_nodes with the same flags: the scheduler is reused
    smaller = held - 1
    set_max_nodes(page, smaller)
    st = wait_new_event(page, st["index"])
    assert st["decision"] == expected_decision(smaller, held) == "reused", st
    assert st["held"] == held and st["requested"] == smaller
    assert st["text"].startswith("REUSED") and f"max_nodes {smaller} <= {held}" in st["text"]
    seen.append(st["decision"])

    # 2. a larger one: rebuilt, and the scheduler now holds the new size
    larger = 2 * held
    set_max_nodes(page, larger)
    st = wait_new_event(page, st["index"])
    assert st["decision"] == expected_decision(larger, held) == "rebuilt", st
    assert st["held"] == larger and f"max_nodes {larger} > {held}" in st["text"]
    seen.append(st["decision"])
    held = larger

    # 3. move the n_ctx slider one stop: the KV (and compute) bars change; flags and max_nodes kept -> reused
    before = wait_bars(page, st["index"])
    handle = page.locator(".jp-NotebookPanel:visible .toolkit-control-n_ctx .noUi-handle")
    handle.focus()
    handle.press("ArrowRight")
    st = wait_new_event(page, st["index"])
    assert st["decision"] == expected_decision(st["requested"], held) == "reused", st
    after = wait_bars(page, st["index"])
    assert after["KV"] != before["KV"], (before, after)
    seen.append(st["decision"])

    # a tall viewport so the whole dashboard (all figures) fits in the notebook panel for the picture
    page.set_viewport_size({"width": 1400, "height": 3400})
    page.wait_for_timeout(500)
    page.locator(".jp-NotebookPanel:visible .toolkit-dashboard").first.scroll_into_view_if_needed()
    shot = artifacts_dir / f"{label}.png"
    page.locator(".jp-NotebookPanel:visible .toolkit-dashboard").first.screenshot(path=str(shot))
    run.screenshots.append(shot)
    return seen


def test_dashboard_reuse_and_rebuild_in_jupyterlab(run_notebook: Callable[[str], NotebookRun],
                                                    artifacts_dir: Path) -> None:
    run = run_notebook("quickstart.ipynb")
    seen = drive_dashboard(run, artifacts_dir, "dashboard-quickstart")
    assert seen[1:] == ["reused", "rebuilt", "reused"]
    errors = [e for e in run.console_errors if not re.search(r"favicon", e)]
    assert errors == [], errors
