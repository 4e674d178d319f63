"""The dashboard on a traced JAX function: the same controls path, badge and figures as for llama.

A traced MLP on two simulated devices; control changes go through ``Dashboard.apply`` (what a
user's typing does) and the badge's decision is checked against the seed rule written out here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import hypothesis.strategies as st
import ipywidgets as W
import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings

import toolkit
from toolkit.trace import trace
from toolkit.trace.session import TracedContext, auto_max_nodes
from toolkit.ui.dashboard import Dashboard


def mlp(p: Any, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ p["fc1"]["w"] + p["fc1"]["b"])
    return h @ p["fc2"]["w"] + p["fc2"]["b"]


K1, K2, K3 = jax.random.split(jax.random.PRNGKey(0), 3)
PARAMS = {"fc1": {"w": 0.1 * jax.random.normal(K1, (32, 64)), "b": jnp.zeros(64)},
          "fc2": {"w": 0.1 * jax.random.normal(K2, (64, 16)), "b": jnp.zeros(16)}}
X = jax.random.normal(K3, (8, 32))


def make_dash(devices: str | None = "sim:2") -> Dashboard:
    tr = trace(mlp, X, params=PARAMS, placement={"fc1.*": 0, "fc2.*": 1})
    return toolkit.dashboard(tr, devices=devices, debounce_s=0)


def decision_of(dash: Dashboard) -> str:
    m = re.search(r"data-decision='(\w+)'", dash.badge.value)
    assert m is not None
    return m.group(1)


def widgets_in(w: Any) -> list[Any]:
    out = [w]
    for c in getattr(w, "children", ()):
        out += widgets_in(c)
    return out


def test_llama_controls_are_hidden_and_traced_ones_shown() -> None:
    dash = make_dash()
    assert set(dash.controls) == {"max_nodes", "parallel", "op_offload", "devices", "budget_mib", "placement"}
    shown = widgets_in(dash.widget)
    assert all(w in shown for w in dash.controls.values())
    assert not any(isinstance(w, W.SelectionSlider) for w in shown)  # no n_ctx / n_batch / n_ubatch
    assert dash.tokens not in shown and dash.compile_button not in shown and dash.run_button in shown
    assert dash.controls["devices"].value == "sim:2" and dash.controls["placement"].value == "fc1.*:0, fc2.*:1"
    assert decision_of(dash) == "rebuilt" and repr(dash).startswith("Dashboard(model='mlp'")
    with pytest.raises(KeyError):
        dash.apply(n_ctx=1024)
    assert dash.ctx.settings().model is None and "model" not in dash.controls   # no llama model to pick or fit


def test_figures_are_drawn_from_the_traced_events() -> None:
    dash = make_dash()
    dash.apply(max_nodes="512")
    dash.apply(op_offload=False)
    ev = dash.ctx.events[-1]
    marks = [len(t.x) for t in dash.figures["timeline"].data if t.mode.startswith("markers")]
    assert sum(marks) == len(dash.ctx.events) == 3
    assert dash.figures["split_map"].data and dash.figures["memory_layout"].data
    assert f"{ev.graphs['graph'].n_nodes} nodes, {ev.graphs['graph'].n_splits} splits" in dash.sched_info.value
    assert "auto" not in dash.sched_info.value  # typed


MAX_NODES = st.sampled_from(["auto", "64", "256", "1024", "2048", "4096", "3"])
CHANGE = st.fixed_dictionaries({}, optional={"max_nodes": MAX_NODES, "parallel": st.booleans(),
                                             "op_offload": st.booleans()}).filter(bool)


@settings(max_examples=15, deadline=None)
@given(st.lists(CHANGE, min_size=1, max_size=5))
def test_badge_follows_the_seed_rule(changes: list[dict[str, Any]]) -> None:
    dash = make_dash()
    ctx: TracedContext = dash.ctx
    g = ctx.traced.graph
    auto = auto_max_nodes(g.n_nodes, g.n_leafs)
    held = (auto, False, True)
    cur = {"max_nodes": "auto", "parallel": False, "op_offload": True}
    for ch in changes:
        want = {**cur, **ch}
        mn = auto if want["max_nodes"] == "auto" else int(want["max_nodes"])
        sizes, sched, n_events = ctx.compute_buffers_bytes(), ctx.scheduler, len(ctx.events)
        unchanged = all(dash.controls[k].value == v for k, v in ch.items())
        dash.apply(**ch)
        if unchanged:                                    # a widget sends no change for the same value
            assert len(ctx.events) == n_events
            continue
        if mn <= g.n_nodes:                              # "3": refused, previous state kept
            assert decision_of(dash) == "error" and f"max_nodes={mn}" in dash.badge.value
            assert ctx.scheduler is sched and ctx.compute_buffers_bytes() == sizes
            assert {k: dash.controls[k].value for k in cur} == cur
            assert ctx.events[-1].decision == "error" and len(ctx.events) == n_events + 1
            continue
        new = (mn, want["parallel"], want["op_offload"])
        reuse = new[1] == held[1] and new[2] == held[2] and new[0] <= held[0]
        assert decision_of(dash) == ("reused" if reuse else "rebuilt"), (ch, new, held)
        assert dash.badge_text().startswith("REUSED" if reuse else "REBUILT")
        if reuse:
            assert ctx.scheduler is sched and ctx.compute_buffers_bytes() == sizes
        else:
            held = new
        assert f"data-held='{held[0]}'" in dash.badge.value
        cur = want


def test_devices_and_placement_through_the_controls() -> None:
    dash = make_dash()
    ctx = dash.ctx
    dash.apply(devices="cpu")                       # fc2 on backend 1: there is none
    assert decision_of(dash) == "error" and "index 1 out of range for 1 backends" in dash.badge.value
    assert dash.controls["devices"].value == "sim:2" and [b.name for b in ctx.backends] == ["SIM0", "SIM1", "CPU"]
    dash.apply(devices="cpu", placement="-1")
    assert decision_of(dash) == "rebuilt" and "devices sim:2 → cpu" in dash.badge_text()
    assert set(ctx.traced.where().values()) == {"CPU"}
    dash.apply(placement="fc1=0")
    assert decision_of(dash) == "error" and "fc1=0" in dash.badge.value and dash.controls["placement"].value == "-1"
    dash.apply(devices="sim:2", placement="fc1.*:1, fc2.*:0")
    assert decision_of(dash) == "rebuilt" and ctx.traced.where()["fc1.w"] == "SIM1"


def test_run_button_compares_with_jax_jit() -> None:
    dash = make_dash()
    dash.apply(parallel=True)
    dash.run_button.click()
    m = re.search(r"data-max-abs-diff='([^']+)'", dash.runtime.value)
    assert m is not None, dash.runtime.value
    assert float(m.group(1)) < 1e-5
    assert "2 split(s)" in dash.runtime.value


def test_a_traced_context_or_its_own_backends() -> None:
    tr = trace(mlp, X, params=PARAMS)
    ctx = TracedContext(tr, "sim:1", max_nodes=512)
    dash = Dashboard(ctx, debounce_s=0)
    assert dash.ctx is ctx and dash.controls["max_nodes"].value == "512" and dash.controls["devices"].value == "sim:1"
    same = toolkit.dashboard(tr, devices=None, debounce_s=0)   # keeps the backends it was placed on
    assert [b.name for b in same.ctx.backends] == ["SIM0", "CPU"]
    with pytest.raises(ValueError, match="n_ctx"):
        toolkit.dashboard(tr, n_ctx=512)


def test_imports_stay_light() -> None:
    code = ("import sys, toolkit, toolkit.ui.dashboard, toolkit.trace.session; "
            "print(sorted(m for m in ('jax', 'toolkit.jaxrt') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
