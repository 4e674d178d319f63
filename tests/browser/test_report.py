"""A saved report opens offline in chromium: every figure drawn by the embedded plotly.js, no
console errors, readable in the light and the dark colour scheme."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from toolkit.ui.choices import make_context
from toolkit.ui.dashboard import Dashboard

FIGURES_JS = """() => [...document.querySelectorAll('.toolkit-report-figure')].map(f => {
    const gd = f.querySelector('.js-plotly-plot');
    return {name: f.dataset.name, drawn: !!(gd && gd._fullLayout && gd.querySelector('.main-svg')),
            traces: gd && gd.data ? gd.data.length : 0,
            marks: gd ? gd.querySelectorAll('.point, .scatterlayer .trace').length : 0};
})"""

# WCAG relative luminance contrast of the first figure's tick text against the page background
CONTRAST_JS = """() => {
    const lum = (c) => { const m = c.match(/[\\d.]+/g).map(Number).slice(0, 3).map(v => {
        v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
        return 0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]; };
    const bg = getComputedStyle(document.body).backgroundColor;
    const tick = document.querySelector('.toolkit-report-figure .xtick text');
    const fg = tick.style.fill || getComputedStyle(tick).fill;
    const [a, b] = [lum(bg), lum(fg)].sort((x, y) => y - x);
    return {bg, fg, ratio: (a + 0.05) / (b + 0.05)};
}"""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dash = Dashboard(make_context("tiny", "sim:2", n_gpu_layers=1), debounce_s=0)
    dash.controls["op_offload"].value = False
    dash.controls["max_nodes"].value = "1024"
    return dash.save_html(tmp_path_factory.mktemp("report") / "report.html")


def open_offline(chromium: Any, path: Path, scheme: str) -> tuple[Any, Any, list[str], list[str]]:
    context = chromium.new_context(viewport={"width": 1200, "height": 900}, color_scheme=scheme)
    context.set_offline(True)
    fetched: list[str] = []

    def block(route: Any) -> None:         # anything but the file itself would need the network
        fetched.append(route.request.url)
        route.abort()

    context.route(re.compile(r"^(?!file:).*"), block)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    page.goto(path.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.toolkit-report-figure .main-svg').length >= 4",
                           timeout=60_000)
    return context, page, errors, fetched


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_saved_report_renders_offline(chromium: Any, report: Path, artifacts_dir: Path, scheme: str) -> None:
    context, page, errors, fetched = open_offline(chromium, report, scheme)
    try:
        figs = page.evaluate(FIGURES_JS)
        assert [f["name"] for f in figs] == ["timeline", "buffers", "split_map", "memory_layout"]
        assert all(f["drawn"] and f["traces"] > 0 and f["marks"] > 0 for f in figs), figs
        c = page.evaluate(CONTRAST_JS)
        assert c["ratio"] >= 3.0, c                      # large-text contrast, both themes
        assert "compare reserve #1" in page.inner_text(".toolkit-report-compare")
        page.screenshot(path=str(artifacts_dir / f"report-{scheme}.png"), full_page=True)
        assert errors == [] and fetched == [], (errors, fetched)
    finally:
        context.close()
