"""Invariants of the scheduler + graph allocator over random graphs and random backend sets."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolkit.backend import Backend, Buffer, profiles
from toolkit.ggml import F32, Graph, Tensor, ops
from toolkit.ggml.tensor import VIEW_OPS, BufferUsage, Op
from toolkit.sched import CAN_INPLACE_OPS, Scheduler
from toolkit.sched.gallocr import merged_intervals, peak_live_bytes

GPU_KINDS: list[Callable[[int], Backend]] = [
    lambda i: profiles.cuda_like(i, min_batch=32),
    lambda i: profiles.rpc_like(i, f"127.0.0.1:{50052 + i}"),
    lambda i: profiles.metal_like(i, min_batch=32),
    lambda i: profiles.tpu(i, min_batch=32),
    lambda i: profiles.simulated(i, min_batch=32, max_size=4096),
]
EXCLUDABLE = ["SQR", "SILU", "ADD", "MUL", "SCALE", "EXP", "CONT"]

backend_set = st.fixed_dictionaries({
    "gpus": st.lists(st.tuples(st.integers(0, len(GPU_KINDS) - 1), st.sets(st.sampled_from(EXCLUDABLE), max_size=2)),
                     max_size=3),
    "blas": st.booleans(),
    "host_buft": st.booleans(),
})
recipe = st.fixed_dictionaries({
    "E": st.sampled_from([8, 16, 32]),
    "T": st.sampled_from([1, 4, 33, 64]),
    "n_weights": st.integers(1, 6),
    "weight_homes": st.lists(st.integers(0, 7), min_size=6, max_size=6),
    "n_inputs": st.integers(1, 3),
    "steps": st.lists(st.tuples(st.integers(0, 11), st.integers(0, 1000), st.integers(0, 1000)),
                      min_size=1, max_size=40),
    "outputs": st.lists(st.integers(0, 1000), max_size=3),
})


def make_backends(spec: dict) -> list[Backend]:  # type: ignore[type-arg]
    bes = [GPU_KINDS[k](i).without_ops(*ex) for i, (k, ex) in enumerate(spec["gpus"])]
    host = next((b.host_buft for b in bes if b.host_buft is not None), None) if spec["host_buft"] else None
    c = profiles.cpu(host)
    if spec["blas"]:
        bes.append(profiles.blas_like(c))
    return [*bes, c]


def build(r: dict, backends: list[Backend]) -> Graph:  # type: ignore[type-arg]
    E, T = r["E"], r["T"]
    weights = []
    for i in range(r["n_weights"]):
        home = backends[r["weight_homes"][i] % len(backends)]
        w = ops.new_tensor_2d(F32, E, E, f"w{i}")
        w.buffer = Buffer(home.buft, w.nbytes, BufferUsage.WEIGHTS)
        weights.append(w)
    norms = []
    for i in range(2):
        home = backends[r["weight_homes"][i] % len(backends)]
        w = ops.new_tensor_1d(F32, E, f"norm{i}")
        w.buffer = Buffer(home.buft, w.nbytes, BufferUsage.WEIGHTS)
        norms.append(w)
    pool: list[Tensor] = [ops.new_tensor_2d(F32, E, T, f"in{i}").set_input() for i in range(r["n_inputs"])]
    for k, (op, a, b) in enumerate(r["steps"]):
        x, y = pool[a % len(pool)], pool[b % len(pool)]
        if op == 0:
            t = ops.mul_mat(weights[b % len(weights)], x)
        elif op == 1:
            t = ops.add(x, y)
        elif op == 2:
            t = ops.mul(x, y)
        elif op == 3:
            t = ops.sqr(x)
        elif op == 4:
            t = ops.silu(x)
        elif op == 5:
            t = ops.scale(x, 0.5)
        elif op == 6:
            t = ops.rms_norm(x, 1e-5)
        elif op == 7:  # views (one strided by an offset) and their consumers
            if T > 1:
                h = T // 2
                a1 = ops.exp(ops.cont(ops.view_2d(x, E, h, x.nb[1], 0)))
                a2 = ops.cont(ops.view_2d(x, E, T - h, x.nb[1], h * x.nb[1]))
                t = ops.concat(a1, a2, 1)
            else:
                t = ops.cont(ops.exp(ops.view_2d(x, E, 1, x.nb[1], 0)))
        elif op == 8:
            t = ops.cont(ops.transpose(ops.transpose(x)))
        elif op == 9:
            t = ops.mul(x, norms[a % len(norms)])  # a weight as the second src
        elif op == 10:
            t = ops.reshape_2d(ops.exp(x), E, T)
        else:
            t = ops.sub(x, y)
        t.name = f"n{k}"
        pool.append(t)
    g = Graph(4096)
    outs = [pool[-1]] + [pool[i % len(pool)] for i in r["outputs"]]
    for t in outs:
        t.set_output()
    for t in outs:
        g.build_forward_expand(t)
    return g


def check_invariants(s: Scheduler, g: Graph, allocs: bool = True) -> None:
    ga = s.galloc
    ids = s.assignment.backend_ids
    bufts = s.bufts
    # splits: consecutive, covering every node, each non-view node on its split's backend
    splits = s.splits
    assert splits[0].i_start == 0 and splits[-1].i_end == g.n_nodes
    for a, b in zip(splits, splits[1:], strict=False):
        assert a.i_end == b.i_start and a.i_start < a.i_end
    for sp in splits:
        for t in g.nodes[sp.i_start:sp.i_end]:
            if t.op not in VIEW_OPS:
                assert ids[id(t)] == sp.backend_id, t
    copy_home = {id(c): b for (_, b), cs in s.assignment.copies.items() for c in cs}
    for t in g.nodes:
        if t.op in VIEW_OPS:
            continue
        b = ids[id(t)]
        assert s.backends[b].supports_op(t), (t, s.backends[b])
        for src in t.srcs:  # readable from the consumer's backend after copies
            base = src.view_src or src
            if base.buffer is not None and base.buffer.usage is not BufferUsage.COMPUTE:
                buft = base.buffer.buft
            elif id(src) in copy_home and id(src) not in ids:
                buft = bufts[copy_home[id(src)]]
            else:
                sb = ids.get(id(src), -1)
                sb = sb if sb != -1 else ids[id(base)]
                buft = bufts[sb]
            assert s.backends[b].supports_buft(buft), (t, src, buft)
    if not allocs:  # alloc_graph replays the records of the last planning pass
        return
    # allocations: inside their chunk, no two live tensors overlap, in-place only by the rules
    pos = {id(t): i for i, t in enumerate(s.graph_copy_nodes)}
    consumers: dict[int, list[int]] = {}
    for i, t in enumerate(s.graph_copy_nodes):
        for src in t.srcs:
            consumers.setdefault(id(src), []).append(i)
    group = [ga.shares_allocator(i) for i in range(ga.n_buffers)]
    lives = ga.lifetimes
    for life in lives:
        top = ga.allocators[life.buffer_id].chunks[life.chunk].max_size
        assert life.offset + life.size <= top
        buf = ga.buffers[life.buffer_id]
        assert buf is not None and life.offset + life.size <= buf.chunk_size(life.chunk)
        p = life.inplace_of
        if p is not None:
            t = life.tensor
            assert t.op in CAN_INPLACE_OPS and p in t.src and p.view_src is None and not p.is_output
            assert (p.type, p.ne, p.nb) == (t.type, t.ne, t.nb)
            assert max(consumers[id(p)]) == pos[id(t)]  # t was p's last consumer
    by_chunk: dict[tuple[int, int], list] = {}  # type: ignore[type-arg]
    for life in lives:
        if life.size:
            by_chunk.setdefault((group[life.buffer_id], life.chunk), []).append(life)
    for group_lives in by_chunk.values():
        group_lives.sort(key=lambda x: x.offset)
        for i, a in enumerate(group_lives):
            for b in group_lives[i + 1:]:
                if b.offset >= a.offset + a.size:
                    break
                if b.inplace_of is a.tensor or a.inplace_of is b.tensor:
                    continue
                assert a.last < b.first or b.last < a.first, (a, b)
    intervals, _ = merged_intervals(lives)
    for i in range(ga.n_buffers):
        if group[i] == i:
            members = {j for j in range(ga.n_buffers) if group[j] == i}
            assert ga.allocators[i].max_size() >= peak_live_bytes(intervals, members)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(backend_set, recipe, st.booleans(), st.booleans())
def test_random_graphs_keep_the_invariants(bspec: dict, r: dict, parallel: bool, op_offload: bool) -> None:  # type: ignore[type-arg]
    backends = make_backends(bspec)
    s = Scheduler(backends, None, 4096, parallel, op_offload)
    g = build(r, backends)
    assert s.reserve(g)
    check_invariants(s, g)
    sizes = s.buffer_sizes()
    s.reset()
    g2 = build(r, backends)
    assert s.alloc_graph(g2)
    check_invariants(s, g2, allocs=False)
    assert s.buffer_sizes() == sizes  # the reserved buffers already fit the identical graph
    # the plan places every non-view node inside its split's range, on that split's backend
    plan = s.plan()
    assert [(sp.backend_id, sp.i_start, sp.i_end) for sp in plan.splits] == \
        [(sp.backend_id, sp.i_start, sp.i_end) for sp in s.splits]
    for npl in plan.nodes:
        if npl.is_view:
            continue
        sp = plan.splits[npl.split]
        assert sp.i_start <= npl.index < sp.i_end and npl.backend_id == sp.backend_id, npl


# a graph where ggml's walk leaves a hole on CUDA0 (3712 bytes) and the offline plan reaches the bound (3456)
FRAGMENTING = {"E": 8, "T": 33, "n_weights": 6, "weight_homes": [3, 6, 2, 1, 3, 3], "n_inputs": 1, "outputs": [],
               "steps": [(11, 213, 1), (5, 0, 512), (0, 108, 154), (5, 54, 15), (4, 20, 0), (4, 208, 537),
                         (11, 213, 1)]}


@settings(max_examples=25, deadline=None)
@given(recipe)
@example(FRAGMENTING)
def test_offline_planner_matches_lower_bound_or_better_than_ggml(r: dict) -> None:  # type: ignore[type-arg]
    """Per buffer, the offline plan of ggml's own lifetimes needs the lower bound (the peak of live bytes) or,
    where it cannot reach it, no more than ggml's greedy walk; its offsets never overlap two live tensors."""
    backends = make_backends({"gpus": [(0, set())], "blas": False, "host_buft": True})
    ggml = Scheduler(backends, None, 4096, False, True)
    assert ggml.reserve(build(r, backends))
    off = Scheduler(backends, None, 4096, False, True, planner="offline")
    g = build(r, backends)
    assert off.reserve(g)
    check_invariants(off, g)  # the offline offsets: inside their buffer, no two live tensors overlap
    assert off.n_splits == ggml.n_splits
    ggml_buffers = {b.buft: b for b in ggml.plan().buffers}
    off_buffers = off.plan().buffers
    assert [b.buft for b in off_buffers] == list(ggml_buffers)
    for b in off_buffers:
        theirs = ggml_buffers[b.buft]
        # the same lifetimes (the offline planner only re-places them): the same bound
        assert b.lower_bound is not None and b.lower_bound == theirs.lower_bound
        assert b.lower_bound <= b.needed <= theirs.needed
        assert b.allocated == b.needed  # one reserve: the buffer is what this plan needs


def test_views_are_never_planned() -> None:
    c = profiles.cpu()
    s = Scheduler([c], None, 64, False, True)
    x = ops.new_tensor_2d(F32, 8, 4, "x").set_input()
    v = ops.view_2d(ops.sqr(x), 8, 2, 32, 0)
    g = Graph(64)
    g.build_forward_expand(ops.cont(v).set_output())
    assert s.reserve(g)
    planned = {id(life.tensor) for life in s.galloc.lifetimes}
    assert id(v) not in planned and all(t.op is not Op.VIEW for t in (life.tensor for life in s.galloc.lifetimes))
