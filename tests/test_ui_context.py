"""The dashboard and its figures on a real (planning-only) Context of the tiny model."""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import plotly.graph_objects as go
import pytest
from hypothesis import HealthCheck, given, settings
from oracle_cases import recorded_max_nodes

from toolkit.ui import Dashboard, figures, text
from toolkit.ui.choices import make_context, parse_devices, preset_label, resolve_model
from toolkit.ui.style import MIB


@pytest.fixture(scope="module")
def tiny_events() -> list[Any]:
    ctx = make_context("tiny")
    ctx.update(max_nodes=1000)          # reused
    ctx.update(op_offload=False)        # rebuilt
    ctx.update(n_ctx=1024)              # reused, KV grows
    return list(ctx.events)


def test_figures_draw_a_real_context(tiny_events: list[Any]) -> None:
    evs = tiny_events
    assert [e.decision for e in evs] == ["rebuilt", "reused", "rebuilt", "reused"]
    assert text.badge_text(evs[0]).startswith("REBUILT · first scheduler")
    assert text.badge_text(evs[1]).startswith("REUSED · max_nodes 1000 <= 1024 · saved")
    assert "op_offload on \u2192 off" in text.badge_text(evs[2])
    ev = evs[-1]
    fig = figures.buffer_sizes(evs)
    bars = {t.name: t for t in fig.data if isinstance(t, go.Bar)}
    assert list(bars["compute allocated"].customdata) == [sum(b.allocated for b in ev.buffers)]
    assert dict(zip(bars["KV"].x, bars["KV"].customdata)) == ev.memory["KV"]
    assert dict(zip(bars["model"].x, bars["model"].customdata)) == ev.memory["model"]
    plan = ev.plan
    sm = figures.split_map(plan)
    nodes = [t for t in sm.data if isinstance(t, go.Bar) and t.y[0].startswith("nodes")]
    assert sum(sum(t.x) for t in nodes) == plan.n_nodes == ev.graphs["pp"].n_nodes
    assert list(sm.layout.xaxis.ticktext)[:2] == ["L0", "L1"]       # the 1-node input group yields to L0
    ml = figures.memory_layout(plan)
    assert sum(len(t.x) for t in ml.data if isinstance(t, go.Bar)) == len(plan.allocs)
    assert any("lower bound" in a.text for a in ml.layout.annotations) == any(
        b.lower_bound is not None for b in plan.buffers)
    tl = figures.timeline(evs)
    assert sum(len(t.x) for t in tl.data if t.mode.startswith("markers")) == len(evs)
    # reuse keeps the larger buffer: a reused event's allocated bytes never drop below the previous
    for a, b in zip(evs, evs[1:]):
        if b.decision == "reused":
            assert sum(x.allocated for x in b.buffers) >= sum(x.allocated for x in a.buffers)


def test_choices() -> None:
    assert parse_devices("sim:2", 512).cparams_devices() == (f"sim:{512 * MIB}",) * 2
    assert parse_devices("rpc:3").cparams_devices() == ("rpc:3",)
    assert parse_devices("cpu").cparams_devices() == ()
    with pytest.raises(ValueError, match="devices='gpu:2' is not accepted"):
        parse_devices("gpu:2")
    with pytest.raises(ValueError, match="N=0 must be in 1..16"):
        parse_devices("sim:0")
    with pytest.raises(ValueError, match="applies to sim:N or cuda:N"):
        parse_devices("rpc:1", 64)
    assert preset_label("llama3_8b") == "Llama-3-8B-shaped" and preset_label("tiny") == "tiny"
    assert resolve_model("70B-shaped").n_layer == 80
    with pytest.raises(ValueError, match="model=.gpt5. is not accepted"):
        resolve_model("gpt5")
    with pytest.raises(ValueError, match="no such file"):
        resolve_model("/nonexistent/model.gguf")


def test_model_and_device_pickers() -> None:
    dash = Dashboard(make_context("tiny"), debounce_s=0)
    dash.controls["devices"].value = "sim:2"
    ev = dash.ctx.events[-1]
    assert dash.error is None, dash.error
    assert ev.decision == "rebuilt" and any(r.field == "devices" for r in ev.reasons)
    assert {b.backend for b in ev.buffers} == {"SIM0", "SIM1", "CPU"}
    old = dash.ctx
    dash.controls["model"].value = "small"
    assert dash.error is None, dash.error
    assert dash.ctx is not old and dash.ctx.hparams.n_layer == 4
    assert dash.controls["n_gpu_layers"].max == 5
    assert dash.badge_text().startswith("REBUILT")
    dash.controls["devices"].value = "tpu:1"
    assert "not understood" in (dash.error or "") and dash.badge_text().startswith("ERROR")


CHANGES = st.one_of(
    st.tuples(st.just("max_nodes"), st.sampled_from(["auto", "50", "600", "1000", "1024", "2048"])),
    st.tuples(st.just("parallel"), st.booleans()),
    st.tuples(st.just("op_offload"), st.booleans()),
    st.tuples(st.just("n_ctx"), st.sampled_from([256, 512, 1024])),
    st.tuples(st.just("n_ubatch"), st.sampled_from([32, 256, 4096])),
    st.tuples(st.just("devices"), st.sampled_from(["cpu", "sim:2"])),
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CHANGES, min_size=1, max_size=8))
def test_badge_agrees_with_context_and_seed_rule(changes: list[tuple[str, Any]]) -> None:
    ctx = make_context("tiny")
    dash = Dashboard(ctx, debounce_s=0)
    assert ctx.hparams.name == "tiny_f32"
    auto = recorded_max_nodes("tiny_f32")              # what llama.cpp's graph_max_nodes gave this model
    held = ctx.events[-1].params                         # what the live scheduler was built with
    for key, value in changes:
        if dash.controls[key].value == value:
            continue
        n = len(ctx.events)
        dash.controls[key].value = value
        ev = ctx.events[-1]
        assert len(ctx.events) == n + 1                  # every change reserved (or recorded its error)
        badge = dash.badge_text()
        assert badge.startswith(ev.decision.upper()), (badge, ev)
        if ev.decision == "error":
            assert dash.error is not None and ev.error in dash.error
            continue
        want = auto if dash.controls["max_nodes"].value == "auto" else int(dash.controls["max_nodes"].value)
        assert ev.params.max_nodes == want
        assert ev.params.op_offload == dash.controls["op_offload"].value
        # the seed's rule written out: same parallel, same op_offload, max_nodes <= the held one
        reuse = (key != "devices" and ev.params.parallel == held.parallel
                 and ev.params.op_offload == held.op_offload and ev.params.max_nodes <= held.max_nodes)
        assert ev.decision in (("reused",) if reuse else ("rebuilt", "fallback")), (key, value, held, ev)
        if ev.decision != "reused":
            held = ev.params
        assert f"toolkit-badge-{ev.decision}" in dash.badge.value


@pytest.mark.slow
def test_compile_and_run_buttons_use_the_jax_runtime() -> None:
    dash = Dashboard(make_context("tiny", n_ctx=256, n_batch=32, n_ubatch=32), debounce_s=0)
    with pytest.warns(UserWarning, match="random weights"):
        dash.compile_button.click()
    assert dash.runtime.value.startswith("compile took") and "split(s) compiled" in dash.runtime.value
    assert dash.ctx.compile_events[-1].reserve_index == dash.ctx.events[-1].index   # a CompileEvent ...
    hover = [h for t in dash.figures["timeline"].data if t.mode.startswith("markers") for h in (t.hovertext or ())]
    assert any("XLA compile:" in h for h in hover)            # ... and shown on the timeline
    dash.tokens.value = "1, 2, 3"
    dash.run_button.click()
    n_vocab = dash.ctx.hparams.n_vocab
    assert dash.runtime.value.startswith("run took") and f"shape (3, {n_vocab})" in dash.runtime.value


def test_memory_budget_makes_the_fallback_visible() -> None:
    dash = Dashboard(make_context("small", "sim:2"), debounce_s=0)
    assert dash.controls["devices"].value == "sim:2" and dash.controls["model"].value == "small"
    assert dash.ctx.events[-1].pipeline_parallel and dash.controls["parallel"].value
    # 75 MiB per device: too small for 4 pipeline copies, enough without them
    # (llama_context::sched_reserve's fallback)
    dash.controls["budget_mib"].value = 75
    ev = dash.ctx.events[-1]
    assert dash.error is None and ev.decision == "fallback"
    assert dash.badge_text().startswith("FALLBACK") and "parallel on \u2192 off" in dash.badge_text()
    assert "retrying without pipeline parallelism" in dash.badge_text()
    assert dash.controls["parallel"].value is False          # the checkbox follows the context
    assert all(b.allocated <= 75 * MIB for b in ev.buffers if b.buft.startswith("SIM") and b.buft != "SIM_Host")


def test_size_sliders_refuse_none_and_keep_their_value() -> None:
    """ipywidgets' SelectionSlider takes value=None, fails on the index and keeps None without telling
    its observers; the dashboard's sliders refuse it and keep what the context runs with."""
    import traitlets

    dash = Dashboard(make_context("tiny", n_ctx=512), debounce_s=0)
    for key in ("n_ctx", "n_batch", "n_ubatch"):
        before = dash.controls[key].value
        with pytest.raises(traitlets.TraitError, match=f"{key}=None"):
            dash.controls[key].value = None
        assert dash.controls[key].value == before and dash.error is None
    dash.controls["n_ctx"].value = 1024                       # and they still work
    assert dash.ctx.cparams.n_ctx == 1024
