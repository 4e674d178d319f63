"""Graph copies: ``Graph.copy`` and ``ContextSetup.build_graph`` give what a fresh build gives.

The context builds each graph shape once and hands out copies of it; the scheduler then
rewrites a copy's sources and flags (pass 5, pipeline parallelism), which must not reach the
kept build or the next copy. A reserve borrows the kept build itself (``ContextSetup.lent_graph``),
which the next lend or copy puts back as built.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

from toolkit.backend import Buffer, profiles
from toolkit.context import Context
from toolkit.errors import ToolkitError
from toolkit.ggml import F32, Graph, ops
from toolkit.ggml.graph import GraphFull
from toolkit.ggml.tensor import BufferUsage, Tensor
from toolkit.models import ContextParams, presets
from toolkit.models.graph import GraphResult
from toolkit.models.setup import apply_pins


def _signature(lg: GraphResult) -> list[Any]:
    """Everything a build decides, with tensors named by position (or, for allocated tensors such
    as weights and the KV cache, by identity: copies share them)."""
    pos: dict[int, tuple[str, int]] = {}
    for i, t in enumerate(lg.graph.leafs):
        pos[id(t)] = ("leaf", i)
    for i, t in enumerate(lg.graph.nodes):
        pos[id(t)] = ("node", i)

    def ref(t: Tensor | None) -> object:
        if t is None:
            return None
        if t.buffer is not None:
            return ("allocated", id(t))
        return pos.get(id(t)) or ("outside", t.name, t.op, t.ne, ref(t.view_src))

    def fields(t: Tensor) -> tuple[object, ...]:
        return (t.name, t.op, t.type, t.ne, t.nb, int(t.flags), sorted(t.op_params.items(), key=str),
                t.view_offs, ref(t.view_src), [ref(s) for s in t.src], t.buffer, t.data)

    g = lg.graph
    return [
        g.size, [fields(t) for t in g.leafs], [fields(t) for t in g.nodes],
        sorted(g.use_count(t) for t in [*g.leafs, *g.nodes]),
        (lg.n_tokens, lg.n_seqs, lg.n_outputs, lg.flash_attn),
        [(ref(t), il) for t, il in lg.norms], [(ref(t), n, il) for t, n, il in lg.named],
        [(ref(t), il) for t, il in lg.fa_nodes],
        [(type(inp).__name__, [ref(t) for t in inp.tensors()]) for inp in lg.inputs],
        ref(lg.logits), ref(lg.embd),
    ]


def _own(lg: GraphResult) -> set[int]:
    """ids of the tensors a build creates (everything but the allocated ones)."""
    return {id(t) for t in [*lg.graph.leafs, *lg.graph.nodes] if t.buffer is None}


CASES = [
    ("tiny", {"flash_attn": "on"}),
    ("tiny", {"flash_attn": "off", "offload_kqv": False, "devices": ["CPU"]}),
    ("qwen3_30b_a3b", {"n_ctx": 2048, "cpu_moe": True}),
    ("gemma3_12b", {"n_ctx": 4096}),
]


@pytest.mark.parametrize(("model", "kw"), CASES)
@pytest.mark.parametrize("shape", [(512, 1, 512), (1, 1, 1), (16, 1, 16)])
def test_copies_equal_a_fresh_build(model: str, kw: dict[str, Any], shape: tuple[int, int, int]) -> None:
    ctx = Context(presets.get(model), ContextParams(**kw))
    st, size = ctx.setup, ctx.max_nodes()
    fresh = st.builder(size).build(*shape)
    a = st.build_graph(size, *shape)
    b = st.build_graph(size + 7, *shape)
    assert _signature(a) == _signature(fresh)
    assert _signature(b)[1:] == _signature(fresh)[1:] and b.graph.size == size + 7
    # no created tensor is shared between two copies, or with a fresh build
    assert not (_own(a) & _own(b)) and not (_own(a) & _own(fresh)) and not (_own(b) & _own(fresh))
    # the weights and the KV cache are the same objects
    allocated = {id(t) for t in [*a.graph.leafs, *a.graph.nodes] if t.buffer is not None}
    assert allocated == {id(t) for t in [*fresh.graph.leafs, *fresh.graph.nodes] if t.buffer is not None}
    assert allocated


def test_flash_attention_keys_the_kept_build() -> None:
    ctx = Context(presets.tiny(), ContextParams(flash_attn="on"))
    st, size = ctx.setup, ctx.max_nodes()
    on = st.build_graph(size, 8, 1, 8)
    st.flash_attn = False
    off = st.build_graph(size, 8, 1, 8)
    assert on.fa_nodes and not off.fa_nodes
    assert _signature(off) == _signature(st.builder(size).build(8, 1, 8))


def test_what_the_scheduler_writes_into_a_copy_stays_there() -> None:
    # two simulated GPUs with pipeline parallelism: pass 5 marks graph inputs INPUT|OUTPUT and points
    # sources at their copies
    ctx = Context(presets.tiny(), ContextParams(devices=("sim", "sim"), n_ctx=1024, n_gpu_layers=99), parallel=True)
    assert ctx.n_copies > 1
    st, size = ctx.setup, ctx.max_nodes()
    fresh = _signature(st.builder(size).build(512, 1, 512))
    lg = ctx.build_llama_graph(512, 1, 512)
    ctx.scheduler.split_graph(lg.graph)
    assert _signature(lg) != fresh   # the split did write into this copy
    assert _signature(st.build_graph(size, 512, 1, 512)) == fresh


def test_too_small_a_graph_size_fails_as_a_build_does() -> None:
    ctx = Context(presets.tiny(), ContextParams())
    st = ctx.setup
    n_nodes, n_leafs = st.graph_counts(ctx.max_nodes(), 512, 1, 512)
    fresh = st.builder(ctx.max_nodes()).build(512, 1, 512).graph
    assert (n_nodes, n_leafs) == (fresh.n_nodes, fresh.n_leafs)
    small = n_nodes - 1
    with pytest.raises(GraphFull) as built:
        st.builder(small).build(512, 1, 512)
    with pytest.raises(GraphFull) as copied:
        st.build_graph(small, 512, 1, 512)
    assert str(copied.value) == str(built.value)
    with pytest.raises(GraphFull):
        st.graph_counts(small, 512, 1, 512)


def test_graph_copy_keeps_structure_and_shares_what_it_is_told() -> None:
    w = ops.new_tensor_2d(F32, 4, 4, "w")
    w.buffer = Buffer(profiles.cpu_buft(), w.nbytes, BufferUsage.WEIGHTS)
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    y = ops.mul_mat(w, x)
    v = ops.view_1d(y, 2, 0)
    out = ops.add(ops.sqr(v), ops.sqr(v)).set_output()
    g = Graph(16)
    g.build_forward_expand(out)
    c, cp = g.copy(8, lambda t: t.buffer is not None)
    assert c.size == 8 and [t.name for t in c.nodes] == [t.name for t in g.nodes]
    assert [t.name for t in c.leafs] == [t.name for t in g.leafs]
    assert cp(w) is w and cp(x) is not x and cp(out) is c.nodes[-1]
    assert cp(v).view_src is cp(y) and cp(v).src == [cp(y)]
    assert all(cp(t).src == [cp(s) if s is not None else None for s in t.src] for t in g.nodes)
    assert [c.use_count(cp(t)) for t in g.nodes] == [g.use_count(t) for t in g.nodes]
    assert c.build_forward_expand(cp(out)) == 0   # already in the copy
    c.nodes[-1].src[0] = x                        # a write into the copy ...
    assert out.src[0] is not x                    # ... leaves the original alone
    with pytest.raises(GraphFull):
        g.copy(len(g.nodes) - 1, lambda t: False)


def test_a_lent_build_is_put_back_before_it_is_lent_again_and_copied_as_built() -> None:
    # llama_context::graph_reserve splits the kept build itself (ContextSetup.lent_graph); a copy made
    # meanwhile is a copy of the graph as built and leaves the split graph (what the scheduler's last
    # assignment and its debug dump read) alone; the next lend or sized build puts it back first
    ctx = Context(presets.tiny(), ContextParams(devices=("sim", "sim"), n_ctx=1024, n_gpu_layers=99), parallel=True)
    assert ctx.n_copies > 1
    st, size = ctx.setup, ctx.max_nodes()
    fresh = _signature(st.builder(size).build(512, 1, 512))
    lent = st.lent_graph(size, 512, 1, 512)
    assert _signature(lent) == fresh
    ctx.scheduler.split_graph(lent.graph)
    split = _signature(lent)
    dump = ctx.scheduler.dump()
    assert split != fresh   # the split wrote into the kept build: sources and graph-input flags
    assert _signature(st.build_graph(size, 512, 1, 512)) == fresh   # a copy of it as built
    assert _signature(lent) == split and ctx.scheduler.dump() == dump   # the split graph left alone
    ctx.scheduler.reset()
    ctx.scheduler.split_graph(st.lent_graph(size + 3, 512, 1, 512).graph)
    again = st.lent_graph(size + 3, 512, 1, 512)
    assert again is lent and _signature(again)[1:] == fresh[1:] and again.graph.size == size + 3
    ctx.scheduler.reset()
    ctx.scheduler.split_graph(again.graph)
    assert _signature(st.sized_graph(size, 512, 1, 512))[1:] == fresh[1:]


def test_reserves_of_lent_builds_plan_what_reserves_of_fresh_builds_plan() -> None:
    # the same sched_reserve four times (the scheduler reused) over lent builds, against a scheduler that
    # splits and plans fresh builds of the same shapes: the same splits, copies and buffer sizes
    kw: dict[str, Any] = dict(devices=("sim", "sim"), n_ctx=1024, n_gpu_layers=99)
    ctx = Context(presets.tiny(), ContextParams(**kw), parallel=True)
    for _ in range(3):
        ctx.sched_reserve()
    ref = Context(presets.tiny(), ContextParams(**kw), parallel=True)
    st, s = ref.setup, ref.scheduler
    rp = st.resolved
    n_tokens = min(rp.n_ctx, rp.n_ubatch)
    for shape in [(n_tokens, 1, n_tokens), (1, 1, 1), (n_tokens, 1, n_tokens)]:
        s.reset()
        lg = st.builder(ref.max_nodes()).build(*shape)
        apply_pins(s, lg, st)
        assert s.reserve(lg.graph)
    a, b = ctx.events[-1], ref.scheduler.plan()
    assert a.plan == b
    assert [ctx.scheduler.buffer_size(i) for i in range(ctx.scheduler.n_backends)] == \
        [s.buffer_size(i) for i in range(s.n_backends)]


def test_a_dropped_copy_leaves_no_cycle_for_the_collector() -> None:
    # Graph.copy's memo must not be a self-referencing closure: a cycle would keep every copied tensor
    # alive until the cyclic collector ran, and make each of its passes rescan whole graphs
    ctx = Context(presets.get("qwen3_30b_a3b"), ContextParams(n_ctx=2048))
    st, size = ctx.setup, ctx.max_nodes()
    st.build_graph(size, 512, 1, 512)   # the kept build
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        lg = st.build_graph(size, 512, 1, 512)
        assert lg.graph.n_nodes > 1000
        del lg
        assert gc.collect() == 0
    finally:
        if was:
            gc.enable()


def test_a_dropped_context_leaves_no_cycle_for_the_collector() -> None:
    # memory fitting makes a context per probe and drops it: context, scheduler holder and setup must be
    # freed by reference counting (the holder reads the context's backends through a weak reference)
    Context(presets.tiny(), ContextParams(n_ctx=256))   # first use: caches and lazy imports
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        ctx = Context(presets.tiny(), ContextParams(n_ctx=256))
        holder = ctx.holder
        del ctx
        assert gc.collect() == 0
        with pytest.raises(ToolkitError, match="no longer exists"):
            holder.backends()
    finally:
        if was:
            gc.enable()
