"""The seed (#32009): sched_new keeps a compatible scheduler; what reuse keeps; the pipeline fallback."""

from __future__ import annotations

import pytest
from oracle_cases import case

from toolkit.backend import Buffer
from toolkit.cases import context_from_case
from toolkit.context import Context
from toolkit.ggml import F32, Graph, ops
from toolkit.ggml.tensor import BufferUsage
from toolkit.models import ContextParams, presets
from toolkit.reuse import SchedParams
from toolkit.sched import hash_size


def _tiny(**kw: object) -> Context:
    cp = ContextParams(n_ctx=1024, n_batch=2048, n_ubatch=512, flash_attn="on", n_gpu_layers=0)
    return Context(presets.tiny(), cp.replace(**kw))


@pytest.mark.parametrize(("new", "ok"), [
    (SchedParams(1024, False, True), True),    # identical
    (SchedParams(512, False, True), True),     # fewer nodes: the hash set is big enough
    (SchedParams(1025, False, True), False),   # more nodes
    (SchedParams(1024, True, True), False),    # pipeline parallelism differs
    (SchedParams(1024, False, False), False),  # op offload differs
])
def test_can_reuse_branches(new: SchedParams, ok: bool) -> None:
    assert new.can_reuse(SchedParams(1024, False, True)) is ok


def test_sched_new_keeps_or_replaces_the_scheduler() -> None:
    ctx = _tiny()
    s0 = ctx.scheduler
    assert ctx.holder.sched_new(SchedParams(512, False, True)) is True and ctx.scheduler is s0
    assert ctx.sched_params_cur == SchedParams(1024, False, True)  # the kept scheduler's params
    assert ctx.holder.sched_new(SchedParams(2048, False, True)) is False and ctx.scheduler is not s0
    s1 = ctx.scheduler
    assert ctx.holder.sched_new(SchedParams(2048, False, False)) is False and ctx.scheduler is not s1
    assert ctx.holder.sched_new(SchedParams(2048, True, False)) is False and ctx.scheduler.n_copies == 4


def test_events_explain_each_decision() -> None:
    ctx = _tiny()
    first = ctx.events[0]
    assert first.decision == "rebuilt" and [r.field for r in first.reasons] == ["scheduler"]
    assert first.host_metadata_bytes == ctx.scheduler.host_metadata_bytes > 0
    big = ctx.update(max_nodes=4096)
    assert big.decision == "rebuilt" and [(r.field, r.before, r.after) for r in big.reasons] == \
        [("max_nodes", 1024, 4096)]
    assert big.hash_size == hash_size(4096) == 4099
    small = ctx.update(max_nodes=1024)
    assert small.decision == "reused" and small.host_metadata_bytes == 0 and small.saved_host_metadata_bytes > 0
    assert small.params == SchedParams(1024, False, True) and small.previous == SchedParams(4096, False, True)
    assert small.hash_size == small.kept_hash_size == 4099   # the old, larger hash set stays
    off = ctx.update(op_offload=False)
    assert off.decision == "rebuilt" and [(r.field, r.before, r.after) for r in off.reasons] == \
        [("op_offload", True, False)]
    par = ctx.update(parallel=True)
    assert par.decision == "rebuilt" and par.n_copies == 4 and par.pipeline_parallel
    assert [str(r) for r in par.reasons] == ["parallel off \u2192 on"]
    assert [e.index for e in ctx.events] == list(range(5))
    assert all(e.graphs["pp"].n_nodes == 68 and e.graphs["pp"].n_splits == 1 for e in ctx.events)


def test_reused_buffers_keep_their_historical_size() -> None:
    """A fresh context at ub 128 gets the oracle's 16,679,424 B; after ub 512 a reused scheduler keeps
    66,717,696 B (cases cpu-tiny_f32-c1024-b256-ub128-faon and -b2048-ub512-faon)."""
    fresh = _tiny(n_batch=256, n_ubatch=128)
    assert fresh.compute_buffers_bytes() == {"CPU": 16679424}
    ctx = _tiny()
    assert ctx.compute_buffers_bytes() == {"CPU": 66717696}
    ev = ctx.update(n_batch=256, n_ubatch=128)
    assert ev.decision == "reused"
    assert ev.kept_buffers == {"CPU": 66717696}
    assert ctx.compute_buffers_bytes() == {"CPU": 66717696}
    b = ev.buffers[0]
    assert (b.allocated, b.needed["pp"]) == (66717696, 16679424)
    # a rebuild reports the current worst case again
    assert ctx.update(op_offload=False).buffers[0].allocated == 16679424


def test_split_capacities_carry_over_under_reuse() -> None:
    """A split that grew its input capacity (``ggml_backend_sched_split_graph`` pass 5) keeps it in a reused
    scheduler."""
    ctx = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=256, flash_attn="on", devices=("sim",)))
    s = ctx.scheduler
    gpu = ctx.backends[0]
    # 29 single-input nodes, then one node with two new inputs: the capacity doubles
    # (as in test_sched_vectors.py::test_split_inputs_capacity_grows_and_persists)
    acc = None
    g = Graph(1024)
    xs = []
    for i in range(31):
        x = ops.new_tensor_1d(F32, 4, f"x{i}").set_input()
        w = ops.new_tensor_1d(F32, 4, f"w{i}")
        w.buffer = Buffer(gpu.buft, 16, BufferUsage.WEIGHTS)
        xs.append((x, w))
    for i in range(29):
        y = ops.mul(xs[i][0], xs[i][1])
        acc = y if acc is None else ops.add(acc, y)
    acc = ops.add(acc, ops.add(xs[29][0], xs[30][0]))
    acc = ops.mul(acc, xs[29][1])
    g.build_forward_expand(acc)
    s.reset()
    assert s.reserve(g)
    assert max(s.split_capacities) == 60
    ev = ctx.update(max_nodes=1024)
    assert ev.decision == "reused" and ev.kept_split_capacities == (60,)
    assert max(ctx.scheduler.split_capacities) == 60
    assert ctx.update(op_offload=False).kept_split_capacities == ()


def test_memory_budget_forces_the_fallback_without_pipeline_parallelism() -> None:
    cp = ContextParams(n_ctx=1024, n_ubatch=512, flash_attn="on", devices=("sim", "sim"))
    free = Context(presets.tiny(), cp)
    assert free.events[-1].decision == "rebuilt" and free.pipeline_parallel and free.n_copies == 4
    serial = Context(presets.tiny(), cp, parallel=False)
    need_pp = free.compute_buffers_bytes()["SIM1"]
    need_serial = serial.compute_buffers_bytes()["SIM1"]
    assert need_pp > need_serial
    budget = (need_pp + need_serial) // 2
    ctx = Context(presets.tiny(), cp.replace(devices=("sim", f"sim:{budget}")))
    ev = ctx.events[-1]
    assert ev.decision == "fallback"
    assert ev.warnings == ("compute buffer allocation failed, retrying without pipeline parallelism",)
    assert ("parallel", True, False) in [(r.field, r.before, r.after) for r in ev.reasons]
    assert not ctx.pipeline_parallel and ctx.n_copies == 1 and not ev.pipeline_parallel
    assert ctx.compute_buffers_bytes() == serial.compute_buffers_bytes()
    # below even the serial need: the error names the buffer and the budget
    with pytest.raises(ValueError, match=r"failed to allocate compute pp buffers.*budget \d+ B"):
        Context(presets.tiny(), cp.replace(devices=("sim", f"sim:{need_serial - 1}")))


def test_oracle_forced_pipeline_case_replays_as_fallback_under_a_budget() -> None:
    """The FORCEPP case's RPC1 buffer (66,191,360 B) does not fit 66,000,000 B; without pipeline parallelism
    the unforced case's 65,667,072 B does."""
    c = case("rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon-FORCEPP")
    ctx = context_from_case(c)
    assert ctx.compute_buffers_bytes() == c["observed"]["compute_buffers_bytes"]
    ctx.scheduler.bufts[1].alloc_limit = 66_000_000
    ctx.scheduler.free()
    ev = ctx.update(max_nodes=2048)
    assert ev.decision == "fallback" and ev.n_copies == 1
    unforced = case("rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon")
    assert ctx.compute_buffers_bytes() == unforced["observed"]["compute_buffers_bytes"]


def test_flash_attn_auto_turns_off_when_the_kv_device_cannot_run_it() -> None:
    """-fa auto: the probe puts FLASH_ATTN_EXT on the CPU when the layer's device lacks it, so FA is disabled
    (the oracle's CPU and RPC cases resolve to enabled: see the faauto cases in test_oracle)."""
    from toolkit.backend import profiles

    gpu = profiles.simulated(0, excluded_ops=["FLASH_ATTN_EXT"])
    ctx = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=256, flash_attn="auto"),
                  devices=[gpu, profiles.cpu(gpu.host_buft)])
    assert ctx.flash_attn is False
    assert any("Flash Attention disabled" in w for w in ctx.events[-1].warnings)
    names = {t.name for t in ctx.build_graph(8).nodes}
    # the cache was made for flash attention (V not transposed), so V is transposed and made contiguous
    assert {"v_cont-0", "v_cont-1", "kq_soft_max-0"} <= names
    on = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=256, flash_attn="auto"),
                 devices=[profiles.simulated(0), profiles.cpu()])
    assert on.flash_attn is True and on.events[-1].warnings == ()


def test_changing_devices_rebuilds_and_matches_a_fresh_context() -> None:
    ctx = _tiny()
    ev = ctx.update(devices=("rpc:127.0.0.1:50052",), n_gpu_layers=99)
    assert ev.decision == "rebuilt" and ev.reasons[0].field == "devices"
    obs = case("rpc1-tiny_f32-ngl99-oo1-c1024-b2048-ub512-faon")["observed"]
    assert ctx.compute_buffers_bytes() == obs["compute_buffers_bytes"]
    assert ctx.model_buffers_bytes == obs["model_buffers_bytes"]
    assert (ev.graphs["pp"].n_splits, ev.graphs["tg"].n_splits) == (obs["graph_splits"], obs["graph_splits_tg"])
    # moving layers between the same backends keeps the scheduler (and its larger buffers)
    again = ctx.update(n_gpu_layers=1)
    assert again.decision == "reused"
    assert again.buffers[0].allocated == obs["compute_buffers_bytes"]["RPC0[127.0.0.1:50052]"]


def test_caller_backends_are_not_mutated() -> None:
    """devices_from_backends reads the caller's backends; it does not grow their profiles."""
    from toolkit.backend import profiles

    gpu = profiles.simulated(0)
    cpu = profiles.cpu(gpu.host_buft)
    before_cpu, before_gpu = cpu.profile.readable_bufts, gpu.profile.readable_bufts
    ctx = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=256, flash_attn="off"), devices=[gpu, cpu])
    for change in ({"n_ctx": 512}, {"max_nodes": 4096}, {"op_offload": False}, {"n_ubatch": 128}):
        ctx.update(**change)
    assert cpu.profile.readable_bufts is before_cpu and len(before_cpu) == 1
    assert gpu.profile.readable_bufts is before_gpu
    # the context's own CPU backend reads the CPU weights' buft and the repack buft besides its own
    mine = ctx.backends[-1]
    assert mine is not cpu and mine.name == cpu.name and mine.buft is cpu.buft
    assert len(mine.profile.readable_bufts) == 3 and ctx.setup.devices.cpu_buft in mine.profile.readable_bufts


def test_both_contexts_are_read_through_the_view_protocol() -> None:
    """The dashboard and the runtime read contexts through ContextView; a llama context also offers
    its params (LlamaContextView) and what the JAX runtime reads to run it (RunnableContext)."""
    from toolkit.context import LlamaContextView, RunnableContext
    from toolkit.reuse import ContextView

    ctx = _tiny()
    assert isinstance(ctx, ContextView) and isinstance(ctx, LlamaContextView) and isinstance(ctx, RunnableContext)
    assert ctx.sched_params_req == ctx.events[-1].params and ctx.compile_events == []
    assert not isinstance(object(), ContextView)


@pytest.mark.parametrize("no_alloc", [False, True])
def test_a_reserve_records_pp_and_tg_by_label(no_alloc: bool) -> None:
    """sched_reserve's pp → tg → pp: two graphs under their labels (pp in its first place, with the
    numbers of its last reserve, whose plan the event keeps), each with what it alone needs: the
    oracle's graph-only sizes (``graph_only_alloc_bytes``, llama.cpp sized each graph on its own).
    Under no_alloc the tg graph is only split: it needs nothing. The memory groups are the setup's."""
    from toolkit.context import memory_groups

    c = case("rpc1-tiny_f32-ngl99-oo1-c1024-b2048-ub512-faon")
    ctx = context_from_case(c, no_alloc=no_alloc)
    ev = ctx.events[-1]
    obs = c["observed"]
    assert list(ev.graphs) == ["pp", "tg"] and ev.last_graph == "pp" and ev.planned is ev.graphs["pp"]
    assert [(g.n_nodes, g.n_splits) for g in ev.graphs.values()] == [
        (obs["graph_nodes"], obs["graph_splits"]), (obs["graph_nodes_tg"], obs["graph_splits_tg"])]
    only = {(g["graph"], g["backend"]): g["bytes"] for g in obs["graph_only_alloc_bytes"]}
    for b in ev.buffers:
        assert b.needed == {"pp": only[("pp", b.backend)], "tg": 0 if no_alloc else only[("tg", b.backend)]}
        assert b.needed_max == b.needed["pp"]
    assert ev.memory == {**memory_groups(ctx.setup), "compute": ctx.compute_buffers_bytes()}
    assert list(ev.memory) == ["model", "KV", "output", "compute"]
    assert ev.memory["KV"] == obs["kv_buffers_bytes"] == ev.context_memory()
    assert ev.memory["model"] == obs["model_buffers_bytes"] and ev.memory["output"] == obs["output_buffer_bytes"]


@pytest.mark.parametrize("cid", ["rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c4096-b2048-ub512-faon",
                                 "rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c4096-b2048-ub512-faoff-FORCEPP",
                                 "rpc1-tiny_f32-ngl1-oo0-c1024-b2048-ub512-faon"])
def test_repeated_fused_op_probes_are_skipped_without_effect(cid: str) -> None:
    """sched_reserve skips the fused-op probes that split the same graph again once a repeat changed
    nothing; the scheduler ends where running every probe leaves it (replayed here step by step)."""
    from toolkit.context import N_FUSED_OP_PROBES, reserve_shape
    ctx = context_from_case(case(cid))
    ref = context_from_case(case(cid), reserve=False)
    rp = ref.setup.resolved
    n_seqs, n_tokens = rp.n_seq_max, min(rp.n_ctx, rp.n_ubatch)
    ref.holder.sched_new(SchedParams(ref.max_nodes(), ref.pipeline_parallel, ref.cparams.op_offload))
    for nt in N_FUSED_OP_PROBES:
        ref.graph_reserve(nt, n_seqs, nt, split_only=True)
    n_out = reserve_shape(n_tokens, n_seqs, min(n_tokens, rp.n_outputs_max))[1]
    for shape in ((n_tokens, n_seqs, n_out), (n_seqs, n_seqs, n_seqs), (n_tokens, n_seqs, n_out)):
        assert ref.graph_reserve(*shape) is not None
    s, r = ctx.scheduler, ref.scheduler
    assert s.split_state() == r.split_state() and s.warnings == r.warnings
    # ggml's two id arrays (the last graph's backend ids and the one before, tails of longer graphs kept)
    assert (s.assignment.node_ids, s._prev_node_ids) == (r.assignment.node_ids, r._prev_node_ids)
    assert (s.assignment.leaf_ids, s._prev_leaf_ids) == (r.assignment.leaf_ids, r._prev_leaf_ids)
    assert s.buffer_sizes() == r.buffer_sizes() and s.n_splits == r.n_splits


@pytest.mark.parametrize("cid", ["rpc2-tiny_f32-ngl99-sm_layer-ts1_1-c4096-b2048-ub512-faon",
                                 "rpc1-tiny_f32-ngl1-oo0-c1024-b2048-ub512-faon"])
def test_a_setup_of_the_same_model_copies_the_earlier_builds(cid: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context of the same model and context params with another placement builds no graph: it copies
    the earlier context's builds, its own weights and caches swapped in. It plans exactly as one whose
    graphs were all built anew, and its graph inputs read its own KV cache."""
    import toolkit.models.setup as setup_mod
    from toolkit.cases import cparams_from_case, summary
    from toolkit.models import HParams
    from toolkit.models.inputs import InputAttnKV

    hp, cp = HParams.from_dict(case(cid)["model"]), cparams_from_case(case(cid)["cparams"])
    setup_mod._BUILDS.clear()
    Context(hp, cp.replace(n_gpu_layers=0))        # this model's builds, every layer on the CPU
    built: list[int] = []
    builder = setup_mod.ContextSetup.builder
    monkeypatch.setattr(setup_mod.ContextSetup, "builder", lambda self, n: built.append(n) or builder(self, n))
    got = Context(hp, cp)
    assert built == []
    monkeypatch.undo()
    setup_mod._BUILDS.clear()
    fresh = Context(hp, cp)
    assert summary(got) == summary(fresh)
    assert got.scheduler.dump(causes=True) == fresh.scheduler.dump(causes=True)
    assert got.scheduler.split_state() == fresh.scheduler.split_state()
    lg = got.build_llama_graph(1)
    assert lg.input(InputAttnKV).cache is got.setup.memory.caches[0]
    weights = [t for t in lg.graph.leafs if t.buffer is not None and t.name in got.setup.model.tensors]
    assert weights and all(t is got.setup.model.tensors[t.name] for t in weights)


def test_an_event_shares_the_plan_of_a_recent_event_it_equals() -> None:
    # max_nodes back and forth: the scheduler is reused and plans the same graph, so the events keep one
    # plan between them; a change that moves nodes gets a plan of its own, equal to a fresh context's
    kw = dict(devices=("sim", "sim"), n_ctx=1024, n_gpu_layers=99)
    ctx = Context(presets.tiny(), ContextParams(**kw))
    held = ctx.scheduler.max_nodes
    for m in (held - 1, held - 2, held - 1, held - 2):
        ctx.update(max_nodes=m)
    plans = [e.plan for e in ctx.events]
    assert all(p is plans[0] for p in plans)
    ctx.update(n_gpu_layers=1)
    moved = ctx.events[-1].plan
    assert moved is not plans[0] and moved != plans[0]
    assert moved == Context(presets.tiny(), ContextParams(**{**kw, "n_gpu_layers": 1}),
                            max_nodes=held - 2).events[-1].plan
    ctx.update(n_gpu_layers=99)   # back: the plan of an event among the latest ones
    assert ctx.events[-1].plan is plans[0]
