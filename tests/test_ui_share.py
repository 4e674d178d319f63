"""``python -m toolkit plan --html``: one self-contained report, one section per case."""

from __future__ import annotations

import html
import json
from pathlib import Path

from oracle_cases import case

from toolkit import cli

IDS = ["cpu-small_f32-c1024-b2048-ub512-faoff", "rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon-FORCEPP",
       "cpu-tiny_f32-c1024-b2048-ub512-faon-kq8_0"]


def test_plan_html_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([case(i) for i in IDS]))
    out = tmp_path / "report.html"
    assert cli.main(["plan", "--cases", str(cases), "--json", "--html", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    page = out.read_text()
    assert page.count("<section class='toolkit-report-section'>") == 3
    assert page.count("class='toolkit-report-figure'") == 2 * 4          # the refused case has no figures
    for i in IDS[:2]:
        obs = case(i)["observed"]
        assert f"<h2>{i}</h2>" in page
        # the event log carries llama.cpp's graph numbers for the case
        assert f"nodes pp/tg={obs['graph_nodes']}/" in page and f"splits pp/tg={obs['graph_splits']}/" in page
    assert html.escape(printed[2]["error"]) in page     # refused: the same text as plan --json
    assert "<script src=" not in page and "Plotly.newPlot" in page


def test_plan_command_line_html_report(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "report.html"
    assert cli.main(["plan", "-m", "tiny", "-c", "256", "--device", "sim:1G,sim:1G", "--html", str(out)]) == 0
    logged = capsys.readouterr().out
    page = out.read_text()
    assert page.count("class='toolkit-report-figure'") == 4 and "Plotly.newPlot" in page
    # the report's event log and the printed log are the same context's numbers
    nodes = next(int(w) for line in logged.splitlines() if "graph nodes" in line for w in line.split() if w.isdigit())
    assert f"nodes pp/tg={nodes}/" in page
