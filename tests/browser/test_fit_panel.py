"""The fit-to-budget panel in JupyterLab: will-it-fit.ipynb run through the page, then its first
panel (Qwen3-30B-A3B Q8_0 on one simulated 24 GB device) driven as a user would.

A second 24 GB device is typed into the budget box and "fit" clicked: the printed line must become
the one ``toolkit.fit.fit_params`` gives for the same command line, and plotly must draw a probe
line per device with one shared target line. Then a budget the flag grammar refuses: the panel
names the control, keeps the printed line and puts the box back to the shown result's value.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import NotebookRun
from test_dashboard import PANEL_CSS, UPDATE_TIMEOUT_S

PANEL = ".jp-NotebookPanel:visible .toolkit-fit-panel"

# the trace names plotly drew in the panel's probe figure
TRACES_JS = """() => {
    const panel = document.querySelector('__PANEL__ .toolkit-fit-panel');
    const el = panel && panel.querySelector('.toolkit-fit-probes');
    const gd = el && (el.classList.contains('js-plotly-plot') ? el : el.querySelector('.js-plotly-plot'));
    return gd && gd.data ? gd.data.map(t => t.name) : [];
}""".replace("__PANEL__", PANEL_CSS)


def expected_line(budgets: str) -> str:
    from toolkit.args import parse_args
    from toolkit.fit import fit_params
    from toolkit.models import presets

    return fit_params(presets.qwen3_30b_a3b("q8_0"), parse_args(["--device", budgets, "-fa", "on"])).printed


def wait_until(page: Any, check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        page.wait_for_timeout(100)
    return value


def test_fit_panel_in_jupyterlab(run_notebook: Callable[[str], NotebookRun], artifacts_dir: Path) -> None:
    run = run_notebook("will-it-fit.ipynb")
    page = run.page
    panel = page.locator(PANEL).first
    panel.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    printed = panel.locator(".toolkit-fit-printed")
    before = printed.inner_text()
    assert before == expected_line("sim:24G")

    # a second device: the experts come back from the CPU
    budgets = panel.locator(".toolkit-fit-budgets input")
    budgets.fill("24G,24G")
    panel.locator("button.toolkit-fit-button").click()
    after = wait_until(page, lambda: (t := printed.inner_text()) != before and t, "a new printed line")
    assert after == expected_line("sim:24G,sim:24G")
    assert "-ot" in before and "-ot" not in after
    names = wait_until(page, lambda: (n := page.evaluate(TRACES_JS)) and "SIM1 used" in n and n, "the probe figure")
    assert names.count("SIM0, SIM1 target (free − margin)") == 1 and "SIM0 used" in names
    assert panel.locator("tr.toolkit-fit-device").count() == 2

    # a budget the grammar refuses: the control is named, the result stays, the box shows its value again
    budgets.fill("lots")
    panel.locator("button.toolkit-fit-button").click()
    err = wait_until(page, lambda: panel.locator(".toolkit-fit-error").inner_text(), "the error")
    assert "ParameterError" in err and "budget" in err and "previous result kept" in err, err
    assert printed.inner_text() == after
    wait_until(page, lambda: budgets.input_value() == "24G,24G", "the budget box to go back")

    panel.scroll_into_view_if_needed()
    shot = artifacts_dir / "fit-panel.png"
    panel.screenshot(path=str(shot))
    run.screenshots.append(shot)
    errors = [e for e in run.console_errors if not re.search(r"favicon", e)]
    assert errors == [], errors
