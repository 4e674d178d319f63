"""The dashboard's compare view, inspect panel and saved report on a real Context.

Setup: the tiny preset on two simulated devices with only the last layer offloaded
(n_gpu_layers=1), so layer 0's weights sit in host memory. With op offload on, each of
layer 0's matrix multiplications is offloaded to a device (ggml_backend_offload_op: batch 512
>= 32) and its host weight is copied there as a split input; with op offload off they run on
the CPU where their weights live, and those weight copies disappear.
"""

from __future__ import annotations

from pathlib import Path

from oracle_cases import recorded_max_nodes
from plotly.callbacks import InputDeviceState, Points

from toolkit.sched.plan import Cause
from toolkit.ui.choices import make_context
from toolkit.ui.dashboard import Dashboard


def offload_dashboard() -> Dashboard:
    return Dashboard(make_context("tiny", "sim:2", n_gpu_layers=1), debounce_s=0)


def test_op_offload_off_in_the_compare_view() -> None:
    dash = offload_dashboard()
    on = dash.ctx.events[-1]
    dash.controls["op_offload"].value = False
    off = dash.ctx.events[-1]
    d = dash.compare()
    assert d is not None and (d.a, d.b) == (on.index, off.index)
    assert (d.count("splits pp").a, d.count("splits pp").b) == (on.graphs["pp"].n_splits, off.graphs["pp"].n_splits)
    assert off.graphs["pp"].n_splits < on.graphs["pp"].n_splits
    # every layer-0 weight copied to a device under op offload disappears, none appears
    assert d.weights_removed and not d.weights_added
    assert all(i.from_backend == "CPU" and i.reader_cause == "op offload" for i in d.weights_removed)
    moved = {c.name: c for c in d.backend_changes}
    assert moved["ffn_out-0"].cause_before == "op offload" and moved["ffn_out-0"].after == "CPU"
    assert moved["ffn_out-0"].cause_after == "weight"
    html = dash.compare_html.value
    assert f"data-splits-pp-a='{on.graphs['pp'].n_splits}'" in html
    assert f"data-weights-removed='{len(d.weights_removed)}'" in html


def click(dash: Dashboard, figure: str, trace_name: str, point: int) -> None:
    """What plotly's click message does in the kernel: the trace's on_click callbacks run."""
    fw = dash.figures[figure]
    k, trace = next((k, t) for k, t in enumerate(fw.data) if t.name == trace_name)
    trace._dispatch_on_click(Points([point], [0], [0], trace_name, k), InputDeviceState())


def test_click_on_the_split_map_and_the_memory_layout_explains() -> None:
    dash = offload_dashboard()
    dash.collapse.value = "none"                        # one bar per node
    plan = dash.ctx.events[-1].plan
    assert plan is not None
    target = next(n for n in plan.nodes if n.name == "ffn_out-0")
    bars = next(t for t in dash.figures["split_map"].data if t.name == target.backend and t.customdata is not None)
    click(dash, "split_map", bars.name, list(bars.customdata).index(target.index))
    e = dash.inspected
    assert e is not None and e.node.name == "ffn_out-0" and e.cause is Cause.OP_OFFLOAD
    assert "data-cause='op offload'" in dash.inspect.value and e.followed == ("blk.0.ffn_down.weight",)
    # the memory layout: a rectangle is a planned tensor, explained by name
    mem = next(t for t in dash.figures["memory_layout"].data if t.customdata is not None
               and "ffn_out-0" in list(t.customdata))
    click(dash, "memory_layout", mem.name, list(mem.customdata).index("ffn_out-0"))
    assert dash.inspected is not None and dash.inspected.alloc is not None
    assert f"offset {dash.inspected.alloc.offset:,} B" in dash.inspect.value


def test_max_nodes_auto_names_the_formula_value() -> None:
    dash = offload_dashboard()
    dash.controls["max_nodes"].value = "2048"
    dash.controls["max_nodes"].value = "auto"
    assert dash.ctx.hparams.name == "tiny_f32"
    auto = recorded_max_nodes("tiny_f32")                      # what llama.cpp's graph_max_nodes gave it
    assert dash.ctx.events[-1].trigger == f"max_nodes 2048 -> auto ({auto})"
    assert f"auto ({auto})" in dash.badge.value


def test_save_html_is_self_contained(tmp_path: Path) -> None:
    dash = offload_dashboard()
    dash.controls["op_offload"].value = False
    out = dash.save_html(tmp_path / "report.html")
    page = out.read_text()
    assert page.count("class='toolkit-report-figure'") == 4
    assert "Plotly.newPlot" in page and "<script src=" not in page    # plotly.js inline, nothing fetched
    assert "compare reserve #0 (rebuilt) -&gt; #1 (rebuilt)" in page and "op_offload on -&gt; off" in page
    assert "n_gpu_layers" in page and "data-version='0.1.0'" in page
    assert page.count("#1 rebuilt") >= 1


def test_a_bad_control_value_is_shown_and_the_state_kept() -> None:
    dash = offload_dashboard()
    n, drawn = len(dash.ctx.events), dash.figures["split_map"].to_dict()
    sched = dash.ctx.scheduler
    dash.controls["devices"].value = "gpu:2"                     # not a device spec the picker accepts
    assert dash.error is not None and "'gpu:2'" in dash.error and "sim:N" in dash.error
    assert "toolkit-badge-error" in dash.badge.value and "gpu:2" in dash.errors.value
    assert dash.controls["devices"].value == "sim:2"             # the control shows what runs
    assert dash.ctx.scheduler is sched and len(dash.ctx.events) == n
    assert dash.figures["split_map"].to_dict() == drawn
    dash.controls["max_nodes"].value = "1000"                     # a good value clears the error
    assert dash.error is None and dash.ctx.events[-1].decision == "reused"


def test_click_on_a_split_lists_its_inputs_and_copies() -> None:
    dash = offload_dashboard()
    plan = dash.ctx.events[-1].plan
    assert plan is not None
    # with op offload on, a split whose inputs include a host weight copied to SIM0
    sp = next(s for s in plan.splits if any(i.is_weight for i in s.inputs))
    bars = next(t for t in dash.figures["split_map"].data if t.name == "splits")
    click(dash, "split_map", "splits", list(bars.customdata).index(f"split:{sp.index}"))
    html = dash.inspect.value
    assert f"data-split='{sp.index}'" in html and f"data-inputs='{len(sp.inputs)}'" in html
    w = next(i for i in sp.inputs if i.is_weight)
    assert f"{sp.backend}#{w.name}#0" in html and "(weight)" in html
