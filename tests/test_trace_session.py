"""TracedContext: a traced MLP keeps or rebuilds its scheduler by the rule of llama.cpp #32009
(``llama_context::sched_new``).

The expected decision is computed here from the rule as the seed diff states it (same
``parallel``, same ``op_offload``, ``max_nodes`` not larger than the held scheduler's), not
through ``SchedParams.can_reuse``; sizes are compared with what earlier events measured.
"""

from __future__ import annotations

from typing import Any

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from toolkit.errors import ParameterError
from toolkit.reuse import GraphRecord, SchedParams
from toolkit.sched import hash_size
from toolkit.trace import trace
from toolkit.trace.schedule import auto_max_nodes
from toolkit.trace.session import TracedContext, describe_backends, min_max_nodes


def mlp(p: Any, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ p["fc1"]["w"] + p["fc1"]["b"])
    return h @ p["fc2"]["w"] + p["fc2"]["b"]


def mlp_params() -> Any:
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {"fc1": {"w": 0.1 * jax.random.normal(k1, (32, 64)), "b": jnp.zeros(64)},
            "fc2": {"w": 0.1 * jax.random.normal(k2, (64, 16)), "b": jnp.zeros(16)}}


X = jax.random.normal(jax.random.PRNGKey(1), (8, 32))
PARAMS = mlp_params()


def make_ctx(devices: Any = "sim:2", **kw: Any) -> TracedContext:
    tr = trace(mlp, X, params=PARAMS, placement={"fc1.*": 0, "fc2.*": 1})
    return TracedContext(tr, devices, **kw)


def seed_rule(new: tuple[int, bool, bool], held: tuple[int, bool, bool]) -> bool:
    """llama.cpp PR #32009: keep the scheduler iff same parallel, same op_offload, max_nodes <= held."""
    return new[1] == held[1] and new[2] == held[2] and new[0] <= held[0]


def state(ctx: TracedContext) -> tuple[Any, ...]:
    return (ctx.scheduler, ctx.sched_params_cur, ctx.sched_params_req, ctx.compute_buffers_bytes(),
            ctx.traced.where(), [b.name for b in ctx.backends], ctx.max_nodes_override, ctx.parallel, ctx.op_offload)


# ---- the first reserve --------------------------------------------------------------------------

def test_first_reserve_builds_a_scheduler_sized_like_traced_schedule() -> None:
    ctx = make_ctx()
    ev = ctx.events[-1]
    g = ctx.traced.graph
    assert ev.decision == "rebuilt" and ev.index == 0 and ev.previous is None
    assert ev.params == SchedParams(auto_max_nodes(g.n_nodes, g.n_leafs), False, True)
    assert ev.host_metadata_bytes == ctx.scheduler.host_metadata_bytes > 0
    # one graph, recorded once under its own label; its plan is the event's
    assert dict(ev.graphs) == {"graph": GraphRecord(g.n_nodes, 2)} and ev.last_graph == "graph"
    assert ev.plan is not None and ev.planned == ev.graphs["graph"]
    assert all(list(b.needed) == ["graph"] for b in ev.buffers)
    assert [s.backend for s in ev.plan.splits] == ["SIM0", "SIM1"]
    # the same plan as the one-shot Traced.schedule() on the same backends
    sch = ctx.traced.schedule()
    assert [b.allocated for b in ev.buffers] == list(sch.buffer_sizes().values())
    assert {b.buft: b.allocated for b in ev.buffers} == ctx.compute_buffers_bytes()
    assert list(ev.memory) == ["model", "compute"] and ev.memory["compute"] == ctx.compute_buffers_bytes()
    assert ev.memory["model"] == {"SIM0": sum(int(np.size(v)) * 4 for v in jax.tree_util.tree_leaves(PARAMS["fc1"])),
                                  "SIM1": sum(int(np.size(v)) * 4 for v in jax.tree_util.tree_leaves(PARAMS["fc2"]))}


def test_run_matches_jax_jit() -> None:
    ctx = make_ctx()
    r = ctx.run()
    assert r["ran_splits"] == r["n_splits"] == 2
    np.testing.assert_allclose(np.asarray(r["outputs"]), np.asarray(jax.jit(mlp)(PARAMS, X)), rtol=1e-5, atol=1e-5)
    assert r["max_abs_diff"] < 1e-5
    # after a rebuild the run uses the new scheduler
    ctx.update(op_offload=False)
    assert ctx.schedule().scheduler is ctx.scheduler
    assert ctx.run()["max_abs_diff"] < 1e-5


# ---- the seed rule over sequences of changes ----------------------------------------------------

MAX_NODES = st.one_of(st.none(), st.sampled_from([64, 100, 256, 1000, 1024, 2048, 3000, 8192]))
CHANGE = st.fixed_dictionaries({}, optional={"max_nodes": MAX_NODES, "parallel": st.booleans(),
                                             "op_offload": st.booleans()}).filter(bool)


@settings(max_examples=40, deadline=None)
@given(st.lists(CHANGE, min_size=1, max_size=6))
def test_decisions_follow_the_seed_rule(changes: list[dict[str, Any]]) -> None:
    ctx = make_ctx()
    g = ctx.traced.graph
    auto = auto_max_nodes(g.n_nodes, g.n_leafs)
    held = (auto, False, True)
    want_mn, want_par, want_off = None, False, True
    for ch in changes:
        want_mn = ch.get("max_nodes", want_mn)
        want_par = ch.get("parallel", want_par)
        want_off = ch.get("op_offload", want_off)
        new = (want_mn or auto, want_par, want_off)
        before = ctx.compute_buffers_bytes()
        sched_before = ctx.scheduler
        ev = ctx.update(**ch)
        reuse = seed_rule(new, held)
        assert ev.decision == ("reused" if reuse else "rebuilt"), (ch, new, held)
        assert (ev.params.max_nodes, ev.params.parallel, ev.params.op_offload) == new
        assert (ev.previous.max_nodes, ev.previous.parallel, ev.previous.op_offload) == held  # type: ignore[union-attr]
        if reuse:
            assert ctx.scheduler is sched_before
            assert ctx.scheduler.max_nodes == held[0]        # the held scheduler keeps its size
            assert ctx.compute_buffers_bytes() == before     # same graph: reused buffers keep their size
            assert ev.kept_buffers == before and ev.host_metadata_bytes == 0
            assert ev.saved_host_metadata_bytes > 0
        else:
            assert ctx.scheduler is not sched_before
            assert ev.host_metadata_bytes == ctx.scheduler.host_metadata_bytes > 0
            assert {r.field for r in ev.reasons} <= {"max_nodes", "parallel", "op_offload"} and ev.reasons
            held = new
        assert ev.n_copies == (4 if held[1] else 1)


def test_reused_after_growing_keeps_the_larger_buffers() -> None:
    """pipeline parallelism needs larger buffers; shrinking max_nodes afterwards reuses them."""
    ctx = make_ctx()
    one = ctx.compute_buffers_bytes()
    big = ctx.update(parallel=True)
    grown = ctx.compute_buffers_bytes()
    assert big.decision == "rebuilt" and grown["SIM0"] > one["SIM0"]
    ev = ctx.update(max_nodes=512)
    assert ev.decision == "reused" and ctx.compute_buffers_bytes() == grown == ev.kept_buffers


# ---- bad input keeps the previous state ---------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"max_nodes": 0}, ["max_nodes=0", "an integer from 1 to"]),
    ({"max_nodes": -5}, ["max_nodes=-5", "an integer from 1 to"]),
    ({"max_nodes": 10}, ["max_nodes=10", "14 nodes", "expected max_nodes > 14"]),
    ({"max_nodes": "big"}, ["max_nodes='big'"]),
    ({"parallel": "yes"}, ["parallel='yes'"]),
    ({"n_ctx": 512}, ["n_ctx", "max_nodes"]),
    ({"devices": "gpu:2"}, ["'gpu:2'"]),
    ({"devices": "cpu"}, ["index 1 out of range for 1 backends"]),
    ({"placement": 7}, ["index 7 out of range for 3 backends"]),
    ({"devices": "sim:2", "budget_mib": 0.001}, ["failed to allocate", "budget 1048 B"]),
])
def test_bad_input_raises_and_keeps_state(change: dict[str, Any], words: list[str]) -> None:
    ctx = make_ctx()
    ctx.update(max_nodes=1024)
    before = state(ctx)
    n = len(ctx.events)
    with pytest.raises(ValueError) as err:
        ctx.update(**change)
    for w in words:
        assert w in str(err.value)
    assert state(ctx) == before
    assert len(ctx.events) == n + 1 and ctx.events[-1].decision == "error"
    # and the context still works: the next change follows the rule from the kept scheduler
    assert ctx.update(max_nodes=512).decision == "reused"
    assert ctx.run()["max_abs_diff"] < 1e-5


def test_devices_without_a_backend_the_placement_names_are_refused_by_name() -> None:
    """Weights on backend index 2, then the CPU alone (devices=[]): the placement cannot be kept, and the
    error is the new devices' (a ParameterError naming devices, the value and what is accepted); the
    placement, backends and scheduler stay as they were. (Found by tests/test_fuzz_inputs.py.)"""
    ctx = make_ctx()
    ctx.update(placement=2)
    assert set(ctx.traced.where().values()) == {"CPU"} and ctx.traced.weight_backend == [2, 2, 2, 2]
    before, n = state(ctx), len(ctx.events)
    for devices in ([], "cpu", "sim:1"):
        with pytest.raises(ParameterError) as err:
            ctx.update(devices=devices)
        e = err.value
        assert (e.param, e.value) == ("devices", devices)
        assert e.accepted == "devices with a backend for every weight the placement 2 puts on one"
        assert str(e).startswith(f"devices={devices!r} is not accepted: expected devices with a backend")
        n_new = 1 if devices != "sim:1" else 2
        assert f"backend index 2 out of range for {n_new} backends" in str(e)
        assert state(ctx) == before and ctx.traced.weight_backend == [2, 2, 2, 2]
    assert len(ctx.events) == n + 3 and {ev.decision for ev in ctx.events[n:]} == {"error"}
    assert ctx.update(devices="cpu", placement=-1).decision == "rebuilt"   # both at once: accepted


def test_min_max_nodes_is_the_limit_for_a_new_scheduler() -> None:
    ctx = make_ctx()
    g = ctx.traced.graph
    lim = min_max_nodes(g.n_nodes, g.n_leafs)
    assert lim - 1 > max(g.n_nodes, g.n_leafs)        # for this graph the hash set is the binding limit
    ev = ctx.update(max_nodes=lim, op_offload=False)  # a new scheduler with max_nodes = lim
    assert ev.decision == "rebuilt" and ctx.scheduler.max_nodes == lim
    assert ctx.update(max_nodes=lim - 1).decision == "reused"  # the held scheduler's hash set serves it
    before = state(ctx)
    with pytest.raises(ValueError) as err:               # a new scheduler of that size could not
        ctx.update(max_nodes=lim - 1, op_offload=True)
    msg = str(err.value)
    assert f"max_nodes={lim - 1}" in msg and f"hash capacity {hash_size(lim - 1)}" in msg
    assert f"expected max_nodes >= {lim}" in msg and state(ctx) == before


@given(st.integers(1, 5000), st.integers(0, 5000))
def test_min_max_nodes_bounds(n_nodes: int, n_leafs: int) -> None:
    m = min_max_nodes(n_nodes, n_leafs)
    assert m > max(n_nodes, n_leafs) and hash_size(m) >= n_nodes + n_leafs
    assert m - 1 <= max(n_nodes, n_leafs) or hash_size(m - 1) < n_nodes + n_leafs


# ---- devices, placement, fallback ---------------------------------------------------------------

def test_new_devices_rebuild_with_a_devices_reason() -> None:
    ctx = make_ctx()
    ev = ctx.update(devices="cpu", placement=-1)
    assert ev.decision == "rebuilt" and [(r.field, r.before, r.after) for r in ev.reasons][0] == \
        ("devices", "sim:2", "cpu")
    assert [b.name for b in ctx.backends] == ["CPU"] and set(ctx.traced.where().values()) == {"CPU"}
    assert ev.graphs["graph"].n_splits == 1
    assert ctx.run()["max_abs_diff"] < 1e-5
    assert describe_backends(ctx.backends) == ("cpu", None)


def test_placement_change_keeps_the_scheduler() -> None:
    """Moving weights is no scheduler param (like n_gpu_layers): the seed rule reuses."""
    ctx = make_ctx()
    ev = ctx.update(placement={"fc1.*": 1, "fc2.*": 1})
    assert ev.decision == "reused"
    assert [s.backend for s in ev.plan.splits] == ["SIM1"]  # type: ignore[union-attr]
    assert ctx.run()["max_abs_diff"] < 1e-5


def test_budget_too_small_for_pipeline_parallelism_falls_back() -> None:
    """``llama_context::sched_reserve``: a failed allocation with pipeline parallelism retries without it."""
    ctx = make_ctx()
    plain = ctx.events[-1].buffers[0].allocated           # SIM0 without pipelining (measured)
    pipelined = ctx.update(parallel=True).buffers[0].allocated
    assert pipelined > plain
    budget_mib = (plain + pipelined) / 2 / (1 << 20)
    ctx.update(parallel=False)
    ctx.update(parallel=True)
    ev = ctx.update(devices="sim:2", budget_mib=budget_mib)
    assert ev.decision == "fallback" and not ev.params.parallel and not ctx.parallel
    assert ("parallel", True, False) in [(r.field, r.before, r.after) for r in ev.reasons]
    assert ev.warnings and ev.buffers[0].allocated == plain
    assert describe_backends(ctx.backends) == ("sim:2", budget_mib)


def test_a_traced_context_is_a_context_view_but_not_a_llama_one() -> None:
    from toolkit.context import LlamaContextView
    from toolkit.reuse import ContextView

    ctx = make_ctx()
    assert isinstance(ctx, ContextView) and not isinstance(ctx, LlamaContextView)
    assert ctx.compute_buffers_bytes() == {b.buft: b.allocated for b in ctx.events[-1].buffers}
