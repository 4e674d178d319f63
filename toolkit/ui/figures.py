"""Pure figure builders: ReserveEvents / Plans in, a plotly ``go.Figure`` out.

Nothing here computes a plan; every function only draws data the context and the scheduler
already recorded, so each can be used (and tested) outside the dashboard. The text form of
each view is in ``toolkit.ui.text``.

>>> from toolkit.ui import figures
>>> fig = figures.timeline(ctx.events)          # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from toolkit.explain.parse import LoggedBuffer
from toolkit.fit import FitResult
from toolkit.reuse import COMPUTE_GROUP, CompileEvent, ReserveEvent
from toolkit.sched.explain import parse_copy_name
from toolkit.sched.plan import Plan
from toolkit.ui import text
from toolkit.ui.layers import Collapse, group_starts, node_runs
from toolkit.ui.style import (
    DECISION_COLOUR,
    DECISION_SYMBOL,
    MIB,
    NEUTRAL_GRID,
    NEUTRAL_TEXT,
    backend_colour,
    base_layout,
    kind_colour,
    mib,
    nbytes_exact,
    neutral_axis,
    size_label,
)

# the name (legend entry and hover title) of the marks a llama.cpp log's buffer sizes leave on the figures
LOGGED = "llama.cpp log"
# the fill of each graph's "compute needed" bars, in the reserve's graph order (pp plain, tg hatched)
GRAPH_PATTERNS = ("", "/", "x", ".", "+")


def _two_columns(titles: tuple[str, str]) -> dict[str, Any]:
    """make_subplots(1, 2, column_widths=[0.55, 0.45], horizontal_spacing=0.1) as layout entries."""
    axis = neutral_axis()
    domains = ([0.0, 0.495], [0.595, 1.0])
    return {
        "xaxis": {**axis, "domain": domains[0], "anchor": "y"}, "yaxis": {**axis, "domain": [0.0, 1.0], "anchor": "x"},
        "xaxis2": {**axis, "domain": domains[1], "anchor": "y2"},
        "yaxis2": {**axis, "domain": [0.0, 1.0], "anchor": "x2"},
        "annotations": [{"text": t, "x": (d[0] + d[1]) / 2, "y": 1.0, "xref": "paper", "yref": "paper",
                         "xanchor": "center", "yanchor": "bottom", "showarrow": False, "font": {"size": 16}}
                        for t, d in zip(titles, domains)],
    }


def _neutral_axes(fig: go.Figure) -> go.Figure:
    """Every axis (subplots included) with the neutral grid: the default template's white grid
    lines would glare on JupyterLab's dark theme."""
    axis = {"gridcolor": NEUTRAL_GRID, "zerolinecolor": NEUTRAL_GRID, "linecolor": NEUTRAL_GRID,
            "tickfont": {"color": NEUTRAL_TEXT}, "title_font": {"color": NEUTRAL_TEXT}}
    fig.update_xaxes(**axis)
    fig.update_yaxes(**axis)
    return fig


def badge(ev: ReserveEvent | None, error: str | None = None) -> go.Figure:
    """The decision as a large word, the reasons and what it cost or saved."""
    decision = "error" if error is not None else (ev.decision if ev is not None else "none")
    line = f"ERROR · {error} · previous state kept" if error is not None else text.badge_text(ev)
    head, _, rest = line.partition(" · ")
    colour = DECISION_COLOUR.get(decision, NEUTRAL_TEXT)
    fig = go.Figure(layout=base_layout("", height=90, margin={"l": 10, "r": 10, "t": 10, "b": 10}))
    fig.add_annotation(x=0, y=0.75, xref="paper", yref="paper", xanchor="left", showarrow=False,
                       text=f"<b>{head}</b>", font={"size": 26, "color": colour})
    fig.add_annotation(x=0, y=0.1, xref="paper", yref="paper", xanchor="left", showarrow=False,
                       text=rest.replace(" · ", "<br>", 1) if len(rest) > 90 else rest,
                       font={"size": 12, "color": NEUTRAL_TEXT})
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(meta={"decision": decision, "text": line})
    return fig


def _event_hover(ev: ReserveEvent, compiles: Sequence[CompileEvent] = ()) -> str:
    rows = [f"<b>#{ev.index} {ev.decision.upper()}</b>", f"trigger: {ev.trigger or '-'}",
            f"params: {text.params_text(ev.params)}", f"was: {text.params_text(ev.previous)}",
            f"why: {text.reasons_text(ev) or '-'}", f"timings: {text.timings_text(ev)}",
            f"host metadata: +{size_label(ev.host_metadata_bytes)}, saved {size_label(ev.saved_host_metadata_bytes)}",
            f"graphs: {text.graphs_text(ev) or '-'}"]
    for c in compiles:
        if c.reserve_index == ev.index:
            rows.append(f"XLA compile: {c.compiled} compiled, {c.cache_hits} cache hits, {c.compile_ms} ms")
    if ev.error:
        rows.append(f"error: {ev.error}")
    return "<br>".join(rows)


def timeline(events: Sequence[ReserveEvent], compiles: Sequence[CompileEvent] = (), last: int | None = None
             ) -> go.Figure:
    """Each reserve a marker (colour and symbol by decision) at its wall time; hover has the details.
    ``last``: only the latest that many (a live view, whose drawing time would otherwise grow with
    the session); the title says how many there are."""
    title = "reserve events"
    if last is not None and len(events) > last:
        title = f"reserve events (the latest {last} of {len(events)})"
        events = events[-last:]
    layout = base_layout(title, height=260)
    traces: list[dict[str, Any]] = []
    for decision in ("rebuilt", "reused", "fallback", "error"):
        evs = [e for e in events if e.decision == decision]
        # colour is never the only cue: each decision has its own symbol and, on short logs, its word
        traces.append({
            "type": "scatter", "x": [e.index for e in evs], "y": [text.total_ms(e) for e in evs],
            "mode": "markers+text" if len(events) <= 24 else "markers", "name": decision,
            "text": [decision for _ in evs], "textposition": "top center",
            "textfont": {"size": 9, "color": NEUTRAL_TEXT},
            "marker": {"color": DECISION_COLOUR[decision], "symbol": DECISION_SYMBOL[decision], "size": 12,
                       "line": {"width": 1, "color": NEUTRAL_TEXT}},
            "hovertext": [_event_hover(e, compiles) for e in evs], "hoverinfo": "text", "showlegend": True,
            "cliponaxis": False})                  # the word over the highest marker stays whole
    if events:
        # a thin line in event order so the sequence reads left to right
        traces.append({"type": "scatter", "x": [e.index for e in events], "y": [text.total_ms(e) for e in events],
                       "mode": "lines", "line": {"color": NEUTRAL_GRID, "width": 1}, "hoverinfo": "skip",
                       "showlegend": False})
    layout["xaxis"].update(title={"text": "reserve #", "font": {"color": NEUTRAL_TEXT}},
                           dtick=1 if len(events) <= 20 else None, tickformat="d")
    layout["yaxis"].update(title={"text": "reserve ms", "font": {"color": NEUTRAL_TEXT}}, rangemode="tozero")
    return go.Figure(data=traces, layout=layout)


def _buft_order(ev: ReserveEvent) -> list[str]:
    """The compute buffers' types first, then the other groups' buffers in group order."""
    names = [b.buft for b in ev.buffers]
    names += [n for group, bufs in ev.memory.items() if group != COMPUTE_GROUP for n in bufs]
    return list(dict.fromkeys(names))


def buffer_sizes(events: Sequence[ReserveEvent], logged: Sequence[LoggedBuffer] = (), last: int | None = None
                 ) -> go.Figure:
    """Left: the newest reserve's buffers per buffer type (compute allocated, needed by each graph
    the reserve planned, one trace per graph label, then one trace per memory group: model, KV,
    KV-SWA, ..., output; and the scheduler host metadata). Right: compute allocated (solid) and needed (dotted) per
    buffer type across events -- under reuse the allocated line stays at its maximum (a kept
    scheduler's buffers only grow, llama.cpp #32009).

    ``logged``: the buffer sizes a llama.cpp start-up log printed (``toolkit.explain``), drawn as
    reference marks named :data:`LOGGED`: a dash per buffer at the logged bytes (left) and a dashed
    line per compute buffer across the reserves (right). They are plain data handed in, the same
    whatever the events show, so a changed control reads against the logged run.

    ``last``: the history (right) shows only the latest that many reserves, as :func:`timeline`."""
    # built as plain dicts and validated once: make_subplots and update_* calls each re-validate the
    # figure, which took most of this figure's drawing time on an 8B graph
    layout = base_layout("buffer sizes", height=340, barmode="group")
    layout.update(_two_columns(("newest reserve", "compute buffers across reserves")))
    traces: list[dict[str, Any]] = []
    good = [e for e in events if e.buffers]
    if not good:
        layout["meta"] = {"text": "no buffers yet"}
        return go.Figure(data=traces, layout=layout)
    ev = good[-1]
    cats = _buft_order(ev)
    by_buft: dict[str, list] = {c: [] for c in cats}
    for b in ev.buffers:
        by_buft[b.buft].append(b)

    def bars(name: str, values: Mapping[str, int], hover_extra: dict[str, str] | None = None, *,
             kind: str | None = None, pattern: str = "") -> None:
        xs = list(values)
        ys = [values[x] for x in xs]
        hover = [f"{name} · {x}<br>{size_label(y)}" + (f"<br>{hover_extra[x]}" if hover_extra and x in hover_extra
                                                        else "") for x, y in zip(xs, ys)]
        traces.append({"type": "bar", "x": xs, "y": [y / MIB for y in ys], "name": name,
                       "marker": {"color": kind_colour(kind or name), "pattern": {"shape": pattern}},
                       "hovertext": hover, "hoverinfo": "text", "customdata": ys, "legendgroup": name,
                       "xaxis": "x", "yaxis": "y"})

    alloc = {c: sum(b.allocated for b in bs) for c, bs in by_buft.items() if bs}
    extra = {c: "<br>".join(f"{b.backend}: " + ", ".join(f"{g} {nbytes_exact(n)}" for g, n in b.needed.items())
                            for b in bs) for c, bs in by_buft.items() if bs}

    # llama.cpp reports each memory per buft name; keep the compute buffers' order first
    def ordered(d: Mapping[str, int]) -> dict[str, int]:
        return {c: d[c] for c in cats if c in d}

    bars("compute allocated", alloc, extra)
    # one trace per graph the reserve planned; the pattern tells the graphs apart without colour
    for k, label in enumerate(ev.graphs):
        need = {c: max(b.needed.get(label, 0) for b in bs) for c, bs in by_buft.items() if bs}
        bars(f"compute needed ({label})", need, extra, kind="compute needed",
             pattern=GRAPH_PATTERNS[k % len(GRAPH_PATTERNS)])
    for group, bufs in ev.memory.items():
        if group != COMPUTE_GROUP and bufs:   # compute: the bars above
            bars(group, ordered(bufs))
    upto = list(events[: list(events).index(ev) + 1])
    bars("sched host metadata", {"sched (host)": text.held_host_metadata(upto)})

    # history: one colour per buffer type, allocated solid, needed dotted
    history = good[-last:] if last is not None else good
    for i, buft in enumerate(c for c in cats if c in alloc):
        xs, ya, yn, hv = [], [], [], []
        for e in history:
            bs = [b for b in e.buffers if b.buft == buft]
            if not bs:
                continue
            a = sum(b.allocated for b in bs)
            n = max(b.needed_max for b in bs)
            xs.append(e.index)
            ya.append(a / MIB)
            yn.append(n / MIB)
            hv.append(f"#{e.index} {e.decision} · {buft}<br>allocated {size_label(a)}<br>needed {size_label(n)}")
        colour = backend_colour(i)
        traces.append({"type": "scatter", "x": xs, "y": ya, "mode": "lines+markers", "name": f"{buft} allocated",
                       "line": {"color": colour, "width": 2, "shape": "hv"}, "hovertext": hv, "hoverinfo": "text",
                       "legendgroup": buft, "xaxis": "x2", "yaxis": "y2"})
        traces.append({"type": "scatter", "x": xs, "y": yn, "mode": "lines+markers", "name": f"{buft} needed",
                       "line": {"color": colour, "width": 2, "dash": "dot", "shape": "hv"},
                       "marker": {"symbol": "circle-open"}, "hovertext": hv, "hoverinfo": "text",
                       "legendgroup": buft, "xaxis": "x2", "yaxis": "y2"})
    for y in ("yaxis", "yaxis2"):
        layout[y].update(title={"text": "MiB", "font": {"color": NEUTRAL_TEXT}}, rangemode="tozero")
    # reserve numbers are whole: one tick per reserve on short logs, integer labels always
    layout["xaxis2"].update(title={"text": "reserve #", "font": {"color": NEUTRAL_TEXT}}, tickformat="d",
                            dtick=1 if len(history) <= 20 else None)
    traces += _logged_marks(logged, [e.index for e in history], {c: backend_colour(i) for i, c in
                                                                enumerate(c for c in cats if c in alloc)})
    layout["meta"] = {"event": ev.index, "text": text.buffers_text(upto),
                      "logged": [{"group": m.group, "buft": m.buft, "bytes": m.nbytes, "line": m.line} for m in logged]}
    return go.Figure(data=traces, layout=layout)


def _logged_marks(logged: Sequence[LoggedBuffer], reserves: Sequence[int],
                  colours: Mapping[str, str]) -> list[dict[str, Any]]:
    """The reference marks of :func:`buffer_sizes` (one legend entry for all of them)."""
    if not logged:
        return []

    def hover(m: LoggedBuffer) -> str:
        return (f"<b>{LOGGED}</b> · {m.group} · {m.buft}<br>{size_label(m.nbytes)}"
                f"{'' if m.exact else ' (printed in MiB only)'}<br>line {m.line} of the log")

    traces: list[dict[str, Any]] = [{
        "type": "scatter", "x": [m.buft for m in logged], "y": [m.nbytes / MIB for m in logged],
        "mode": "markers", "name": LOGGED, "legendgroup": LOGGED, "customdata": [m.nbytes for m in logged],
        "marker": {"symbol": "line-ew", "size": 28, "color": NEUTRAL_TEXT, "line": {"width": 3, "color": NEUTRAL_TEXT}},
        "hovertext": [hover(m) for m in logged], "hoverinfo": "text", "meta": {"kind": LOGGED},
        "xaxis": "x", "yaxis": "y"}]
    x0, x1 = (min(reserves), max(reserves)) if reserves else (0, 0)
    for m in (m for m in logged if m.group == "compute"):
        traces.append({"type": "scatter", "x": [x0 - 0.5, x1 + 0.5], "y": [m.nbytes / MIB] * 2, "mode": "lines",
                       "name": f"{LOGGED}: {m.buft} compute", "legendgroup": LOGGED, "showlegend": False,
                       "line": {"color": colours.get(m.buft, NEUTRAL_TEXT), "width": 1.5, "dash": "dash"},
                       "customdata": [m.nbytes] * 2, "hovertext": [hover(m)] * 2, "hoverinfo": "text",
                       "meta": {"kind": LOGGED}, "xaxis": "x2", "yaxis": "y2"})
    return traces


def _spaced_ticks(starts: Sequence[tuple[str, int]], n_nodes: int, width: int) -> list[tuple[str, int]]:
    """Layer labels that do not overlap: two neighbours at least their half widths apart (about
    6 px a character at the 11 px tick font, plus a gap) on a plot ``width`` px wide."""
    px_per_node = max(width - 100, 100) / max(n_nodes + 1, 1)
    ticks: list[tuple[str, int]] = []
    for label, start in starts:
        if ticks and (start - ticks[-1][1]) * px_per_node < 3 * (len(ticks[-1][0]) + len(label)) + 4:
            if ticks[-1][0] == "input":         # a short input group yields its label to L0
                ticks[-1] = (label, start)
            continue
        ticks.append((label, start))
    return ticks


def split_map(plan: Plan | None, collapse: Collapse = "layer", width: int = 960) -> go.Figure:
    """Nodes in graph order coloured by backend (runs collapsed by layer by default), split spans
    underneath, split boundaries as dashed lines and input copies as triangles at each split start."""
    fig = go.Figure(layout=base_layout("split map", height=280, barmode="overlay", bargap=0.25))
    if plan is None or not plan.nodes:
        fig.update_layout(meta={"text": "no plan"})
        return fig
    runs = node_runs(plan, collapse)
    row_nodes = "nodes" if collapse == "none" else f"nodes by {collapse}"
    for bid in sorted({r.backend_id for r in runs}):
        rs = [r for r in runs if r.backend_id == bid]
        hover = [f"<b>{r.group}</b> · {r.backend}<br>nodes {r.start}..{r.end - 1} ({r.count})"
                 f"<br>splits: {', '.join(map(str, sorted(r.splits))) or '-'}<br>{r.summary()}"
                 f"<br>output bytes: {size_label(r.nbytes)}"
                 + (f"<br>{r.names[0]}" if r.count == 1 else "") for r in rs]
        fig.add_trace(go.Bar(y=[row_nodes] * len(rs), x=[r.count for r in rs], base=[r.start for r in rs],
                             customdata=[r.first_node for r in rs],       # what a click explains
                             orientation="h", name=rs[0].backend, marker_color=backend_colour(bid),
                             marker_line={"width": 0.5, "color": NEUTRAL_TEXT}, hovertext=hover,
                             hoverinfo="text", legendgroup=rs[0].backend))
    # every split one bar of a single trace (colour per backend): a graph with hundreds of splits stays one trace
    hover_splits = []
    for s in plan.splits:
        ins = "<br>".join(f"{i.name} from {i.src_backend} ({size_label(i.nbytes)}{', weight' if i.is_weight else ''})"
                          for i in s.inputs[:20]) or "no inputs"
        more = f"<br>… and {len(s.inputs) - 20} more" if len(s.inputs) > 20 else ""
        hover_splits.append(f"<b>split {s.index}</b> · {s.backend}<br>nodes {s.i_start}..{s.i_end - 1}"
                            f"<br>inputs ({len(s.inputs)}/{s.inputs_capacity}):<br>{ins}{more}")
    fig.add_trace(go.Bar(y=["splits"] * len(plan.splits), x=[max(s.i_end - s.i_start, 1) for s in plan.splits],
                         base=[s.i_start for s in plan.splits], orientation="h", name="splits",
                         marker={"color": [backend_colour(s.backend_id) for s in plan.splits],
                                 "pattern": {"shape": "/"}, "line": {"width": 1, "color": NEUTRAL_TEXT}},
                         showlegend=False, hovertext=hover_splits, hoverinfo="text",
                         customdata=[f"split:{s.index}" for s in plan.splits],     # a click lists its inputs
                         text=[f"{s.index}" for s in plan.splits], textposition="inside"))
    # split boundaries as one batch of shapes (add_vline per split is slow on big graphs)
    fig.update_layout(shapes=[{"type": "line", "xref": "x", "yref": "paper", "x0": s.i_start, "x1": s.i_start,
                               "y0": 0, "y1": 1, "line": {"dash": "dash", "color": NEUTRAL_TEXT, "width": 1}}
                              for s in plan.splits if s.index > 0])
    with_inputs = [s for s in plan.splits if s.inputs]
    if with_inputs:
        fig.add_trace(go.Scatter(
            x=[s.i_start for s in with_inputs], y=["copies"] * len(with_inputs), mode="markers+text",
            marker={"symbol": "triangle-down", "size": 11, "color": [backend_colour(s.backend_id) for s in with_inputs],
                    "line": {"width": 1, "color": NEUTRAL_TEXT}},
            text=[str(len(s.inputs)) for s in with_inputs], textposition="middle right",
            name="input copies", customdata=[f"split:{s.index}" for s in with_inputs],
            hovertext=[f"split {s.index} copies {len(s.inputs)} input(s), "
                       f"{size_label(sum(i.nbytes for i in s.inputs))}" for s in with_inputs],
            hoverinfo="text"))
    ticks = _spaced_ticks(group_starts(plan), plan.n_nodes, width) if collapse == "layer" else []
    fig.update_xaxes(title_text="node order", range=[-0.5, plan.n_nodes + 0.5], tickangle=0,
                     tickvals=[t[1] for t in ticks] or None, ticktext=[t[0] for t in ticks] or None)
    fig.update_yaxes(categoryorder="array", categoryarray=["copies", "splits", row_nodes][::-1])
    fig.update_layout(meta={"text": text.split_map_text(plan, collapse)})
    return _neutral_axes(fig)


def _alloc_kind(name: str, n_copies: int) -> str:
    if parse_copy_name(name) is None:
        return "tensors"
    return "pipeline copies" if n_copies > 1 else "split input copies"


def memory_layout(plan: Plan | None, buft: str | None = None) -> go.Figure:
    """Per buffer, each planned tensor a rectangle: x = its lifetime in node order [first, last],
    y = its address range (chunks stacked); the peak and, when known, the lower bound marked."""
    bufs = [b for b in (plan.buffers if plan else ()) if buft is None or b.buft == buft]
    cols = max(1, len(bufs))
    # the copies' legend sits above the plots: below them, with the x titles, it would squeeze the
    # plot area of this short figure to nothing (plotly then draws NaN paths)
    layout = base_layout("memory layout", height=360, barmode="overlay", bargap=0,
                         margin={"l": 60, "r": 20, "t": 70, "b": 40},
                         legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom",
                                 "font": {"color": NEUTRAL_TEXT}, "bgcolor": "rgba(0,0,0,0)"})
    # make_subplots(1, cols, horizontal_spacing=0.08) as plain layout entries (validated once, with the traces)
    gap = 0.08 if cols > 1 else 0.0
    w = (1.0 - gap * (cols - 1)) / cols
    notes: list[dict[str, Any]] = []
    for col in range(1, cols + 1):
        ax = "" if col == 1 else str(col)
        x0 = (col - 1) * (w + gap)
        layout[f"xaxis{ax}"] = {**neutral_axis(), "domain": [x0, x0 + w], "anchor": f"y{ax}",
                                "title": {"text": "node order", "font": {"color": NEUTRAL_TEXT}}}
        layout[f"yaxis{ax}"] = {**neutral_axis(), "domain": [0.0, 1.0], "anchor": f"x{ax}"}
        notes.append({"text": bufs[col - 1].buft if bufs else "", "x": x0 + w / 2, "y": 1.0, "xref": "paper",
                      "yref": "paper", "xanchor": "center", "yanchor": "bottom", "showarrow": False,
                      "font": {"size": 16}})
    layout["yaxis"]["title"] = {"text": "address (MiB)", "font": {"color": NEUTRAL_TEXT}}
    traces: list[dict[str, Any]] = []
    if plan is None:
        layout["meta"] = {"text": "no plan"}
        return go.Figure(data=traces, layout=layout)
    shapes: list[dict] = []
    legend_done: set[str] = set()
    for col, b in enumerate(bufs, start=1):
        allocs = [a for a in plan.allocs if a.buft == b.buft]
        bases = text.chunk_bases(b)
        colour = backend_colour(col - 1)
        # plain tensors, split input copies and pipeline copies (n_copies > 1) each one trace,
        # with its own fill pattern and legend entry: a copy is recognisable without its name
        kinds = (("tensors", "", 0.75), ("split input copies", "/", 0.9), ("pipeline copies", "x", 0.9))
        for kind, pattern, opacity in kinds:
            group = [a for a in allocs if _alloc_kind(a.name, plan.n_copies) == kind]
            if not group:
                continue
            starts = [a.first for a in group]
            widths = [a.last - a.first + 1 for a in group]
            addrs = [text.address(a, bases) for a in group]
            ax = "" if col == 1 else str(col)
            traces.append({
                "type": "bar", "x": [st + wd / 2 for st, wd in zip(starts, widths)], "width": widths,
                "base": [x / MIB for x in addrs], "y": [a.size / MIB for a in group],
                "name": kind if kind != "tensors" else b.buft, "xaxis": f"x{ax}", "yaxis": f"y{ax}",
                "marker": {"color": colour, "opacity": opacity, "line": {"width": 0.5, "color": NEUTRAL_TEXT},
                           **({"pattern": {"shape": pattern, "fgcolor": NEUTRAL_TEXT}} if pattern else {})},
                "customdata": [a.name for a in group],           # what a click explains
                "legendgroup": kind, "showlegend": kind != "tensors" and kind not in legend_done,
                "hovertext": [f"<b>{a.name}</b>{' (' + kind[:-3] + 'y)' if kind != 'tensors' else ''}"
                              f"<br>offset {nbytes_exact(x)} (chunk {a.chunk})"
                              f"<br>size {size_label(a.size)}<br>live nodes {a.first}..{a.last}"
                              + (f"<br>in place of {a.inplace_of}" if a.inplace_of else "")
                              for a, x in zip(group, addrs)], "hoverinfo": "text"})
            legend_done.add(kind)
        peak = max((text.address(a, bases) + a.size for a in allocs), default=0)
        marks = [("peak", peak, "solid"), ("allocated", b.allocated, "dot")]
        if b.lower_bound is not None:
            marks.append(("lower bound", b.lower_bound, "dash"))
        # equal values share one line and one label ("peak = allocated = lower bound 1.39 MiB")
        lines: list[tuple[str, int, str]] = []
        for label, val, dash in marks:
            same = next((i for i, m in enumerate(lines) if m[1] == val), None)
            if same is None:
                lines.append((label, val, dash))
            else:
                lines[same] = (f"{lines[same][0]} = {label}", val, lines[same][2])
        ax = "" if col == 1 else str(col)
        top = max((v for _, v, _ in lines), default=0)
        labels: list[tuple[int, str]] = []       # nearby lines share one label, or the texts overlap
        for label, val, dash in sorted(lines, key=lambda m: -m[1]):
            shapes.append({"type": "line", "xref": f"x{ax} domain", "yref": f"y{ax}", "x0": 0, "x1": 1,
                           "y0": val / MIB, "y1": val / MIB,
                           "line": {"dash": dash, "color": NEUTRAL_TEXT, "width": 1}})
            if labels and labels[-1][0] - val <= 0.06 * top:
                labels[-1] = (labels[-1][0], f"{labels[-1][1]} · {label} {mib(val)}")
            else:
                labels.append((val, f"{label} {mib(val)}"))
        for at, label in labels:
            notes.append({"xref": f"x{ax} domain", "yref": f"y{ax}", "x": 0, "y": at / MIB, "xanchor": "left",
                          "yanchor": "bottom", "showarrow": False, "text": label,
                          "font": {"size": 10, "color": NEUTRAL_TEXT}})
    layout.update(shapes=shapes, annotations=notes, meta={"text": text.memory_layout_text(plan)})
    return go.Figure(data=traces, layout=layout)


def fit_probes(result: FitResult) -> go.Figure:
    """``common_params_fit_impl``'s probes in order: the memory each one uses per device
    (``llama_get_memory_breakdown``: weights + KV cache + pp compute buffers) against the target
    per device, free − margin (``--fit-target``; devices with equal targets share one line). Each
    probe trace's ``customdata`` holds the exact bytes per probe; hover shows the probe's parameters
    and its model/context/compute split. The probe of the chosen parameters is a star
    (``layout.meta["chosen"]``, 1-based)."""
    names = [m.name for m in result.memory] or (["Host"] if result.host is not None else [])
    targets = result.limits
    xs = list(range(1, len(result.probes) + 1))
    labels = [text.fit_probe_label(p.params) for p in result.probes]
    chosen = result.chosen_probe
    traces: list[dict[str, Any]] = []
    for d, name in enumerate(names):
        rows = [p.breakdown.devices[d] if result.memory else p.breakdown.host for p in result.probes]
        colour = backend_colour(d)
        traces.append({
            "type": "scatter", "x": xs, "y": [r.total / MIB for r in rows], "mode": "lines+markers",
            "name": f"{name} used", "customdata": [[r.total] for r in rows],
            "marker": {"color": colour, "size": [16 if i == chosen else 9 for i in range(len(xs))],
                       "symbol": ["star" if i == chosen else "circle" for i in range(len(xs))]},
            "line": {"color": colour, "width": 2},
            "hovertext": [f"<b>probe {x}</b>{' (chosen)' if x - 1 == chosen else ''}: {lab}<br>{name}: "
                          f"{size_label(r.total)}<br>model {mib(r.model)}, context {mib(r.context)}, "
                          f"compute {mib(r.compute)}" for x, lab, r in zip(xs, labels, rows)],
            "hoverinfo": "text", "meta": {"device": name, "kind": "used"}})
    # one dashed line per distinct target: devices with the same free memory and margin share it (in a
    # neutral colour) instead of drawing lines on top of each other
    by_target: dict[int, list[int]] = {}
    for d in range(min(len(names), len(targets))):
        by_target.setdefault(targets[d], []).append(d)
    for target, devs in by_target.items():
        who = ", ".join(names[d] for d in devs)
        traces.append({
            "type": "scatter", "x": [0.5, len(xs) + 0.5], "y": [target / MIB] * 2, "mode": "lines",
            "name": f"{who} target (free − margin)", "customdata": [[target], [target]],
            "line": {"color": backend_colour(devs[0]) if len(devs) == 1 else NEUTRAL_TEXT, "width": 1.5,
                     "dash": "dash"}, "hoverinfo": "name+y",
            "meta": {"devices": [names[d] for d in devs], "kind": "target"}})
    title = (f"fit probes: {result.printed}" if result.printed else f"fit probes ({result.status})")
    layout = base_layout(title[:120], height=420)
    two_lines = len(xs) <= 6    # a short search: each tick also shows the probe's parameters
    layout["xaxis"].update(title={"text": "probe (common_get_device_memory_data_impl, in order)",
                                  "font": {"color": NEUTRAL_TEXT}},
                           tickmode="array", tickvals=xs, ticktext=[f"{x}<br>{lab}" if two_lines else str(x)
                                                                    for x, lab in zip(xs, labels)])
    layout["yaxis"].update(title={"text": "MiB per device", "font": {"color": NEUTRAL_TEXT}}, rangemode="tozero")
    # the legend goes below the axis title (and below the two-line tick labels)
    layout["legend"].update(yanchor="top", y=-0.42 if two_lines else -0.3)
    layout["margin"]["b"] = 130 if two_lines else 110
    layout["meta"] = {"printed": result.printed, "status": result.status, "n_probes": len(xs),
                      "chosen": None if chosen is None else chosen + 1}
    return go.Figure(data=traces, layout=layout)


__all__ = ["LOGGED", "badge", "buffer_sizes", "fit_probes", "memory_layout", "split_map", "timeline"]
