"""``python -m toolkit plan --html``: one self-contained report, one section per case."""

from __future__ import annotations

import json
from pathlib import Path

from oracle_cases import case

from toolkit import cli

IDS = ["cpu-small_f32-c1024-b2048-ub512-faoff", "rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon-FORCEPP",
       "cpu-tiny_f32-c1024-b2048-ub512-faon-kq8_0"]


def test_plan_html_report(tmp_path: Path) -> None:
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([case(i) for i in IDS]))
    out = tmp_path / "report.html"
    assert cli.main(["plan", "--cases", str(cases), "--json", "--html", str(out)]) == 0
    page = out.read_text()
    assert page.count("<section class='toolkit-report-section'>") == 3
    assert page.count("class='toolkit-report-figure'") == 2 * 4          # the refused case has no figures
    for i in IDS[:2]:
        obs = case(i)["observed"]
        assert f"<h2>{i}</h2>" in page
        # the event log carries llama.cpp's graph numbers for the case
        assert f"nodes pp/tg={obs['graph_nodes']}/" in page and f"splits pp/tg={obs['graph_splits']}/" in page
    assert "K cache type q8_0 with block size 32 does not divide n_embd_head_k=16" in page
    assert "<script src=" not in page and "Plotly.newPlot" in page
