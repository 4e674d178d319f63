"""The dashboard driven headless: control changes -> ctx.update -> badge and figures.

``StubContext`` stands in for toolkit.context.Context with the same surface (the real
ContextParams as cparams, hparams, events, scheduler, update) so the widget plumbing is tested
on its own; the same checks run on a real Context in test_ui_context.py.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, replace
from typing import Any

import hypothesis.strategies as st
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings

from toolkit.errors import ParameterError
from toolkit.models.cparams import ContextParams
from toolkit.reuse import BufferSize, GraphRecord, Reason, ReserveEvent, SchedParams
from toolkit.ui.dashboard import UPDATE_KEYS, Dashboard, parse_max_nodes

MIB = 1 << 20


@dataclass(frozen=True)
class StubHParams:
    n_layer: int = 2
    name: str = "stub"


@dataclass
class StubScheduler:
    max_nodes: int


class StubContext:
    """The seed's sched_new in a few lines, with sizes that are a simple function of cparams."""

    N_TENSORS = 200          # auto max_nodes = max(1024, 8 * 200) = 1600
    N_NODES = 700            # a graph of this size needs max_nodes >= N_NODES
    auto_max_nodes_text = "max(1024, 8·n_tensors)"
    backends: list[Any] = []
    compile_events: list[Any] = []
    n_copies = 1

    def __init__(self, pipeline_parallel: bool = False) -> None:
        self.cparams = ContextParams(n_ctx=512, n_batch=512, n_ubatch=128, n_gpu_layers=3)
        self.pipeline_parallel = pipeline_parallel    # decided by the context, as Context does
        self.hparams = StubHParams()
        self.max_nodes_override: int | None = None
        self.events: list[ReserveEvent] = []
        self.scheduler: StubScheduler | None = None
        self.cur: SchedParams | None = None
        self.alloc = 0
        self.update_calls: list[dict[str, Any]] = []
        self.sched_reserve(trigger="initial")

    @property
    def sched_params_cur(self) -> SchedParams | None:
        return self.cur

    @property
    def sched_params_req(self) -> SchedParams | None:
        return self.events[-1].params if self.events else None

    def compute_buffers_bytes(self) -> dict[str, int]:
        return {"CPU": self.alloc}

    def compile(self, n_tokens: int | None = None) -> dict[str, Any]:
        raise NotImplementedError("the stub plans only")

    def decode(self, tokens: Any, *, last_only: bool = False, seq_id: int = 0) -> Any:
        raise NotImplementedError("the stub plans only")

    def update(self, **changes: Any) -> ReserveEvent:
        self.update_calls.append(changes)
        cp = {k: v for k, v in changes.items() if k not in ("max_nodes", "parallel")}
        new = self.cparams.replace(**cp)
        mn = changes.get("max_nodes", self.max_nodes_override)
        if new.n_ubatch > new.n_batch:
            raise ValueError(f"n_ubatch {new.n_ubatch} > n_batch {new.n_batch}")
        if mn is not None and mn < self.N_NODES:
            raise ValueError(f"max_nodes {mn} < graph nodes {self.N_NODES}")
        self.cparams, self.max_nodes_override = new, mn
        self.pipeline_parallel = changes.get("parallel", self.pipeline_parallel)
        return self.sched_reserve(trigger=", ".join(f"{k}={v}" for k, v in changes.items()))

    def sched_reserve(self, trigger: str = "") -> ReserveEvent:
        mn = self.max_nodes_override or max(1024, 8 * self.N_TENSORS)
        p = SchedParams(mn, self.pipeline_parallel, self.cparams.op_offload)
        prev = self.cur
        need = self.cparams.n_ubatch * self.cparams.n_ctx * 4
        if self.scheduler is not None and prev is not None and p.can_reuse(prev):
            decision, reasons = "reused", (Reason("max_nodes", prev.max_nodes, mn),)
            self.alloc = max(self.alloc, need)
        else:
            decision = "rebuilt"
            reasons = () if prev is None else tuple(
                Reason(f, getattr(prev, f), getattr(p, f)) for f in ("max_nodes", "parallel", "op_offload")
                if getattr(prev, f) != getattr(p, f))
            self.scheduler, self.cur, self.alloc = StubScheduler(mn), p, need
        ev = ReserveEvent(len(self.events), decision, reasons, p, prev, trigger, {"total": 1.0},  # type: ignore[arg-type]
                          host_metadata_bytes=368 * mn if decision == "rebuilt" else 0,
                          saved_host_metadata_bytes=368 * mn if decision == "reused" else 0,
                          buffers=(BufferSize("CPU", "CPU", self.alloc, {"pp": need, "tg": need // 4}),),
                          graphs={"pp": GraphRecord(self.N_NODES, 1), "tg": GraphRecord(self.N_NODES, 1)},
                          last_graph="pp",
                          memory={"KV": {"CPU": self.cparams.n_ctx * 1024}})
        self.events.append(ev)
        return ev


def make_dashboard(**kw: Any) -> tuple[StubContext, Dashboard]:
    ctx = StubContext()
    return ctx, Dashboard(ctx, debounce_s=0, **kw)


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
    assert all(isinstance(f, go.FigureWidget) for f in dash.figures.values())
    assert len(dash.figures["timeline"].data) > 0
    assert "Dashboard(" in repr(dash)


def test_control_change_reuses_then_rebuilds() -> None:
    ctx, dash = make_dashboard()
    dash.controls["max_nodes"].value = "1000"          # 1000 <= 1600: reused
    assert ctx.update_calls[-1] == {"max_nodes": 1000}
    assert dash.badge_text().startswith("REUSED · max_nodes 1000 <= 1600")
    assert "toolkit-badge-reused" in dash.badge.value
    dash.controls["op_offload"].value = False           # op_offload differs: rebuilt
    assert dash.badge_text().startswith("REBUILT") and "op_offload on \u2192 off" in dash.badge_text()
    dash.controls["max_nodes"].value = "auto"          # back to 1600 > 1000 held: rebuilt
    assert ctx.update_calls[-1] == {"max_nodes": None}
    assert dash.badge_text().startswith("REBUILT · max_nodes 1600 > 1000")


def test_buffer_bars_follow_the_newest_event() -> None:
    ctx, dash = make_dashboard()
    bars = {t.name: t for t in dash.figures["buffers"].data}
    before = list(bars["KV"].customdata)
    dash.controls["n_ctx"].value = 1024
    bars = {t.name: t for t in dash.figures["buffers"].data}
    assert list(bars["KV"].customdata) == [1024 * 1024] != before
    # reuse keeps the larger compute buffer: allocated stays, needed drops
    dash.controls["n_ctx"].value = 256
    bars = {t.name: t for t in dash.figures["buffers"].data}
    assert list(bars["compute allocated"].customdata) == [128 * 1024 * 4]
    assert list(bars["compute needed (pp)"].customdata) == [128 * 256 * 4]


def test_errors_show_inside_and_keep_state() -> None:
    ctx, dash = make_dashboard()
    n = len(ctx.events)
    drawn = dash.figures["buffers"].to_dict()
    dash.controls["max_nodes"].value = "12"             # smaller than the graph
    assert dash.error is not None and "max_nodes 12 < graph nodes 700" in dash.error
    assert dash.controls["max_nodes"].value == "auto"   # the control shows what the context runs with
    assert "toolkit-badge-error" in dash.badge.value and "max_nodes 12" in dash.errors.value
    assert len(ctx.events) == n and dash.figures["buffers"].to_dict() == drawn
    dash.controls["max_nodes"].value = "nonsense"
    assert "'nonsense'" in (dash.error or "")
    dash.controls["max_nodes"].value = "800"            # a valid change clears the error
    assert dash.error is None and dash.badge_text().startswith("REUSED")


def test_error_in_a_callback_never_escapes() -> None:
    ctx, dash = make_dashboard()

    def boom(**_: Any) -> None:
        raise RuntimeError("device lost")

    ctx.update = boom  # type: ignore[method-assign]
    dash.controls["n_ubatch"].value = 64
    assert "RuntimeError: device lost" in dash.badge_text()


def test_apply_sends_one_update() -> None:
    ctx, dash = make_dashboard()
    dash.apply(n_ctx=2048, n_ubatch=256, max_nodes="900")
    assert ctx.update_calls == [{"n_ctx": 2048, "n_ubatch": 256, "max_nodes": 900}]


def test_rapid_changes_coalesce_last_value_wins() -> None:
    ctx = StubContext()

    async def drag() -> Dashboard:
        dash = Dashboard(ctx, debounce_s=0.05)
        for v in (64, 32, 16, 8, 4):                    # a slider dragged through five stops
            dash.controls["n_ubatch"].value = v
        assert ctx.update_calls == []                   # nothing yet: still inside the burst
        await asyncio.sleep(0.2)
        return dash

    # a fresh thread owns its own event loop: the session-wide browser fixtures keep a loop
    # running in the main thread once they have started
    out: list[Dashboard] = []
    worker = threading.Thread(target=lambda: out.append(asyncio.run(drag())))
    worker.start()
    worker.join(timeout=30)
    dash = out[0]
    assert ctx.update_calls == [{"n_ubatch": 4}]
    assert dash.n_updates == 1 and ctx.events[-1].trigger == "n_ubatch=4"


def test_runtime_buttons_degrade_gracefully() -> None:
    ctx, dash = make_dashboard()
    dash.compile_button.click()
    dash.run_button.click()
    # either the runtime is missing, or this stub context cannot compile / decode: said, not raised
    assert dash.runtime.value.startswith(("JAX runtime unavailable", "compile unavailable", "run failed",
                                          "<span style='color:#D55E00'>run failed"))


def test_split_map_collapse_toggle_redraws() -> None:
    from test_ui_figures import sample_plan

    from toolkit.ui import figures

    def bars(fig: go.Figure) -> list[tuple[object, ...]]:
        return [(t.name, tuple(t.y), tuple(t.x), tuple(t.base)) for t in fig.data if t.type == "bar"]

    ctx, dash = make_dashboard()
    plan = sample_plan()
    ctx.events[-1] = replace(ctx.events[-1], plan=plan)
    dash._draw(force=True)
    assert bars(dash.figures["split_map"]) == bars(figures.split_map(plan, "layer"))
    dash.collapse.value = "none"                       # the toggle alone redraws, node by node
    assert bars(dash.figures["split_map"]) == bars(figures.split_map(plan, "none"))
    assert bars(figures.split_map(plan, "none")) != bars(figures.split_map(plan, "layer"))


CHANGES = st.one_of(
    st.tuples(st.just("max_nodes"), st.sampled_from(["auto", "700", "900", "1600", "2000", "4096", "8"])),
    st.tuples(st.just("parallel"), st.booleans()),
    st.tuples(st.just("op_offload"), st.booleans()),
    st.tuples(st.just("n_ctx"), st.sampled_from([256, 512, 1024, 2048])),
    st.tuples(st.just("n_ubatch"), st.sampled_from([32, 64, 128, 512, 1024])),
    st.tuples(st.just("n_batch"), st.sampled_from([256, 512, 1024])),
)


def expected_max_nodes(text: str, auto: int) -> int:
    return auto if text == "auto" else int(text)


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
        if len(ctx.events) == n_events:          # rejected input: shown, state kept
            assert dash.error is not None and text.startswith("ERROR")
            continue
        ev = ctx.events[-1]
        assert text.startswith(ev.decision.upper())
        assert ev.params.max_nodes == expected_max_nodes(str(dash.controls["max_nodes"].value), 1600)
        # the seed's rule, written out independently of SchedParams.can_reuse
        reuse = (ev.params.parallel == held.parallel and ev.params.op_offload == held.op_offload
                 and ev.params.max_nodes <= held.max_nodes)
        assert ev.decision == ("reused" if reuse else "rebuilt")
        if not reuse:
            held = ev.params


def test_update_keys_cover_every_plain_control() -> None:
    _, dash = make_dashboard()
    assert set(UPDATE_KEYS) | {"model", "gguf", "devices", "budget_mib"} == set(dash.controls)


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
    ctx = StubContext(pipeline_parallel=True)
    dash = Dashboard(ctx, debounce_s=0)
    assert dash.controls["parallel"].value is True
    # a refused change reverts to the accepted state, which must hold the context's parallel flag
    dash.apply(parallel=False, max_nodes="12")
    assert dash.error is not None and "max_nodes 12" in dash.error
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
