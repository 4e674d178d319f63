"""The visual fixes: labels that do not collide, whole reserve numbers, copies with their own
style and legend entry, decisions told apart without colour."""

from __future__ import annotations

from dataclasses import replace

from test_ui_figures import sample_events, sample_plan

from toolkit.sched.plan import TensorAlloc
from toolkit.ui import figures


def _notes(fig) -> list[str]:  # type: ignore[no-untyped-def]
    return [a.text for a in fig.layout.annotations]


def test_equal_peak_and_lower_bound_share_one_label() -> None:
    plan = sample_plan(lower_bound=262144)           # CUDA0's peak is 4 tensors x 65,536 B = 262,144 B
    notes = _notes(figures.memory_layout(plan, "CUDA0"))
    assert sum("peak" in n for n in notes) == 1 and sum("lower bound" in n for n in notes) == 1
    assert any("peak = lower bound 0.25 MiB" in n for n in notes), notes


def test_reserve_axes_show_whole_numbers() -> None:
    evs = sample_events()
    fig = figures.buffer_sizes(evs)
    assert fig.layout.xaxis2.tickformat == "d" and fig.layout.xaxis2.dtick == 1
    assert figures.timeline(evs).layout.xaxis.tickformat == "d"


def test_layer_ticks_keep_apart_on_a_narrow_small_graph() -> None:
    plan = sample_plan(n_layer=12)                  # 87 nodes, a layer every 7
    fig = figures.split_map(plan, width=300)         # 200 px of plot: ~2.3 px a node
    vals, texts = list(fig.layout.xaxis.tickvals), list(fig.layout.xaxis.ticktext)
    px = 200 / (plan.n_nodes + 1)
    assert 2 <= len(texts) < 13
    for (x0, t0), (x1, t1) in zip(zip(vals, texts), zip(vals[1:], texts[1:])):
        assert (x1 - x0) * px >= 3 * (len(t0) + len(t1)), (t0, t1)   # ~6 px a character, centred labels
    wide = figures.split_map(plan, width=2000)
    assert len(wide.layout.xaxis.ticktext) > len(texts)


def test_copies_have_their_own_style_and_legend_entry() -> None:
    plan = sample_plan()
    copies = (TensorAlloc("CUDA0#inp_embd#0", "CUDA0", 0, 5 * 65536, 8192, 1, 3),
              TensorAlloc("CUDA1#l_out-1#0", "CUDA1", 0, 5 * 65536, 8192, 16, 18))
    plan = replace(plan, allocs=plan.allocs + copies)
    fig = figures.memory_layout(plan)
    traces = [t for t in fig.data if t.name == "split input copies"]
    assert [list(t.customdata) for t in traces] == [["CUDA0#inp_embd#0"], ["CUDA1#l_out-1#0"]]
    assert all(t.marker.pattern.shape == "/" for t in traces)
    assert [t.showlegend for t in traces] == [True, False]        # one legend entry for all buffers
    pipelined = figures.memory_layout(replace(plan, n_copies=4))
    (pipe,) = [t for t in pipelined.data if t.name == "pipeline copies" and t.showlegend]
    assert pipe.marker.pattern.shape == "x"
    plain = [t for t in fig.data if t.name == "CUDA0"]
    assert plain and all(t.marker.pattern.shape is None for t in plain)


def test_reused_and_rebuilt_differ_by_marker_and_text() -> None:
    fig = figures.timeline(sample_events())
    by = {t.name: t for t in fig.data if t.mode and t.mode.startswith("markers")}
    assert by["reused"].marker.symbol != by["rebuilt"].marker.symbol
    assert set(by["reused"].text) == {"reused"} and set(by["rebuilt"].text) == {"rebuilt"}
    assert "+text" in by["reused"].mode


def test_memory_layout_is_one_trace_per_kind_and_buffer() -> None:
    plan = sample_plan()
    fig = figures.memory_layout(plan)
    rects = [t for t in fig.data if t.type == "bar"]
    assert len(rects) == len(plan.buffers)                        # no copies here: one trace a buffer
    assert sum(len(t.x) for t in rects) == len(plan.allocs)

