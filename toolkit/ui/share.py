"""One self-contained HTML file of a context's reserves: figures (with plotly.js, still interactive),
the event log, the compare view of the last two reserves, the parameters and the toolkit version.

The file needs no kernel and no network: plotly.js is embedded once, every figure is a static
plotly JSON drawn by it. ``Dashboard.save_html`` and ``python -m toolkit plan --html`` write it.

>>> save_html("report.html", [section_of(ctx)])     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import datetime
import html
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from toolkit.compare import compare, default_pair
from toolkit.errors import ToolkitError
from toolkit.explain.parse import LoggedBuffer
from toolkit.reuse import ReserveEvent
from toolkit.ui import figures, text
from toolkit.ui.layers import Collapse
from toolkit.view import ContextSettings


@dataclass(frozen=True)
class Section:
    """One context in the report: a title, its events and the parameters it was created with
    (``logged``: a llama.cpp log's buffer sizes, marked on the buffer figure)."""

    title: str
    events: tuple[ReserveEvent, ...]
    params: tuple[tuple[str, str], ...]
    logged: tuple[LoggedBuffer, ...] = ()


class Reported(Protocol):
    """What a report reads of a context (:class:`~toolkit.context.Context` and
    :class:`~toolkit.trace.session.TracedContext` both are one)."""

    @property
    def events(self) -> Sequence[ReserveEvent]:
        """The reserves so far, oldest first."""
        ...

    def settings(self) -> ContextSettings:
        """What the context offers (its title, its model and context parameters)."""
        ...


def _params_of(ctx: Reported) -> tuple[tuple[str, str], ...]:
    model = ctx.settings().model
    out: list[tuple[str, str]] = []
    if model is not None:
        out.append(("model", model.name))
        out += [(f.name, str(getattr(model.cparams, f.name))) for f in dataclasses.fields(model.cparams)]
    if ctx.events:
        p = ctx.events[-1].params
        out += [("sched max_nodes", str(p.max_nodes)), ("sched parallel", str(p.parallel)),
                ("sched op_offload", str(p.op_offload))]
    return tuple(out)


def section_of(ctx: Reported, title: str | None = None, logged: Sequence[LoggedBuffer] = ()) -> Section:
    """A report section for a Context or a TracedContext (its events and parameters)."""
    return Section(title or ctx.settings().title, tuple(ctx.events), _params_of(ctx), tuple(logged))


def _figure_div(fig: go.Figure, div_id: str) -> str:
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                           config={"responsive": True, "displaylogo": False}))


def section_html(sec: Section, k: int, collapse: Collapse = "layer") -> str:
    events = list(sec.events)
    rows = "".join(f"<tr><td>{html.escape(k_)}</td><td>{html.escape(v)}</td></tr>" for k_, v in sec.params)
    if not events:
        return (f"<section class='toolkit-report-section'><h2>{html.escape(sec.title)}</h2><p>no reserve</p>"
                f"<h3>parameters</h3><table class='toolkit-report-params'>{rows}</table></section>")
    plan = next((e.plan for e in reversed(events) if e.plan is not None), None)
    figs = {"timeline": figures.timeline(events), "buffers": figures.buffer_sizes(events, sec.logged),
            "split_map": figures.split_map(plan, collapse), "memory_layout": figures.memory_layout(plan)}
    pair = default_pair(events)
    diff = text.diff_text(compare(events[pair[0]], events[pair[1]], events)) if pair else "fewer than two reserves"
    log = "\n\n".join(e.to_text() for e in events)
    divs = "\n".join(f"<div class='toolkit-report-figure' data-name='{name}'>{_figure_div(fig, f'fig-{k}-{name}')}"
                     f"</div>" for name, fig in figs.items())
    return (f"<section class='toolkit-report-section'><h2>{html.escape(sec.title)}</h2>"
            f"{text.badge_html(events[-1])}"
            f"{divs}"
            f"<h3>compare</h3><pre class='toolkit-report-compare'>{html.escape(diff)}</pre>"
            f"<h3>event log</h3><pre class='toolkit-report-log'>{html.escape(log)}</pre>"
            f"<h3>parameters</h3><table class='toolkit-report-params'>{rows}</table></section>")


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; background: #fff; }
pre { white-space: pre-wrap; font-size: 12px; }
table { border-collapse: collapse; font-size: 12px; } td { border: 1px solid #8884; padding: 2px 8px; }
@media (prefers-color-scheme: dark) { body { color: #ddd; background: #111; } }
"""


def report_html(sections: Sequence[Section], title: str = "toolkit report",
                meta: Mapping[str, str] | None = None, preamble: str = "") -> str:
    """The whole report as one HTML string (plotly.js inline); ``preamble`` (HTML) comes before the sections."""
    from toolkit.version import __version__

    info = {"toolkit": __version__, "written": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            **(meta or {})}
    head = " · ".join(f"{k} {v}" for k, v in info.items())
    body = "\n".join(section_html(s, k) for k, s in enumerate(sections))
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head>"
            f"<body><h1>{html.escape(title)}</h1><p class='toolkit-report-meta' data-version='{info['toolkit']}'>"
            f"{html.escape(head)}</p>{preamble}{body}"
            f"<script type='application/json' id='toolkit-report-info'>{json.dumps(info)}</script></body></html>")


def save_html(path: str | Path, sections: Sequence[Section], title: str = "toolkit report",
              meta: Mapping[str, str] | None = None, preamble: str = "") -> Path:
    """Write :func:`report_html` to ``path``; returns the path."""
    p = Path(path)
    p.write_text(report_html(sections, title, meta, preamble), encoding="utf-8")
    return p


def explained_html(compared: Sequence[Mapping[str, Any]], missing: Sequence[str], causes: Sequence[str]) -> str:
    """``explain --html``'s table: each logged number (its line) beside the toolkit's, then what was assumed."""
    rows = "".join(
        f"<tr class='toolkit-explain-row' data-equal='{int(bool(c['equal']))}'><td>{c['line']}</td>"
        f"<td>{html.escape(str(c['what']))}</td><td>{html.escape(str(c['buffer']))}</td><td>{c['logged']}</td>"
        f"<td>{c['ours'] if c['ours'] is not None else '-'}</td><td>{'=' if c['equal'] else '&ne;'}</td>"
        f"<td><code>{html.escape(str(c['text']))}</code></td></tr>" for c in compared)
    notes = "".join(f"<li>assumed: {html.escape(m)}</li>" for m in missing)
    notes += "".join(f"<li>could explain a difference: {html.escape(m)}</li>" for m in causes)
    return ("<section class='toolkit-explain'><h2>the log's numbers beside the toolkit's</h2>"
            "<table class='toolkit-explain-table'><tr><td>line</td><td>what</td><td>buffer</td><td>logged</td>"
            f"<td>toolkit</td><td></td><td>log line</td></tr>{rows}</table><ul>{notes}</ul></section>")


def save_cases_html(path: str | Path, cases: Sequence[Mapping[str, Any]], source: str = "") -> Path:
    """``python -m toolkit plan --cases FILE --html PATH``: one section per case (its context's reserves);
    a case llama.cpp would refuse is listed with its error."""
    from toolkit.cases import context_from_case

    sections: list[Section] = []
    for k, case in enumerate(cases):
        title = str(case.get("id", f"case {k}"))
        try:
            sections.append(section_of(context_from_case(case), title))
        except ToolkitError as e:   # refused as llama.cpp refuses it (plan_case's text)
            why = e.llama_text or str(e)
            sections.append(Section(f"{title}: {why}", (), tuple((str(a), str(b)) for a, b in case["cparams"].items())))
    return save_html(path, sections, title=f"toolkit plan {source}".strip(), meta={"cases": str(len(cases))})


__all__ = ["Section", "report_html", "save_cases_html", "save_html", "section_of"]
