"""Figure builders and their text forms, on ReserveEvents / Plans built by hand.

The sizes below are arbitrary inputs (not claims about llama.cpp); the assertions check that
the figures draw exactly the data they were given.
"""

from __future__ import annotations

import dataclasses
import json

import plotly.graph_objects as go
import pytest

from toolkit.compare import compare
from toolkit.explain import LoggedBuffer
from toolkit.reuse import BufferSize, GraphRecord, Reason, ReserveEvent, SchedParams
from toolkit.sched.plan import BufferPlan, Cause, NodePlacement, Plan, SplitInfo, SplitInput, TensorAlloc
from toolkit.ui import figures, text
from toolkit.ui.layers import group_starts, layer_labels, layer_of, node_runs
from toolkit.ui.style import DECISION_COLOUR, MIB

BACKENDS = ("CUDA0", "CUDA1", "CPU")
LAYER_OPS = (("attn_norm", "RMS_NORM"), ("Qcur", "MUL_MAT"), ("Kcur", "MUL_MAT"), ("kq", "MUL_MAT"),
             ("kq_soft_max", "SOFT_MAX"), ("ffn_swiglu", "GLU"), ("l_out", "ADD"))


def sample_plan(n_layer: int = 4, lower_bound: int | None = 3 * MIB) -> Plan:
    """inp_embd on CPU, the first half of the layers on CUDA0, the rest and the head on CUDA1."""
    names: list[tuple[str, str, int, Cause]] = [("inp_embd", "GET_ROWS", 2, Cause.INPUT)]
    for il in range(n_layer):
        bid = 0 if il < n_layer // 2 else 1
        for base, op in LAYER_OPS:
            names.append((f"{base}-{il}", op, bid, Cause.WEIGHT if op == "MUL_MAT" else Cause.EXPAND_DOWN))
    names += [("result_norm", "RMS_NORM", 1, Cause.EXPAND_DOWN), ("result_output", "MUL_MAT", 1, Cause.WEIGHT)]
    nodes, splits, allocs = [], [], []
    split, prev = -1, -1
    for i, (name, op, bid, cause) in enumerate(names):
        if bid != prev:
            split += 1
            prev = bid
        nodes.append(NodePlacement(i, name, op, BACKENDS[bid], bid, cause, split, False, 4096 * (1 + i % 3)))
    bounds = [(0, 1, 2), (1, 1 + 7 * (n_layer // 2), 0), (1 + 7 * (n_layer // 2), len(names), 1)]
    for k, (a, b, bid) in enumerate(bounds):
        ins = () if k == 0 else (SplitInput(names[a - 1][0], BACKENDS[bounds[k - 1][2]], 8192, False),)
        splits.append(SplitInfo(k, BACKENDS[bid], bid, a, b, ins, 16))
    for i, n in enumerate(nodes):
        buft = n.backend
        allocs.append(TensorAlloc(n.name, buft, 0, (i % 4) * 65536, 65536, i, min(i + 2, len(nodes))))
    buffers = (BufferPlan("CUDA0", ("CUDA0",), 4 * MIB, 262144, (262144,), lower_bound),
               BufferPlan("CUDA1", ("CUDA1",), 4 * MIB, 262144, (262144,), None),
               BufferPlan("CPU", ("CPU",), 65536, 65536, (65536,), None))
    return Plan(len(nodes), 20, 1, tuple(nodes), tuple(splits), tuple(allocs), buffers)


def _event(i: int, decision: str, params: SchedParams, prev: SchedParams | None, reasons: tuple[Reason, ...],
           alloc: int, need: int, trigger: str, **kw: object) -> ReserveEvent:
    bufs = (BufferSize("CUDA0", "CUDA0", alloc, {"pp": need, "tg": need // 2}),
            BufferSize("CPU", "CPU", 65536, {"pp": 65536, "tg": 4096}))
    host = 1000 * params.max_nodes if decision in ("rebuilt", "fallback") else 0
    saved = 1000 * params.max_nodes if decision == "reused" else 0
    return ReserveEvent(i, decision, reasons, params, prev, trigger, {"sched_new": 0.5, "total": 2.0 + i},  # type: ignore[arg-type]
                        host, saved, 2 * params.max_nodes, (16,), bufs,
                        graphs={"pp": GraphRecord(300, 3), "tg": GraphRecord(290, 2)}, last_graph="pp",
                        memory={"model": {"CUDA0": 20 * MIB}, "KV": {"CUDA0": 8 * MIB}, "output": {"CPU": MIB},
                                "compute": {"CUDA0": alloc, "CPU": 65536}},
                        n_copies=1, pipeline_parallel=False, plan=sample_plan(), **kw)  # type: ignore[arg-type]


def sample_events() -> list[ReserveEvent]:
    p0 = SchedParams(4096, False, True)
    p1 = SchedParams(8192, False, True)
    p2 = SchedParams(2048, False, True)
    p3 = SchedParams(2048, True, True)
    return [
        _event(0, "rebuilt", p0, None, (), 3 * MIB, 3 * MIB, "initial"),
        _event(1, "rebuilt", p1, p0, (Reason("max_nodes", 4096, 8192),), 5 * MIB, 5 * MIB, "n_ubatch 512 -> 1024"),
        _event(2, "reused", p2, p1, (Reason("max_nodes", 8192, 2048),), 5 * MIB, 2 * MIB, "n_ubatch 1024 -> 256"),
        _event(3, "fallback", p2, p3, (Reason("parallel", True, False),), 2 * MIB, 2 * MIB, "parallel off -> on",
               warnings=("compute buffer allocation failed, retrying without pipeline parallelism",)),
        ReserveEvent(4, "error", (), p2, p2, "n_ctx 99999999", error="n_ctx 99999999 > n_ctx_train 8192"),
    ]


def test_layer_of_reads_llama_names() -> None:
    assert layer_of("Qcur-3") == 3
    assert layer_of("kq_soft_max-12") == 12
    assert layer_of("Qcur-3 (reshaped)") == 3
    assert layer_of("cache_k_l7 (view)") == 7
    assert layer_of("inp_embd") is None
    assert layer_of("node_12") is None
    assert layer_labels(sample_plan().nodes)[:2] == ["input", "L0"]
    assert layer_labels(sample_plan().nodes)[-1] == "output"


def test_node_runs_collapse_by_layer_and_split() -> None:
    plan = sample_plan(n_layer=4)
    runs = node_runs(plan, "layer")
    assert [r.group for r in runs] == ["input", "L0", "L1", "L2", "L3", "output"]
    assert sum(r.count for r in runs) == plan.n_nodes
    assert [r.backend for r in runs] == ["CPU", "CUDA0", "CUDA0", "CUDA1", "CUDA1", "CUDA1"]
    assert len(node_runs(plan, "split")) == plan.n_splits
    assert len(node_runs(plan, "none")) == plan.n_nodes
    assert runs[1].causes["weight"] == 3 and runs[1].ops["MUL_MAT"] == 3
    assert [g for g, _ in group_starts(plan)] == ["input", "L0", "L1", "L2", "L3", "output"]


@pytest.mark.parametrize("i,word", [(0, "REBUILT"), (1, "REBUILT"), (2, "REUSED"), (3, "FALLBACK"), (4, "ERROR")])
def test_badge_text_names_decision_reason_and_effect(i: int, word: str) -> None:
    ev = sample_events()[i]
    line = text.badge_text(ev)
    assert line.startswith(word)
    html = text.badge_html(ev)
    assert "toolkit-badge" in html and f"toolkit-badge-{ev.decision}" in html and word in html
    fig = figures.badge(ev)
    assert isinstance(fig, go.Figure)
    assert fig.layout.meta["decision"] == ev.decision
    assert fig.layout.annotations[0].font.color == DECISION_COLOUR[ev.decision]


def test_badge_reasons_and_costs() -> None:
    evs = sample_events()
    assert text.badge_text(evs[0]).startswith("REBUILT · first scheduler · cost 3.91 MiB host metadata")
    assert "max_nodes 8192 > 4096" in text.badge_text(evs[1])
    assert "max_nodes 2048 <= 8192" in text.badge_text(evs[2])
    assert "saved 1.95 MiB host metadata" in text.badge_text(evs[2])   # 1000 * 2048 bytes given above
    assert "parallel on \u2192 off" in text.badge_text(evs[3])
    assert "retrying without pipeline parallelism" in text.badge_text(evs[3])
    assert "n_ctx 99999999 > n_ctx_train 8192" in text.badge_text(evs[4])
    assert "planning 4.00 ms" in text.badge_text(evs[2])                # total 2.0 + index
    err = text.badge_html(evs[2], error="n_ubatch 1024 > n_batch 512")
    assert "toolkit-badge-error" in err and "n_ubatch 1024 &gt; n_batch 512" in err
    assert text.badge_text(None) == "NO RESERVE YET"


def test_timeline_one_marker_per_event_coloured_by_decision() -> None:
    evs = sample_events()
    fig = figures.timeline(evs)
    marker_traces = [t for t in fig.data if t.mode.startswith("markers")]
    assert sum(len(t.x) for t in marker_traces) == len(evs)
    for t in marker_traces:
        assert t.marker.color == DECISION_COLOUR[t.name]
        for x, h in zip(t.x, t.hovertext):
            ev = evs[x]
            assert ev.decision.upper() in h and ev.trigger in h and "max_nodes=" in h
    reused = next(t for t in marker_traces if t.name == "reused")
    assert list(reused.x) == [2] and list(reused.y) == [4.0]
    assert text.timeline_text(evs).splitlines()[3].startswith("#2   REUSED")


def test_a_live_view_draws_the_latest_events_only() -> None:
    # the dashboard passes last=HISTORY_SHOWN, so a long session does not slow every change
    evs = sample_events()
    fig = figures.timeline(evs, last=2)
    shown = sorted(x for t in fig.data if t.mode.startswith("markers") for x in t.x)
    assert shown == [evs[-2].index, evs[-1].index]
    assert fig.layout.title.text == f"reserve events (the latest 2 of {len(evs)})"
    assert figures.timeline(evs, last=len(evs)).layout.title.text == "reserve events"
    full, latest = figures.buffer_sizes(evs), figures.buffer_sizes(evs, last=1)
    hist = [t for t in full.data if t.xaxis == "x2"]
    assert hist and all(len(t.x) > 1 for t in hist)
    newest = [e for e in evs if e.buffers][-1]   # an error event has no buffers
    assert all(list(t.x) == [newest.index] for t in latest.data if t.xaxis == "x2")
    assert [t.to_plotly_json() for t in full.data if t.xaxis == "x"] == \
        [t.to_plotly_json() for t in latest.data if t.xaxis == "x"]   # the newest reserve's bars unchanged


def test_buffer_sizes_newest_and_history() -> None:
    evs = sample_events()
    fig = figures.buffer_sizes(evs)
    # the newest event is an error without buffers: the figure keeps the previous (fallback) state
    assert fig.layout.meta["event"] == 3
    by_name = {t.name: t for t in fig.data}
    alloc = by_name["compute allocated"]
    assert list(alloc.x) == ["CUDA0", "CPU"] and list(alloc.customdata) == [2 * MIB, 65536]
    assert list(alloc.y) == [2.0, 65536 / MIB]
    assert "2,097,152 B" in alloc.hovertext[0]
    assert list(by_name["KV"].customdata) == [8 * MIB]
    assert list(by_name["model"].customdata) == [20 * MIB]
    assert list(by_name["output"].x) == ["CPU"] and list(by_name["output"].customdata) == [MIB]
    # one "compute needed" trace per graph label, each that graph's own need
    assert list(by_name["compute needed (pp)"].customdata) == [2 * MIB, 65536]
    assert list(by_name["compute needed (tg)"].customdata) == [MIB, 4096]
    assert "compute" not in by_name   # the compute group is the compute bars
    # held host metadata: the fallback's fresh scheduler
    assert list(by_name["sched host metadata"].customdata) == [1000 * 2048]
    hist = by_name["CUDA0 allocated"]
    assert list(hist.x) == [0, 1, 2, 3] and list(hist.y) == [3.0, 5.0, 5.0, 2.0]
    # under reuse (#2) allocated stays at 5 MiB while the graph needs 2 MiB
    assert list(by_name["CUDA0 needed"].y) == [3.0, 5.0, 2.0, 2.0]
    assert "compute allocated" in text.buffers_text(evs)
    assert text.buffers_text([]) == "no buffers yet"
    assert figures.buffer_sizes([]).layout.meta["text"] == "no buffers yet"


def test_split_map_collapsed_and_detailed() -> None:
    plan = sample_plan(n_layer=4)
    fig = figures.split_map(plan)
    node_bars = [t for t in fig.data if isinstance(t, go.Bar) and t.y[0].startswith("nodes")]
    assert sum(sum(t.x) for t in node_bars) == plan.n_nodes
    assert {t.name for t in node_bars} == {"CPU", "CUDA0", "CUDA1"}
    (split_bars,) = [t for t in fig.data if isinstance(t, go.Bar) and t.y[0] == "splits"]   # one trace
    assert list(split_bars.base) == [s.i_start for s in plan.splits]
    assert len(fig.layout.shapes) == plan.n_splits - 1           # boundaries between splits
    copies = next(t for t in fig.data if t.name == "input copies")
    assert list(copies.x) == [s.i_start for s in plan.splits if s.inputs]
    assert any("weight" in h for t in node_bars for h in t.hovertext)   # placement cause on hover
    assert list(fig.layout.xaxis.ticktext) == ["input", "L0", "L1", "L2", "L3", "output"]
    detailed = figures.split_map(plan, collapse="none")
    assert sum(len(t.x) for t in detailed.data if isinstance(t, go.Bar) and t.y[0] == "nodes") == plan.n_nodes
    assert "split 1: CUDA0" in text.split_map_text(plan)
    assert figures.split_map(None).layout.meta["text"] == "no plan"


def test_memory_layout_rectangles_peak_and_lower_bound() -> None:
    plan = sample_plan()
    fig = figures.memory_layout(plan)
    bars = [t for t in fig.data if isinstance(t, go.Bar)]
    assert sum(len(t.x) for t in bars) == len(plan.allocs)
    cuda0 = next(t for t in bars if t.name == "CUDA0")
    first = next(a for a in plan.allocs if a.buft == "CUDA0")
    assert cuda0.base[0] == first.offset / MIB and cuda0.y[0] == first.size / MIB
    assert cuda0.width[0] == first.last - first.first + 1
    notes = [a.text for a in fig.layout.annotations]
    assert "lower bound 3.00 MiB" in notes and "peak 0.25 MiB" in notes
    assert sum("lower bound" in n for n in notes) == 1        # only CUDA0 has one
    assert "peak = allocated 0.06 MiB" in notes                # CPU: one 65,536 B tensor in a 65,536 B buffer
    assert "CUDA0: 14 tensors, peak 0.25 MiB" in text.memory_layout_text(plan)
    only = figures.memory_layout(plan, buft="CPU")
    assert [t.name for t in only.data if isinstance(t, go.Bar)] == ["CPU"]


def test_figures_are_theme_neutral_and_serialisable() -> None:
    evs = sample_events()
    plan = sample_plan()
    for fig in (figures.badge(evs[2]), figures.timeline(evs), figures.buffer_sizes(evs),
                figures.split_map(plan), figures.memory_layout(plan)):
        assert fig.layout.paper_bgcolor == "rgba(0,0,0,0)" and fig.layout.plot_bgcolor == "rgba(0,0,0,0)"
        assert fig.layout.template.layout.paper_bgcolor is None or fig.layout.paper_bgcolor
        json.loads(fig.to_json())


def _grouped_event(graphs: dict[str, GraphRecord], memory: dict[str, dict[str, int]]) -> ReserveEvent:
    labels = list(graphs)
    bufs = (BufferSize("CUDA0", "CUDA0", 4 * MIB, {g: (k + 1) * MIB for k, g in enumerate(labels)}),)
    return ReserveEvent(0, "rebuilt", (), SchedParams(2048, False, True), None, "initial", buffers=bufs,
                        graphs=graphs, last_graph=labels[-1], memory={**memory, "compute": {"CUDA0": 4 * MIB}},
                        plan=sample_plan())


def test_a_new_memory_group_shows_everywhere() -> None:
    """A memory kind no consumer names (recurrent state, "RS") is drawn, printed, compared and summed
    into the context's memory as the KV cache is."""
    ev = _grouped_event({"pp": GraphRecord(300, 3), "tg": GraphRecord(290, 2)},
                        {"model": {"CUDA0": 20 * MIB}, "KV": {"CUDA0": 8 * MIB}, "RS": {"CUDA0": 3 * MIB, "CPU": MIB},
                         "output": {"CPU": MIB}})
    by_name = {t.name: t for t in figures.buffer_sizes([ev]).data}
    assert dict(zip(by_name["RS"].x, by_name["RS"].customdata)) == {"CUDA0": 3 * MIB, "CPU": MIB}
    lines = text.buffers_text([ev]).splitlines()
    assert [x.split() for x in lines if x.split()[0] == "RS"] == [["RS", "CUDA0", "3.00", "MiB"],
                                                                  ["RS", "CPU", "1.00", "MiB"]]
    assert ev.context_memory() == {"CUDA0": 11 * MIB, "CPU": MIB}   # KV + RS; not model, output, compute
    later = dataclasses.replace(ev, index=1, memory={**ev.memory, "RS": {"CUDA0": 5 * MIB, "CPU": MIB}})
    d = compare(ev, later)
    assert [(m.buffer, m.change) for m in d.memory if m.group == "RS"] == [("CUDA0", 2 * MIB), ("CPU", 0)]
    assert "RS        CUDA0 3.00 MiB -> 5.00 MiB (+2.00 MiB)" in text.diff_text(d)


def test_one_graph_draws_one_trace_and_prints_its_label() -> None:
    """A traced context's event: one graph label, one compute-needed trace, one entry per text form."""
    ev = _grouped_event({"graph": GraphRecord(40, 2)}, {"model": {"CUDA0": MIB}})
    fig = figures.buffer_sizes([ev])
    assert [t.name for t in fig.data if t.name.startswith("compute needed")] == ["compute needed (graph)"]
    assert "needed" in text.buffers_text([ev]) and "(graph 1,048,576 B)" in text.buffers_text([ev])
    assert text.graphs_text(ev) == "graph 40 nodes 2 splits"
    assert "nodes graph=40 splits graph=2" in ev.to_text()
    assert ev.planned == GraphRecord(40, 2)
    d = json.loads(json.dumps(ev.to_dict(), default=str))
    assert d["graphs"] == {"graph": {"n_nodes": 40, "n_splits": 2}} and d["last_graph"] == "graph"
    assert d["buffers"][0]["needed"] == {"graph": MIB} and list(d["memory"]) == ["model", "compute"]


def test_two_graphs_in_the_text_forms() -> None:
    ev = sample_events()[0]
    assert "nodes pp/tg=300/290 splits pp/tg=3/2" in ev.to_text()
    assert "(pp 3,145,728 B, tg 1,572,864 B)" in text.buffers_text([ev])
    assert "graphs: pp 300 nodes 3 splits, tg 290 nodes 2 splits" in figures.timeline([ev]).data[0].hovertext[0]


def test_logged_buffer_sizes_are_reference_marks() -> None:
    """A llama.cpp log's buffer sizes (plain data) drawn as one legend entry: a dash per buffer at the
    logged bytes, a dashed line per compute buffer across the reserves; the bars are untouched."""
    evs = sample_events()
    logged = [LoggedBuffer("model", "CUDA0", 20 * MIB, 12), LoggedBuffer("compute", "CUDA0", 3 * MIB, 40),
              LoggedBuffer("compute", "CPU", 65536, 41, exact=False)]
    fig = figures.buffer_sizes(evs, logged)
    marks = [t for t in fig.data if (t.meta or {}).get("kind") == figures.LOGGED]
    assert [t.name for t in marks] == ["llama.cpp log", "llama.cpp log: CUDA0 compute", "llama.cpp log: CPU compute"]
    dash = marks[0]
    assert list(dash.x) == ["CUDA0", "CUDA0", "CPU"] and list(dash.customdata) == [20 * MIB, 3 * MIB, 65536]
    assert list(dash.y) == [20.0, 3.0, 65536 / MIB] and dash.xaxis == "x"
    assert "llama.cpp log" in dash.hovertext[0] and "line 12 of the log" in dash.hovertext[0]
    assert "printed in MiB only" in dash.hovertext[2]
    # across the reserves (0..3): flat at the logged value, on the history plot
    line = marks[1]
    assert line.xaxis == "x2" and list(line.x) == [-0.5, 3.5] and list(line.y) == [3.0, 3.0]
    assert [m["bytes"] for m in fig.layout.meta["logged"]] == [20 * MIB, 3 * MIB, 65536]
    plain = figures.buffer_sizes(evs)
    assert [t.name for t in fig.data if t not in marks] == [t.name for t in plain.data]
    assert plain.layout.meta["logged"] == [] and not [t for t in plain.data if "llama.cpp" in (t.name or "")]
