"""Scheduler lifecycle: budgets, reserve_size, copy rotation, pins, graph_copy shape, offline planner."""

from __future__ import annotations

import pytest
from sched_fixtures import cpu, gpu, graph_of, reserve_then_alloc, weight
from test_sched_vectors import _llama_like_build, _two_backend_mlp

from toolkit.backend import Buffer, BufferType, profiles
from toolkit.ggml import F32, Graph, ops
from toolkit.ggml.tensor import BufferUsage
from toolkit.sched import Scheduler, SchedulerAbort
from toolkit.sched.plan import Plan


def test_budget_makes_reserve_fail() -> None:
    g0, g1, c = profiles.simulated(0, budget=49152 - 1, min_batch=32), gpu(1), cpu()
    s = Scheduler([g0, g1, c], None, 2048, False, True)
    assert not s.reserve(_llama_like_build(g0, g1, c, 64)[0])
    assert s.warnings[-1] == "failed to allocate SIM0 buffer of size 49152"
    s.reset()
    g0.buft.alloc_limit = 49152
    assert s.reserve(_llama_like_build(g0, g1, c, 64)[0])
    assert g0.buft.in_use == 49152 and s.buffer_size(0) == 49152
    s.free()
    assert g0.buft.in_use == 0


def test_reserve_size_allocates_nothing_and_does_not_dedup() -> None:
    c = cpu()
    blas = profiles.blas_like(c)
    s = Scheduler([blas, c], None, 2048, False, True)
    w = weight(c, "w", 8, 8)
    x = ops.new_tensor_2d(F32, 8, 2, "x").set_input()
    g = graph_of(ops.mul_mat(w, ops.silu(ops.mul_mat(w, x))).set_output())
    assert s.reserve_size(g) == [128, 128]
    assert s.buffer_size(0) == 0 and c.buft.in_use == 0
    assert s.graph_needed_sizes() == [128, 0]


def test_copy_rotation_and_events() -> None:
    s = _two_backend_mlp(4, True, parallel=True)     # reserve, reset, alloc_graph
    assert s.cur_copy == 0 and s.next_copy == 1
    assert s.events[0][0] is not None   # CUDA-like devices have events
    assert s.events[1] == [None] * 4    # the CPU has none
    seen = []
    for _ in range(5):
        s.reset()
        g0, c = s.backends
        w0, w1 = weight(g0, "w0", 16, 16), weight(c, "w1", 16, 16)
        x = ops.new_tensor_2d(F32, 16, 4, "x").set_input()
        o = ops.add(ops.silu(ops.mul_mat(w1, ops.silu(ops.mul_mat(w0, x)))), ops.silu(ops.mul_mat(w0, x)))
        assert s.alloc_graph(graph_of(o.set_output()))
        seen.append(s.cur_copy)
    assert seen == [1, 2, 3, 0, 1]
    s.reset()
    s.synchronize()
    assert s.next_copy == 0


def test_graph_copy_shape_with_copies() -> None:
    s = _two_backend_mlp(4, True, parallel=True)
    n_inputs = sum(sp.n_inputs for sp in s.splits)
    assert len(s.graph_copy_nodes) == 5 + 2 * n_inputs
    assert len(s.graph_copy_leafs) == 3 + 4 * (s.n_graph_inputs + n_inputs)
    names = {t.name for t in s.graph_copy_leafs}
    assert {"CUDA0#x#1", "CPU#a0#3", "CPU#x#2"} <= names


def test_alloc_graph_assigns_addresses_and_needs_reset() -> None:
    s = _two_backend_mlp(4, True)
    g = s.assignment.graph if s.assignment is not None else None
    assert g is not None
    h1 = next(t for t in g.nodes if t.name == "h1")
    assert s.tensor_address(h1) == ("CPU", 0, 256)
    assert h1.buffer is None  # only pre-allocated tensors carry a buffer in this model
    with pytest.raises(RuntimeError, match="already allocated"):
        s.alloc_graph(graph_of(ops.sqr(ops.new_tensor_1d(F32, 4, "z").set_input())))


def test_single_buffer_alloc_graph_re_reserves_itself() -> None:
    s = Scheduler([cpu()], None, 64, False, True)
    x = ops.new_tensor_1d(F32, 10, "x").set_input()
    assert s.reserve(graph_of(ops.mul(x, ops.sqr(x)).set_output(), size=64))
    assert s.buffer_size(0) == 128
    s.reset()
    y = ops.new_tensor_1d(F32, 100, "y").set_input()
    assert s.alloc_graph(graph_of(ops.mul(y, ops.sqr(y)).set_output(), size=64))
    assert s.buffer_size(0) == 832   # the n = 100 plan of test_buffers_never_shrink


def test_pins_survive_until_reset() -> None:
    g0, c = gpu(), cpu()
    s = Scheduler([g0, c], None, 64, False, True)
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    y = ops.sqr(x)
    s.set_tensor_backend(y, g0)
    assert s.tensor_backend_id(y) == 0
    s.reset()
    assert s.tensor_backend_id(y) == -1


def test_creation_checks() -> None:
    with pytest.raises(ValueError, match="last backend must be a CPU"):
        Scheduler([gpu()], None, 64, False, True)
    g0 = gpu()
    with pytest.raises(ValueError, match="does not support buffer type"):
        Scheduler([g0, cpu()], [cpu().buft, None], 64, False, True)
    with pytest.raises(ValueError, match="n_backends = 17"):
        Scheduler([cpu()] * 17, None, 64, False, True)


def test_preallocated_tensor_nobody_can_run_aborts() -> None:
    c = cpu()
    s = Scheduler([c], None, 64, False, True)
    t = ops.new_tensor_1d(F32, 4, "kv")
    t.buffer = Buffer(BufferType("elsewhere", 64), 16, BufferUsage.ANY)
    with pytest.raises(SchedulerAbort, match=r"pre-allocated tensor \(kv\) in a buffer \(elsewhere\)"):
        s.reserve(graph_of(ops.sqr(t)))


def test_plan_snapshot_survives_reset() -> None:
    """A plan is frozen data: resetting the scheduler and planning another graph with it leaves it as it was."""
    s = _two_backend_mlp(64, True)
    p = s.plan()
    seen = (p.n_splits, p.n_nodes, p.graph_copy_nodes, [(sp.backend, sp.i_start, sp.i_end) for sp in p.splits],
            [(a.buft, a.name, a.offset, a.size, a.first, a.last) for a in p.allocs],
            [(b.buft, b.allocated, b.needed, b.chunks, b.lower_bound) for b in p.buffers])
    s.reset()
    x = ops.new_tensor_1d(F32, 4, "z").set_input()
    assert s.reserve(graph_of(ops.sqr(ops.sqr(x)).set_output()))
    q = s.plan()
    assert (q.n_splits, q.n_nodes) == (1, 2)   # the scheduler now holds the other graph's plan
    # split_graph's graph_copy: the 5 nodes, and per split input (x, w1) a dependency view and its copy
    assert p.n_splits == 2 and p.n_nodes == 5 and p.graph_copy_nodes == 9
    bufs = {b.buft: b for b in p.buffers}
    assert bufs["CUDA0"].allocated == 12288 and bufs["CPU"].allocated == 4096
    for b in p.buffers:
        assert b.lower_bound is not None and b.lower_bound <= b.needed <= b.allocated
    assert seen == (p.n_splits, p.n_nodes, p.graph_copy_nodes, [(sp.backend, sp.i_start, sp.i_end) for sp in p.splits],
                    [(a.buft, a.name, a.offset, a.size, a.first, a.last) for a in p.allocs],
                    [(b.buft, b.allocated, b.needed, b.chunks, b.lower_bound) for b in p.buffers])


def _fragmenting_graph() -> Graph:
    """x[64] (a graph input), a, b, c = cont(x); s1 = sum_rows(a); s2 = sum_rows(c); big = concat(b, b).

    256-byte tensors on the CPU (alignment 32). ggml's walk: x at 0, a 256, b 512, c 768; x, a and c are
    freed behind s1 (at 0) and s2 (at 32), so the holes are [64, 512) and the end from 768: big (512) goes at
    768, 1280 bytes. Live at once: x, a, b, c (1024) before s1; b, s1, s2, big (832) at big: the bound is 1024.
    """
    x = ops.new_tensor_1d(F32, 64, "x").set_input()
    a, b, c = (ops.cont(x).set_name(n) for n in "abc")
    s1 = ops.sum_rows(a).set_name("s1").set_output()
    s2 = ops.sum_rows(c).set_name("s2").set_output()
    big = ops.concat(b, b, 0).set_name("big").set_output()
    g = graph_of(a, b, c, s1, s2, big, size=64)
    assert [t.name for t in g.nodes] == ["a", "b", "c", "s1", "s2", "big"]
    return g


def _no_live_overlap(p: Plan) -> None:
    allocs = [a for a in p.allocs if a.size]
    for i, a in enumerate(allocs):
        for b in allocs[i + 1:]:
            if a.buft != b.buft or a.chunk != b.chunk or a.inplace_of == b.name or b.inplace_of == a.name:
                continue
            if a.offset < b.offset + b.size and b.offset < a.offset + a.size:
                assert a.last < b.first or b.last < a.first, (a, b)


def test_offline_planner_never_worse_than_lower_bound() -> None:
    """Where ggml's walk already reaches the bound (the llama-like graph) and where it leaves a hole (the
    fragmenting graph), the offline plan needs exactly the lower bound, with no two live tensors overlapping."""
    g0, g1, c = gpu(0), gpu(1), cpu()
    s = Scheduler([g0, g1, c], None, 2048, False, True, planner="offline")
    reserve_then_alloc(s, lambda: _llama_like_build(g0, g1, c, 64)[0])
    assert s.n_splits == 3
    p = s.plan()
    # per GPU: the copied layer input, the norm and the ffn output are live at once (3 x 64 x 64 x 4 bytes);
    # the CPU: inp_tokens (256) and inp_embd (16384)
    assert [(b.buft, b.lower_bound, b.needed) for b in p.buffers] == \
        [("CUDA0", 49152, 49152), ("CUDA1", 49152, 49152), ("CPU", 16640, 16640)]
    _no_live_overlap(p)

    ggml = Scheduler([cpu()], None, 64, False, True)
    assert ggml.reserve(_fragmenting_graph())
    assert [(b.lower_bound, b.needed) for b in ggml.plan().buffers] == [(1024, 1280)]
    off = Scheduler([cpu()], None, 64, False, True, planner="offline")
    assert off.reserve(_fragmenting_graph())
    q = off.plan()
    assert [(b.lower_bound, b.needed, b.allocated) for b in q.buffers] == [(1024, 1024, 1024)]
    assert off.buffer_size(0) == 1024
    _no_live_overlap(q)
    assert max(a.offset + a.size for a in q.allocs) <= 1024


def test_unknown_planner() -> None:
    with pytest.raises(ValueError, match="planner 'best'"):
        Scheduler([cpu()], None, 64, False, True, planner="best")


def test_graph_inputs_named_by_backend() -> None:
    s = _two_backend_mlp(4, True)
    names = [t.name for t in s.graph_copy_nodes]
    assert names[:2] == ["x (view)", "CUDA0#x#0"]
    assert s.assignment is not None and isinstance(s.assignment.graph, Graph)


def test_offline_planner_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    import toolkit.sched
    monkeypatch.setitem(sys.modules, "toolkit.sched.offline", None)
    monkeypatch.delattr(toolkit.sched, "offline", raising=False)
    s = Scheduler([cpu()], None, 64, False, True, planner="offline")
    x = ops.new_tensor_1d(F32, 4, "x").set_input()
    with pytest.raises(ImportError, match="planner='offline' needs toolkit.sched.offline"):
        s.reserve(graph_of(ops.sqr(x).set_output(), size=64))
