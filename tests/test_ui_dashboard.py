"""The dashboard driven headless on real (planning-only) contexts of the tiny preset: control
changes -> ctx.update -> badge and figures.

The numbers checked are llama.cpp's, recorded in tests/data/cases.json for tiny_f32 (the tiny
preset's model): ``max_nodes`` (``llama_context::graph_max_nodes``), the KV cache and the compute
buffer of n_ctx 256 and 1024 with n_batch 256, n_ubatch 128 and flash attention on.
"""

from __future__ import annotations

import asyncio
import re
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import ipywidgets.widgets.widget as ipywidgets_widget
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from oracle_cases import case, recorded_max_nodes

import toolkit
from toolkit.context import Context
from toolkit.errors import LogError, ParameterError
from toolkit.explain import from_log
from toolkit.ui.choices import make_context
from toolkit.ui.controls import MODEL_PICKERS, parse_max_nodes, shown
from toolkit.ui.dashboard import Dashboard

TINY = "tiny_f32"                                  # the model of toolkit.models.presets.tiny()
AUTO = recorded_max_nodes(TINY)                    # what llama.cpp sized the tiny model's graphs with
C256, C1024 = (case(f"cpu-tiny_f32-c{n}-b256-ub128-faon")["observed"] for n in (256, 1024))


def make_dashboard(devices: str = "cpu", **kw: Any) -> tuple[Context, Dashboard]:
    ctx = make_context("tiny", devices, n_ctx=256, n_batch=256, n_ubatch=128, flash_attn="on")
    assert ctx.hparams.name == TINY
    return ctx, Dashboard(ctx, debounce_s=0, **kw)


def bars(dash: Dashboard) -> dict[str, list[int]]:
    return {t.name: list(t.customdata) for t in dash.figures["buffers"].data if t.customdata is not None}


def test_parse_max_nodes() -> None:
    assert parse_max_nodes("auto") is None and parse_max_nodes(" ") is None
    assert parse_max_nodes("4096") == 4096
    with pytest.raises(ValueError, match="'lots'"):
        parse_max_nodes("lots")
    with pytest.raises(ParameterError, match="max_nodes='-3' is not accepted: expected 'auto' or an integer > 0"):
        parse_max_nodes("-3")


def test_initial_state_and_figures() -> None:
    ctx, dash = make_dashboard()
    assert dash.badge_text().startswith("REBUILT · first scheduler")
    assert "toolkit-badge-rebuilt" in dash.badge.value
    assert ctx.events[-1].params.max_nodes == AUTO and f"data-value='{AUTO}'" in dash.sched_info.value
    assert all(isinstance(f, go.FigureWidget) for f in dash.figures.values())
    assert len(dash.figures["timeline"].data) > 0
    assert repr(dash) == "Dashboard(model='tiny', devices='cpu', events=1)"


def test_control_change_reuses_then_rebuilds() -> None:
    ctx, dash = make_dashboard()
    dash.controls["max_nodes"].value = "1000"          # 1000 <= the held 1024: reused
    assert ctx.events[-1].trigger == f"max_nodes {AUTO} -> 1000"
    assert dash.badge_text().startswith(f"REUSED · max_nodes 1000 <= {AUTO}")
    assert "toolkit-badge-reused" in dash.badge.value
    dash.controls["op_offload"].value = False           # op_offload differs: rebuilt
    assert dash.badge_text().startswith("REBUILT") and "op_offload on \u2192 off" in dash.badge_text()
    assert ctx.cparams.op_offload is False
    dash.controls["max_nodes"].value = "auto"          # back to 1024 > the held 1000: rebuilt
    assert ctx.events[-1].trigger == f"max_nodes 1000 -> auto ({AUTO})" and ctx.max_nodes_override is None
    assert dash.badge_text().startswith(f"REBUILT · max_nodes {AUTO} > 1000")


def test_buffer_bars_follow_the_newest_event() -> None:
    ctx, dash = make_dashboard()
    assert bars(dash)["KV"] == list(C256["kv_buffers_bytes"].values())
    dash.controls["n_ctx"].value = 1024
    assert ctx.events[-1].decision == "reused"
    assert bars(dash)["KV"] == list(C1024["kv_buffers_bytes"].values())
    assert bars(dash)["compute allocated"] == list(C1024["compute_buffers_bytes"].values())
    # reuse keeps the larger compute buffer: allocated stays, needed drops to what n_ctx 256 needs
    dash.controls["n_ctx"].value = 256
    assert ctx.events[-1].decision == "reused"
    assert bars(dash)["compute allocated"] == list(C1024["compute_buffers_bytes"].values())
    assert bars(dash)["compute needed (pp)"] == list(C256["compute_buffers_bytes"].values())


def test_errors_show_inside_and_keep_state() -> None:
    ctx, dash = make_dashboard()
    n, sched, sizes = len(ctx.events), ctx.scheduler, ctx.compute_buffers_bytes()
    dash.controls["max_nodes"].value = "12"             # smaller than the graph: the context refuses it
    assert isinstance(dash.exception, ParameterError) and dash.exception.param == "max_nodes"
    assert dash.error is not None and dash.error.startswith("ParameterError: max_nodes=12 is not accepted")
    assert "too small for the graph" in dash.error
    assert dash.controls["max_nodes"].value == "auto"   # the control shows what the context runs with
    assert "toolkit-badge-error" in dash.badge.value and "max_nodes=12" in dash.errors.value
    # the attempt is recorded as an error event; scheduler, buffers and params are as they were
    assert len(ctx.events) == n + 1 and ctx.events[-1].decision == "error"
    assert ctx.scheduler is sched and ctx.compute_buffers_bytes() == sizes and ctx.max_nodes_override is None
    dash.controls["max_nodes"].value = "nonsense"       # refused by the control table: no event at all
    assert "'nonsense'" in (dash.error or "") and len(ctx.events) == n + 1
    dash.controls["max_nodes"].value = "800"            # a valid change clears the error
    assert dash.error is None and dash.badge_text().startswith("REUSED") and ctx.max_nodes_override == 800


def test_error_in_a_callback_never_escapes() -> None:
    ctx, dash = make_dashboard()

    def boom(**_: Any) -> None:
        raise RuntimeError("device lost")

    ctx.update = boom  # type: ignore[method-assign]
    dash.controls["n_ubatch"].value = 64
    assert "internal error, please report it: RuntimeError: device lost" in dash.badge_text()
    assert isinstance(dash.exception, RuntimeError) and dash.controls["n_ubatch"].value == 128


def test_apply_sends_one_update() -> None:
    ctx, dash = make_dashboard()
    n = len(ctx.events)
    dash.apply(n_ctx=2048, n_ubatch=64, max_nodes="900")
    assert len(ctx.events) == n + 1 and dash.n_updates == 1
    assert ctx.events[-1].trigger == f"n_ctx 256 -> 2048; n_ubatch 128 -> 64; max_nodes {AUTO} -> 900"
    assert (ctx.cparams.n_ctx, ctx.cparams.n_ubatch, ctx.max_nodes_override) == (2048, 64, 900)


def test_rapid_changes_coalesce_last_value_wins() -> None:
    ctx, _ = make_dashboard()
    n = len(ctx.events)

    async def drag() -> Dashboard:
        dash = Dashboard(ctx, debounce_s=0.05)
        for v in (64, 32, 16, 8, 4):                    # a slider dragged through five stops
            dash.controls["n_ubatch"].value = v
        assert len(ctx.events) == n                     # nothing yet: still inside the burst
        await asyncio.sleep(0.3)
        return dash

    # a fresh thread owns its own event loop: the session-wide browser fixtures keep a loop
    # running in the main thread once they have started
    out: list[Dashboard] = []
    worker = threading.Thread(target=lambda: out.append(asyncio.run(drag())))
    worker.start()
    worker.join(timeout=30)
    dash = out[0]
    assert len(ctx.events) == n + 1 and ctx.events[-1].trigger == "n_ubatch 128 -> 4"
    assert dash.n_updates == 1 and ctx.cparams.n_ubatch == 4


def test_runtime_buttons_say_what_went_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, dash = make_dashboard()
    n = len(ctx.events)
    dash.tokens.value = "1, two"
    dash.run_button.click()          # refused before the runtime is asked: the tokens name the problem
    assert dash.runtime.value.startswith("<span style='color:#D55E00'>run failed: ParameterError: tokens=")
    assert "two" in dash.runtime.value and "token ids in 0..31999" in dash.runtime.value
    dash.tokens.value = str(ctx.hparams.n_vocab)         # one past the vocabulary
    dash.run_button.click()
    assert "run failed: ParameterError" in dash.runtime.value and len(ctx.events) == n

    from toolkit.jaxrt import runtime

    def no_device(ctx: Any, n_tokens: int | None = None) -> dict[str, Any]:
        raise RuntimeError("no XLA device")

    monkeypatch.setattr(runtime, "compile_splits", no_device)   # the dashboard calls it on the click
    dash.compile_button.click()
    assert dash.runtime.value == "<span style='color:#D55E00'>compile failed: RuntimeError: no XLA device</span>"
    assert ctx.compile_events == []


def test_split_map_collapse_toggle_redraws() -> None:
    from test_ui_figures import sample_plan

    from toolkit.ui import figures

    def bars_of(fig: go.Figure) -> list[tuple[object, ...]]:
        return [(t.name, tuple(t.y), tuple(t.x), tuple(t.base)) for t in fig.data if t.type == "bar"]

    ctx, dash = make_dashboard()
    assert dash.collapse.options == ("layer", "split", "none") and dash.collapse.value == "layer"
    plan = sample_plan()
    ctx.events[-1] = replace(ctx.events[-1], plan=plan)
    dash.redraw()
    assert bars_of(dash.figures["split_map"]) == bars_of(figures.split_map(plan, "layer"))
    dash.collapse.value = "none"                       # the toggle alone redraws, node by node
    assert bars_of(dash.figures["split_map"]) == bars_of(figures.split_map(plan, "none"))
    assert bars_of(figures.split_map(plan, "none")) != bars_of(figures.split_map(plan, "layer"))
    with pytest.raises(ParameterError, match="collapse='rows'"):
        Dashboard(ctx, collapse="rows")  # type: ignore[arg-type]


CHANGES = st.one_of(
    st.tuples(st.just("max_nodes"), st.sampled_from(["auto", "700", "900", "1024", "2000", "4096", "8"])),
    st.tuples(st.just("parallel"), st.booleans()),
    st.tuples(st.just("op_offload"), st.booleans()),
    st.tuples(st.just("n_ctx"), st.sampled_from([256, 512, 1024, 2048])),
    st.tuples(st.just("n_ubatch"), st.sampled_from([32, 64, 128, 512, 1024])),
    st.tuples(st.just("n_batch"), st.sampled_from([256, 512, 1024])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CHANGES, min_size=1, max_size=12))
def test_badge_agrees_with_context_and_seed_rule(changes: list[tuple[str, Any]]) -> None:
    ctx, dash = make_dashboard()
    held = ctx.events[-1].params              # the live scheduler's params (sched_params_cur)
    for key, value in changes:
        n_events = len(ctx.events)
        if dash.controls[key].value == value:
            continue                             # no change, no observer call
        dash.controls[key].value = value
        text = dash.badge_text()
        ev = ctx.events[-1]
        assert len(ctx.events) == n_events + 1   # every change reserved, or recorded its refusal
        if ev.decision == "error":               # refused (max_nodes 8, n_ubatch > n_batch): shown, state kept
            assert isinstance(dash.exception, ParameterError) and dash.error is not None
            assert ev.error is not None and ev.error in dash.error and text.startswith("ERROR")
            assert ctx.sched_params_cur == held
            continue
        assert text.startswith(ev.decision.upper())
        typed = str(dash.controls["max_nodes"].value)
        assert ev.params.max_nodes == (AUTO if typed == "auto" else int(typed))
        # the seed's rule, written out independently of SchedParams.can_reuse
        reuse = (ev.params.parallel == held.parallel and ev.params.op_offload == held.op_offload
                 and ev.params.max_nodes <= held.max_nodes)
        assert ev.decision == ("reused" if reuse else "rebuilt")
        if not reuse:
            held = ev.params


def test_every_control_is_an_update_keyword_of_its_context() -> None:
    """Each control the settings offer maps to a keyword the real context's update takes: the
    current values handed back keep the scheduler (new backends aside) and what the widgets show."""
    import jax.numpy as jnp

    from toolkit.trace import trace
    from toolkit.trace.session import TracedContext

    tr = trace(lambda p, x: jnp.tanh(x @ p["w"]), jnp.ones((2, 4)), params={"w": jnp.ones((4, 4))})
    for ctx in (make_dashboard("sim:2")[0], TracedContext(tr, "sim:2", placement={"w": 1})):
        dash = Dashboard(ctx, debounce_s=0)
        offered = ctx.settings()
        pickers = set(MODEL_PICKERS) if offered.model is not None else set()
        assert set(dash.controls) == {c.name for c in offered.controls} | pickers
        for c in offered.controls:
            ev = ctx.update(**dash.table.changes([c.name]))
            # a traced context makes new backends for any devices= (so no scheduler can be reused)
            assert ev.decision == "reused" or [r.field for r in ev.reasons] == ["devices"], (c, ev)
        # what the widgets show is what they showed (n_gpu_layers 999 came back as n_layer + 1: every layer)
        assert [shown(c) for c in ctx.settings().controls] == [shown(c) for c in offered.controls]


def test_widget_state_follows_the_figures_without_resending() -> None:
    ctx, dash = make_dashboard()
    fw = dash.figures["buffers"]
    sent: list[Any] = []
    send_state = fw.send_state

    def spy(key: Any = None) -> None:
        sent.append(key)
        send_state(key)

    fw.send_state = spy  # type: ignore[method-assign]
    dash.controls["n_ctx"].value = 1024
    # a page reload asks the kernel for this state: it must be the figure the views show
    assert len(fw._widget_data) == len(fw.data) > 0
    assert fw._widget_layout["meta"]["event"] == ctx.events[-1].index
    assert "_widget_data" not in sent and "_widget_layout" not in sent   # the views got plotly's edits


def test_initial_parallel_checkbox_is_what_the_context_runs_with() -> None:
    ctx, dash = make_dashboard("sim:2")         # two devices: llama.cpp's rule turns pipeline parallelism on
    assert ctx.pipeline_parallel is True and dash.controls["parallel"].value is True
    # a refused change reverts to the accepted state, which must hold the context's parallel flag
    dash.apply(parallel=False, max_nodes="12")
    assert dash.error is not None and "max_nodes=12" in dash.error
    assert dash.controls["parallel"].value is True and ctx.pipeline_parallel is True


def test_compare_view_follows_previous_and_newest() -> None:
    ctx, dash = make_dashboard()
    assert dash.diff is None and dash.compare_box.layout.display == "none"   # closed: not drawn
    dash.controls["op_offload"].value = False
    diff = dash.compare()
    assert diff is not None and (diff.a, diff.b) == (0, 1)
    assert diff.params == (("op_offload", True, False),)
    assert "data-decision='rebuilt'" in dash.compare_html.value and dash.compare_box.layout.display == "flex"
    dash.controls["n_ctx"].value = 1024                                   # follows the newest pair
    assert dash.diff is not None and (dash.diff.a, dash.diff.b) == (1, 2)
    dash.compare(0, 2)                                                    # a pick sticks
    dash.controls["n_ctx"].value = 2048
    assert dash.diff is not None and (dash.diff.a, dash.diff.b) == (0, 2)


# a partial offload with op offload on: layers 0-1 on the CPU, 2-3 and the output on one RPC server
LOG = Path(__file__).parent / "data" / "sched-debug" / "rpc1-small_f32-ngl3-c1024-b2048-ub512-faon-DEBUG.txt"
# "<what> buffer size = X MiB (N bytes)": llama.cpp's lines, read here, not by the parser under test
LOGGED_BYTES = re.compile(r"^(\S+):\s+(\S+)\s+(model|output|KV|compute) buffer size =\s+[\d.]+ MiB \((\d+) bytes\)")


def logged_marks(dash: Dashboard) -> list[tuple[str, int]]:
    mark = next(t for t in dash.figures["buffers"].data if t.name == "llama.cpp log")
    return list(zip(mark.x, mark.customdata, strict=True))


def test_a_log_opens_the_dashboard_with_its_buffers_as_reference_marks(tmp_path: Path) -> None:
    dash = toolkit.dashboard(log=LOG, debounce_s=0)
    assert dash.ctx.cparams == from_log(LOG).cparams and dash.ctx.cparams.n_gpu_layers == 3
    expected = [(m.group(2), int(m.group(4))) for line in LOG.read_text().splitlines()
                if (m := LOGGED_BYTES.match(line))]
    assert len(expected) == 7 and logged_marks(dash) == expected
    # the rebuilt context is the logged run: its bars stand at the marks
    assert bars(dash)["compute allocated"] == [b for buft, b in expected[-2:]]
    # one layer fewer on the GPU: the bars move, the marks stay at the logged run
    dash.apply(n_gpu_layers=2)
    assert dash.error is None and dash.ctx.cparams.n_gpu_layers == 2
    assert bars(dash)["model"] != [b for _, b in expected[:2]]
    assert logged_marks(dash) == expected
    dash.apply(op_offload=False, n_ctx=512)
    assert dash.error is None and logged_marks(dash) == expected
    # the saved report carries them too
    report = dash.save_html(tmp_path / "report.html").read_text()
    assert '"name":"llama.cpp log"' in report and '"customdata":[39096320,39097344,128000' in report


def test_a_bad_log_raises_before_any_widget() -> None:
    cut = "\n".join(LOG.read_text().splitlines()[:300])     # stops before sched_reserve
    before = len(ipywidgets_widget._instances)
    with pytest.raises(LogError, match="compute buffer size"):
        toolkit.dashboard(log=cut)
    assert len(ipywidgets_widget._instances) == before
    with pytest.raises(ParameterError, match="n_ctx"):
        toolkit.dashboard(log=LOG, n_ctx=512)
    with pytest.raises(ParameterError, match="devices"):
        toolkit.dashboard(log=LOG, devices="sim:2")


def test_a_moe_log_offers_n_cpu_moe() -> None:
    # --n-cpu-moe 1 as the log shows it (three -ot overrides of layer 0's experts); the control adds layer 1's
    moe_log = LOG.parent.parent / "logs" / "rpc1-tiny_moe_f32-ngl99-ncmoe1-oo1-c256-b512-ub512-faon-DEBUG.txt"
    dash = toolkit.dashboard(log=moe_log, debounce_s=0)
    assert "n_cpu_moe" in dash.controls and dash.controls["n_cpu_moe"].max == 2
    marks = logged_marks(dash)
    cpu = dash.ctx.model_buffers_bytes["CPU_Mapped"]
    dash.apply(n_cpu_moe=2)
    assert dash.error is None and dash.ctx.cparams.n_cpu_moe == 2
    assert dash.ctx.model_buffers_bytes["CPU_Mapped"] > cpu and logged_marks(dash) == marks
    assert "n_cpu_moe" not in make_dashboard()[1].controls       # a dense model has no experts to keep
