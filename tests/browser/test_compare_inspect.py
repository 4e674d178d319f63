"""Compare and inspect in JupyterLab: quickstart.ipynb's dashboard (the tiny model on two
simulated devices, layer 0's weights in host memory) driven through the page.

Two controls change: a smaller max_nodes (reused), then op offload off (rebuilt). The compare
view, opened with its button, must show the previous and the newest reserve: the split counts
the dashboard reported for each, weight copies that disappear (op offload copied layer 0's host
weights to a device; without it nothing is offloaded) and none that appear. A click on
``ffn_out-0`` in the split map must explain it: with op offload off it multiplies a host weight
on the CPU, placed by pass 1's weight rule, following ``blk.0.ffn_down.weight``. Then the theme
switches to JupyterLab Dark and the figures' text must keep its contrast.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import NotebookRun
from test_dashboard import BADGE, PANEL_CSS, UPDATE_TIMEOUT_S, badge_state, set_max_nodes, wait_new_event

PANEL = ".jp-NotebookPanel:visible"


def sched_splits(page: Any, event: int) -> int:
    """The split count the scheduler line shows for reserve ``event`` (waits until it shows that one)."""
    line = page.locator(f"{PANEL} .toolkit-max-nodes[data-event='{event}']").first
    line.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    text = line.inner_text()
    m = re.search(r"(\d+) splits", text)
    assert m, text
    return int(m.group(1))


def wait_for(page: Any, js: str, arg: Any = None) -> Any:
    deadline = time.monotonic() + UPDATE_TIMEOUT_S
    while True:
        value = page.evaluate(js, arg)
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {js[:80]}")
        page.wait_for_timeout(100)


DIFF_JS = """(b) => { const d = document.querySelector('__PANEL__ .toolkit-diff');
    return d && Number(d.dataset.b) === b ? {...d.dataset, text: d.innerText} : null;
}""".replace("__PANEL__", PANEL_CSS)

# the split map's bar for node `name` (collapse "none": one bar per node): trace and point index
FIND_NODE_JS = """(name) => {
    const el = document.querySelector('__PANEL__ .toolkit-fig-split_map');
    const gd = el && (el.classList.contains('js-plotly-plot') ? el : el.querySelector('.js-plotly-plot'));
    if (!gd || !gd.data) return null;
    const bars = gd.data.filter(t => t.type === 'bar');
    for (let k = 0; k < bars.length; k++) {
        const hv = bars[k].hovertext || [];
        for (let j = 0; j < hv.length; j++)
            if (bars[k].customdata && hv[j].endsWith('<br>' + name)) return {trace: k, point: j,
                                                                            index: bars[k].customdata[j]};
    }
    return null; }""".replace("__PANEL__", PANEL_CSS)

EXPLAIN_JS = """(i) => { const e = document.querySelector('__PANEL__ .toolkit-inspect .toolkit-explain');
    return e && Number(e.dataset.index) === i ? {...e.dataset, text: e.innerText} : null;
}""".replace("__PANEL__", PANEL_CSS)

CONTRAST_JS = """() => {
    const lum = (c) => { const m = c.match(/[\\d.]+/g).map(Number).slice(0, 3).map(v => {
        v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
        return 0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]; };
    const panel = document.querySelector('__PANEL__ .jp-Notebook');
    const bg = getComputedStyle(panel).backgroundColor;
    const tick = document.querySelector('__PANEL__ .toolkit-fig-split_map .xtick text');
    const fg = tick.style.fill || getComputedStyle(tick).fill;
    const [a, b] = [lum(bg), lum(fg)].sort((x, y) => y - x);
    return {bg, fg, ratio: (a + 0.05) / (b + 0.05),
            light: document.body.dataset.jpThemeLight};
}""".replace("__PANEL__", PANEL_CSS)


def test_compare_then_inspect_in_jupyterlab(run_notebook: Callable[[str], NotebookRun], artifacts_dir: Path) -> None:
    run = run_notebook("quickstart.ipynb")
    page = run.page
    page.set_viewport_size({"width": 1400, "height": 3000})
    page.locator(BADGE).first.wait_for(timeout=UPDATE_TIMEOUT_S * 1000)
    st = badge_state(page)
    assert st is not None and st["decision"] == "rebuilt", st

    # control 1: a smaller max_nodes, same flags -> reused
    set_max_nodes(page, st["held"] - 1)
    st = wait_new_event(page, st["index"])
    assert st["decision"] == "reused", st
    before, splits_before = st["index"], sched_splits(page, st["index"])

    # control 2: op offload off -> rebuilt
    box = page.locator(f"{PANEL} .toolkit-control-op_offload input[type=checkbox]")
    assert box.is_checked()
    box.uncheck()
    st = wait_new_event(page, st["index"])
    assert st["decision"] == "rebuilt" and "op_offload on \u2192 off" in st["text"], st
    after, splits_after = st["index"], sched_splits(page, st["index"])
    assert splits_after < splits_before

    # the compare view: previous vs newest by default
    page.locator(f"{PANEL} .toolkit-compare-toggle").click()
    diff = wait_for(page, DIFF_JS, after)
    assert int(diff["a"]) == before and diff["decision"] == "rebuilt", diff
    assert (int(diff["splitsPpA"]), int(diff["splitsPpB"])) == (splits_before, splits_after), diff
    assert int(diff["weightsRemoved"]) > 0 and int(diff["weightsAdded"]) == 0, diff
    assert int(diff["moved"]) > 0 and "ffn_out-0" in diff["text"] and "op offload" in diff["text"]

    # inspect: one bar per node, click ffn_out-0
    page.locator(f"{PANEL} .widget-toggle-buttons button", has_text=re.compile(r"^none$")).click()
    target = wait_for(page, FIND_NODE_JS, "ffn_out-0")
    bar = page.locator(f"{PANEL} .toolkit-fig-split_map .barlayer .trace").nth(target["trace"]) \
        .locator(".point").nth(target["point"])
    bar.scroll_into_view_if_needed()
    box_ = bar.bounding_box()
    assert box_ is not None
    x, y = box_["x"] + box_["width"] / 2, box_["y"] + box_["height"] / 2
    page.mouse.move(x, y)
    page.wait_for_timeout(300)                  # plotly's hover picks the bar; the click reports it
    page.mouse.click(x, y)
    shown = wait_for(page, EXPLAIN_JS, target["index"])
    assert shown["node"] == "ffn_out-0" and shown["backend"] == "CPU", shown
    assert shown["cause"] == "weight" and shown["pass"] == "pass 1", shown
    assert shown["followed"] == "blk.0.ffn_down.weight", shown
    page.locator(f"{PANEL} .toolkit-dashboard").first.screenshot(path=str(artifacts_dir / "compare-inspect.png"))

    # JupyterLab Dark: the figures' neutral text stays readable on the dark background
    light = page.evaluate(CONTRAST_JS)
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Settings$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Theme$")).hover()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^JupyterLab Dark$")).click()
    dark = wait_for(page, "() => document.body.dataset.jpThemeLight === 'false'")
    assert dark
    page.wait_for_timeout(1000)
    dark_c = page.evaluate(CONTRAST_JS)
    assert light["ratio"] >= 3.0 and dark_c["ratio"] >= 3.0, (light, dark_c)
    page.locator(f"{PANEL} .toolkit-dashboard").first.screenshot(path=str(artifacts_dir / "dashboard-dark.png"))
    errors = [e for e in run.console_errors if not re.search(r"favicon", e)]
    assert errors == [], errors
