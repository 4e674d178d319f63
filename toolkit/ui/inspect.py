"""HTML of the dashboard's inspect panel (one node explained) and compare view (two reserves).

Both read frozen data only (:class:`toolkit.sched.explain.NodeExplanation`,
:class:`toolkit.compare.EventDiff`); stable classes and data attributes let a browser test read
the answer in one piece. The text forms are ``NodeExplanation.to_text`` and ``text.diff_text``.
"""

from __future__ import annotations

import html

from toolkit.compare import EventDiff, InputChange
from toolkit.sched.explain import NodeExplanation, parse_copy_name
from toolkit.sched.plan import Plan
from toolkit.ui.style import DECISION_COLOUR, NEUTRAL_TEXT, mib, nbytes_exact, onoff

MAX_ROWS = 40     # rows per table; the rest is counted, the text form has all of them

_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0"
_CELL = f"border:1px solid {NEUTRAL_TEXT}55;padding:1px 6px;text-align:left"


def _e(x: object) -> str:
    return html.escape(str(x))


def _table(head: list[str], rows: list[list[str]], cls: str) -> str:
    shown = rows[:MAX_ROWS]
    more = f"<div style='opacity:0.7'>… and {len(rows) - MAX_ROWS} more</div>" if len(rows) > MAX_ROWS else ""
    th = "".join(f"<th style='{_CELL}'>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{c}</td>" for c in r) + "</tr>" for r in shown)
    return f"<table class='{cls}' style='{_TABLE}'><tr>{th}</tr>{body}</table>{more}"


def explanation_html(e: NodeExplanation) -> str:
    n = e.node
    shape = "×".join(str(d) for d in n.ne) if n.ne else "?"
    srcs = [[_e(s.name), _e(s.kind), _e(s.backend or "-"), _e(s.copy or "-")] for s in e.sources]
    rows = [f"<b>{_e(n.name)}</b> · {_e(n.op)}{' (view)' if n.is_view else ''} · {_e(n.type)} [{_e(shape)}] · "
            f"{nbytes_exact(n.nbytes)} · backend <b>{_e(n.backend)}</b> · split {n.split if n.split >= 0 else '-'}",
            f"cause: <b class='toolkit-explain-cause'>{_e(n.cause.value)}</b> ({_e(e.pass_name)}): {_e(e.rule)}"]
    if e.followed:
        rows.append(f"followed: <span class='toolkit-explain-followed'>{_e(', '.join(e.followed))}</span>")
    if e.copies_in:
        rows.append(f"copies made for it: {_e(', '.join(e.copies_in))}")
    if e.copies_out:
        rows.append("output copied to: " + _e(", ".join(f"split {c.split} ({c.backend})" for c in e.copies_out)))
    a = e.alloc
    if a is None:
        rows.append("not planned by the graph allocator (a view, or in a pre-allocated buffer)")
    else:
        rows.append(f"{_e(a.buft)} chunk {a.chunk} · offset {nbytes_exact(a.offset)} · size {nbytes_exact(a.size)} · "
                    f"live {'leaf phase' if a.first < 0 else a.first}..{a.last} (graph_copy positions)"
                    + (f" · in place of {_e(a.inplace_of)}" if a.inplace_of else ""))
    return (f"<div class='toolkit-explain' data-node='{_e(n.name)}' data-index='{n.index}' "
            f"data-cause='{_e(n.cause.value)}' data-pass='{_e(e.pass_name)}' data-backend='{_e(n.backend)}' "
            f"data-followed='{_e(','.join(e.followed))}'>"
            + "<br>".join(rows) + (_table(["source", "kind", "on", "read through copy"], srcs, "toolkit-explain-srcs")
                                   if srcs else "") + "</div>")


def tensor_html(plan: Plan, name: str) -> str:
    """A planned tensor that is not a node: a split input copy or a graph input (leaf)."""
    allocs = [a for a in plan.allocs if a.name == name]
    cp = parse_copy_name(name)
    if cp is not None:
        what = (f"copy {cp.copy} of <b>{_e(cp.src)}</b> on {_e(cp.backend)} (a split input"
                + (f"; one of n_copies={plan.n_copies} pipeline copies" if plan.n_copies > 1 else "") + ")")
    else:
        what = f"<b>{_e(name)}</b>: a leaf (graph input) planned in the compute buffer"
    readers = [n.name for n in plan.nodes if name in n.srcs]
    rows = [what]
    if readers:
        rows.append(f"read by: {_e(', '.join(readers[:10]))}" + (" …" if len(readers) > 10 else ""))
    for a in allocs:
        rows.append(f"{_e(a.buft)} chunk {a.chunk} · offset {nbytes_exact(a.offset)} · size {nbytes_exact(a.size)} · "
                    f"live {'leaf phase' if a.first < 0 else a.first}..{a.last}")
    return (f"<div class='toolkit-explain' data-node='{_e(name)}' data-cause='{'split input copy' if cp else 'leaf'}'>"
            + "<br>".join(rows) + "</div>")


def split_html(plan: Plan, index: int) -> str:
    """One split: its backend and nodes, and each input copied in with the copies the scheduler made."""
    sp = next((s for s in plan.splits if s.index == index), None)
    if sp is None:
        return f"<span class='toolkit-inspect-error'>split {index} is not in the plan</span>"
    readers: dict[str, list[str]] = {}
    for n in plan.nodes:
        if n.split == sp.index:
            for src in n.srcs:
                cp = parse_copy_name(src)
                if cp is not None and cp.backend == sp.backend:
                    readers.setdefault(cp.src, []).append(n.name)
    rows = [[_e(i.name) + (" <b>(weight)</b>" if i.is_weight else ""), _e(i.src_backend), nbytes_exact(i.nbytes),
             _e(", ".join(f"{sp.backend}#{i.name}#{c}" for c in range(plan.n_copies))),
             _e(", ".join(readers.get(i.name, [])[:4]))] for i in sp.inputs]
    head = (f"<b>split {sp.index}</b> · {_e(sp.backend)} · nodes {sp.i_start}..{sp.i_end - 1} · "
            f"{len(sp.inputs)} input(s) of capacity {sp.inputs_capacity} · "
            f"{nbytes_exact(sum(i.nbytes for i in sp.inputs))} copied per run")
    return (f"<div class='toolkit-explain toolkit-explain-split' data-split='{sp.index}' "
            f"data-backend='{_e(sp.backend)}' data-inputs='{len(sp.inputs)}'>{head}"
            + (_table(["input", "from", "bytes", "copies", "read by"], rows, "toolkit-explain-inputs") if rows else "")
            + "</div>")


def _signed(n: int) -> str:
    if n == 0:
        return "="
    return f"<b>{'+' if n > 0 else ''}{mib(n)}</b>"


def _inputs_rows(items: tuple[InputChange, ...]) -> list[list[str]]:
    return [[_e(i.name) + (" <b>(weight)</b>" if i.is_weight else ""), f"{_e(i.from_backend)} → {_e(i.to_backend)}",
             nbytes_exact(i.nbytes), _e(i.reader or "?"), _e(i.reader_cause or "?")] for i in items]


def diff_html(d: EventDiff) -> str:
    colour = DECISION_COLOUR.get(d.decision_b, NEUTRAL_TEXT)
    params = ", ".join(f"{_e(f)} {_e(onoff(x) if isinstance(x, bool) else x)} → "
                       f"{_e(onoff(y) if isinstance(y, bool) else y)}" for f, x, y in d.params) or "same sched params"
    why = "; ".join(d.reasons_b) or "same params"
    if d.decision_b == "reused":
        host = f"host metadata saved {mib(d.host_metadata_saved_b)} (scheduler kept)"
    elif d.decision_b in ("rebuilt", "fallback"):
        host = (f"host metadata cost {mib(d.host_metadata_cost_b)} (held {mib(d.host_metadata_held_a)} → "
                f"{mib(d.host_metadata_held_b)})")
    else:
        host = "no host metadata change"
    bufs = [[_e(b.buft), mib(b.allocated_a), mib(b.allocated_b), _signed(b.allocated_change), mib(b.needed_a),
             mib(b.needed_b), _signed(b.needed_change)] for b in d.buffers]
    counts = [[_e(c.name), str(c.a), str(c.b), (f"<b>{c.change:+d}</b>" if c.change else "=")] for c in d.counts]
    counts += [[f"{_e(', '.join(only))} (only #{side})", "", "", ""]
               for side, only in ((d.a, d.graphs_only_a), (d.b, d.graphs_only_b)) if only]
    memory = [[_e(m.group), _e(m.buffer), mib(m.a), mib(m.b), _signed(m.change)] for m in d.memory]
    parts = [
        f"<div><b>#{d.a}</b> ({_e(d.decision_a)}) → <b>#{d.b}</b> "
        f"<span class='toolkit-diff-decision' style='color:{colour};font-weight:700'>{_e(d.decision_b.upper())}</span>"
        f": {_e(why)} · {params} · {_e(host)}</div>",
        "<div style='display:flex;gap:16px;flex-wrap:wrap'>",
        _table(["buffer type", f"allocated #{d.a}", f"allocated #{d.b}", "change", f"needed #{d.a}",
                f"needed #{d.b}", "change"], bufs, "toolkit-diff-buffers"),
        _table(["graph", f"#{d.a}", f"#{d.b}", "change"], counts, "toolkit-diff-counts"),
        _table(["memory", "buffer", f"#{d.a}", f"#{d.b}", "change"], memory, "toolkit-diff-memory"),
        "</div>",
    ]
    if d.has_plans:
        changes = [[_e(c.name), _e(c.op), f"{_e(c.before)} ({_e(c.cause_before)})",
                    f"{_e(c.after)} ({_e(c.cause_after)})"] for c in d.backend_changes]
        parts.append(f"<div><b>{len(changes)}</b> node(s) changed backend</div>")
        if changes:
            parts.append(_table(["node", "op", f"#{d.a}", f"#{d.b}"], changes, "toolkit-diff-moves"))
        head = ["input", "copy", "bytes", "read by", "reader's cause"]
        parts.append(f"<div><b>{len(d.inputs_added)}</b> split input(s) appeared "
                     f"({len(d.weights_added)} weights)</div>")
        if d.inputs_added:
            parts.append(_table(head, _inputs_rows(d.inputs_added), "toolkit-diff-added"))
        parts.append(f"<div><b>{len(d.inputs_removed)}</b> split input(s) disappeared "
                     f"({len(d.weights_removed)} weights)</div>")
        if d.inputs_removed:
            parts.append(_table(head, _inputs_rows(d.inputs_removed), "toolkit-diff-removed"))
    else:
        parts.append("<div>no plan on one side: node and split input changes unavailable</div>")
    # the splits of each graph both reserves planned (data-splits-pp-a, data-splits-tg-b, ...)
    splits = "".join(f"data-splits-{_e(g)}-a='{d.count(f'splits {g}').a}' data-splits-{_e(g)}-b='"
                     f"{d.count(f'splits {g}').b}' " for g in d.graphs)
    return (f"<div class='toolkit-diff' data-a='{d.a}' data-b='{d.b}' data-decision='{_e(d.decision_b)}' "
            f"{splits}data-moved='{len(d.backend_changes)}' "
            f"data-weights-added='{len(d.weights_added)}' data-weights-removed='{len(d.weights_removed)}'>"
            + "".join(parts) + "</div>")


__all__ = ["diff_html", "explanation_html", "split_html", "tensor_html"]
