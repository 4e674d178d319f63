"""Text forms of every dashboard view: what tests, logs and terminals read.

Each function reads ReserveEvents / Plans only; the figures in ``figures.py`` draw the same data.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from toolkit.compare import EventDiff
from toolkit.context import Reason, ReserveEvent, SchedParams
from toolkit.fit import FitResult, ProbeParams
from toolkit.reuse import COMPUTE_GROUP
from toolkit.sched.plan import BufferPlan, Plan, TensorAlloc
from toolkit.ui.layers import Collapse, node_runs
from toolkit.ui.style import DECISION_COLOUR, MIB, mib, nbytes_exact, onoff


def params_text(p: SchedParams | None) -> str:
    if p is None:
        return "none"
    return f"max_nodes={p.max_nodes} parallel={onoff(p.parallel)} op_offload={onoff(p.op_offload)}"


def total_ms(ev: ReserveEvent) -> float:
    """The reserve's wall time: ``total`` when the context recorded it, else the sum of its phases."""
    t = ev.timings_ms
    if "total" in t:
        return float(t["total"])
    return float(sum(t.values()))


def timings_text(ev: ReserveEvent) -> str:
    return ", ".join(f"{k} {v:.2f} ms" for k, v in ev.timings_ms.items()) or "no timings"


def _reason(r: Reason) -> str:
    if r.field == "scheduler" and r.before is None:
        return "first scheduler"        # the context had none: nothing to reuse
    return str(r)


def reasons_text(ev: ReserveEvent) -> str:
    if ev.reasons:
        return "; ".join(_reason(r) for r in ev.reasons)
    if ev.previous is None and ev.decision != "error":
        return "first scheduler"
    if ev.decision == "reused" and ev.previous is not None:
        # nothing differed: say what the rule compared (llama_context::sched_new of #32009: max_nodes <= held,
        # same flags)
        return f"max_nodes {ev.params.max_nodes} <= {ev.previous.max_nodes}, same flags"
    return ""


def held_host_metadata(events: Sequence[ReserveEvent]) -> int:
    """Host metadata of the live scheduler: what the newest rebuild allocated (reuse keeps it)."""
    for ev in reversed(events):
        if ev.decision in ("rebuilt", "fallback") and ev.host_metadata_bytes:
            return ev.host_metadata_bytes
    return 0


def effect_text(ev: ReserveEvent) -> str:
    """What the decision cost or saved (keeping the scheduler, as llama.cpp #32009 does, avoids re-allocating host
    metadata and buffers)."""
    planning = f"planning {total_ms(ev):.2f} ms"
    if ev.decision == "reused":
        return f"saved {mib(ev.saved_host_metadata_bytes)} host metadata · {planning}"
    if ev.decision in ("rebuilt", "fallback"):
        return f"cost {mib(ev.host_metadata_bytes)} host metadata · {planning}"
    return "previous state kept"


def badge_text(ev: ReserveEvent | None) -> str:
    """One line: ``REUSED · max_nodes 1024 <= 8192 · saved 157.81 MiB host metadata · planning 3.10 ms``."""
    if ev is None:
        return "NO RESERVE YET"
    head = ev.decision.upper()
    parts = [head]
    why = reasons_text(ev)
    if why:
        parts.append(why)
    if ev.decision == "error":
        parts.append(ev.error or "reserve failed")
    parts.append(effect_text(ev))
    if ev.decision == "fallback":
        parts.extend(ev.warnings or ("pipeline parallelism disabled",))
    return " · ".join(parts)


def badge_html(ev: ReserveEvent | None, error: str | None = None, held_max_nodes: int | None = None) -> str:
    """The badge as HTML with stable classes (``toolkit-badge``, ``toolkit-badge-<decision>``) and
    data attributes (decision, event index, requested and held max_nodes) that a browser test reads
    in one piece; ``error`` overrides with an input error."""
    if error is not None:
        decision, line = "error", f"ERROR · {error} · previous state kept"
    elif ev is None:
        decision, line = "none", badge_text(None)
    else:
        decision, line = ev.decision, badge_text(ev)
    colour = DECISION_COLOUR.get(decision, "#888888")
    head, _, rest = line.partition(" · ")
    trig = f"<div class='toolkit-badge-trigger' style='opacity:0.75'>{html.escape(ev.trigger)}</div>" \
        if ev is not None and error is None and ev.trigger else ""
    return (
        f"<div class='toolkit-badge toolkit-badge-{decision}' data-decision='{decision}' "
        f"data-index='{ev.index if ev is not None else -1}' "
        f"data-requested='{ev.params.max_nodes if ev is not None else ''}' data-held='{held_max_nodes or ''}' "
        f"style='border-left:6px solid {colour};padding:4px 10px;font-family:var(--jp-ui-font-family,sans-serif)'>"
        f"<span class='toolkit-badge-decision' style='font-weight:700;color:{colour};font-size:1.2em'>"
        f"{html.escape(head)}</span> "
        f"<span class='toolkit-badge-detail'>{html.escape(rest)}</span>{trig}</div>"
    )


def timeline_text(events: Sequence[ReserveEvent]) -> str:
    lines = [f"{len(events)} reserve events"]
    for ev in events:
        lines.append(f"#{ev.index:<3} {ev.decision.upper():<8} {total_ms(ev):8.2f} ms  "
                     f"{params_text(ev.params)}  [{ev.trigger}] {reasons_text(ev)}")
    return "\n".join(lines)


def _latest_with_buffers(events: Sequence[ReserveEvent]) -> ReserveEvent | None:
    for ev in reversed(events):
        if ev.buffers:
            return ev
    return None


def graphs_text(ev: ReserveEvent) -> str:
    """The graphs a reserve planned, by label: ``pp 68 nodes 1 splits, tg 68 nodes 1 splits``."""
    return ", ".join(f"{label} {g.n_nodes} nodes {g.n_splits} splits" for label, g in ev.graphs.items())


def buffers_text(events: Sequence[ReserveEvent]) -> str:
    """Per buffer type of the newest successful reserve: compute allocated and needed by each graph,
    then every other memory group's buffers (model, KV, KV-SWA, ..., output)."""
    ev = _latest_with_buffers(events)
    if ev is None:
        return "no buffers yet"
    lines = [f"buffers after reserve #{ev.index} ({ev.decision})"]
    for b in ev.buffers:
        each = ", ".join(f"{label} {nbytes_exact(n)}" for label, n in b.needed.items())
        lines.append(f"  {b.backend:>12} {b.buft:>12} compute allocated {mib(b.allocated):>12} "
                     f"needed {mib(b.needed_max):>12} ({each})")
    for group, bufs in ev.memory.items():
        if group == COMPUTE_GROUP:   # the compute lines above
            continue
        for name, n in bufs.items():
            lines.append(f"  {group:>12} {name:>12} {mib(n):>12}")
    lines.append(f"  sched host metadata {mib(held_host_metadata(events[: events.index(ev) + 1]))}")
    return "\n".join(lines)


def split_map_text(plan: Plan, collapse: Collapse = "layer") -> str:
    lines = [f"split map: {plan.n_nodes} nodes, {plan.n_leafs} leafs, {plan.n_splits} splits, "
             f"n_copies {plan.n_copies}"]
    for s in plan.splits:
        ins = ", ".join(f"{i.name} ({i.src_backend}, {nbytes_exact(i.nbytes)})" for i in s.inputs)
        lines.append(f"  split {s.index}: {s.backend} nodes {s.i_start}..{s.i_end - 1}"
                     f" inputs[{len(s.inputs)}]: {ins or '-'}")
    for r in node_runs(plan, collapse):
        lines.append(f"  {r.group:>10} {r.backend:>10} nodes {r.start}..{r.end - 1} ({r.count}) {r.summary()}")
    return "\n".join(lines)


def chunk_bases(b: BufferPlan) -> list[int]:
    """Start of each chunk when a buffer's chunks are drawn one above the other (ggml's vbuffer: one backend
    buffer per chunk)."""
    bases, acc = [], 0
    for c in b.chunks:
        bases.append(acc)
        acc += c
    return bases


def address(a: TensorAlloc, bases: list[int]) -> int:
    return (bases[a.chunk] if 0 <= a.chunk < len(bases) else 0) + a.offset


def memory_layout_text(plan: Plan) -> str:
    lines = []
    for b in plan.buffers:
        allocs = [a for a in plan.allocs if a.buft == b.buft]
        bases = chunk_bases(b)
        peak = max((address(a, bases) + a.size for a in allocs), default=0)
        lb = f", lower bound {mib(b.lower_bound)}" if b.lower_bound is not None else ""
        lines.append(f"{b.buft}: {len(allocs)} tensors, peak {mib(peak)}, needed {mib(b.needed)}, "
                     f"allocated {mib(b.allocated)}{lb}")
    return "\n".join(lines) or "no buffers"


def _signed(n: int) -> str:
    return f"{'+' if n > 0 else ''}{mib(n)}" if n else "unchanged"


def diff_text(d: EventDiff) -> str:
    """The compare view as text: ``toolkit.compare.compare(a, b)`` line by line."""
    lines = [f"compare reserve #{d.a} ({d.decision_a}) -> #{d.b} ({d.decision_b})"]
    if d.params:
        lines.append("  params: " + ", ".join(
            f"{f} {onoff(x) if isinstance(x, bool) else x} -> {onoff(y) if isinstance(y, bool) else y}"
            for f, x, y in d.params))
    else:
        lines.append("  params: same max_nodes, parallel and op_offload")
    why = "; ".join(d.reasons_b) or "same params"
    lines.append(f"  #{d.b} {d.decision_b.upper()}: {why} [{d.trigger_b}]")
    if d.decision_b == "reused":
        lines.append(f"  host metadata: saved {mib(d.host_metadata_saved_b)} (scheduler kept)")
    elif d.decision_b in ("rebuilt", "fallback"):
        lines.append(f"  host metadata: cost {mib(d.host_metadata_cost_b)} "
                     f"(held {mib(d.host_metadata_held_a)} -> {mib(d.host_metadata_held_b)})")
    for b in d.buffers:
        lines.append(f"  {b.buft:>12} allocated {mib(b.allocated_a)} -> {mib(b.allocated_b)} "
                     f"({_signed(b.allocated_change)}), needed {mib(b.needed_a)} -> {mib(b.needed_b)} "
                     f"({_signed(b.needed_change)})")
    for m in d.memory:
        lines.append(f"  {m.group:>12} {m.buffer:>12} {mib(m.a)} -> {mib(m.b)} ({_signed(m.change)})")
    lines.append("  " + ", ".join(f"{c.name} {c.a} -> {c.b}" for c in d.counts))
    for side, only in ((d.a, d.graphs_only_a), (d.b, d.graphs_only_b)):
        if only:
            lines.append(f"  only #{side} planned graph(s): {', '.join(only)}")
    if not d.has_plans:
        lines.append("  (no plan on one side: node and split input changes unavailable)")
        return "\n".join(lines)
    lines.append(f"  {len(d.backend_changes)} node(s) changed backend")
    for c in d.backend_changes:
        lines.append(f"    {c.name} ({c.op}): {c.before} ({c.cause_before}) -> {c.after} ({c.cause_after})")
    for label, items in (("appeared", d.inputs_added), ("disappeared", d.inputs_removed)):
        lines.append(f"  {len(items)} split input(s) {label}")
        for i in items:
            lines.append(f"    {i.name}{' (weight)' if i.is_weight else ''} {i.from_backend} -> {i.to_backend} "
                         f"{nbytes_exact(i.nbytes)}, read by {i.reader or '?'} ({i.reader_cause or '?'})")
    return "\n".join(lines)


# ---- fit to budget (common_params_fit_impl's probes, toolkit.fit) --------------------------------

def fit_probe_label(p: ProbeParams) -> str:
    """One probe's parameters as llama.cpp flags: ``-c 4096 -ngl 28``, ``-ts 17,16``, ``-ot ×14``."""
    ngl = "all" if p.n_gpu_layers < 0 else str(p.n_gpu_layers)
    out = f"-c {p.n_ctx} -ngl {ngl}"
    if p.tensor_split:
        out += " -ts " + ",".join(f"{x:g}" for x in p.tensor_split)
    if p.tensor_overrides:
        out += f" -ot ×{len(p.tensor_overrides)}"
    return out


def fit_probes_text(result: FitResult) -> str:
    """Each probe of ``common_params_fit_impl`` (``common_get_device_memory_data_impl``): its
    parameters and the MiB it uses per device, then the target per device (free − margin)."""
    names = [m.name for m in result.memory] or ["Host"]
    lines = [f"{'#':>3s}  {'probe':34s} " + " ".join(f"{n:>10s}" for n in names)]
    for i, p in enumerate(result.probes, 1):
        used = [p.used(d) for d in range(len(result.memory))] or [p.breakdown.host.total]
        lines.append(f"{i:3d}  {fit_probe_label(p.params):34s} " + " ".join(f"{u / MIB:10.2f}" for u in used))
    lines.append(f"{'':3s}  {'target (free - margin)':34s} "
                 + " ".join(f"{t / MIB:10.2f}" for t in result.limits))
    return "\n".join(lines)

