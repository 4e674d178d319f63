"""Small scheduler graphs measured on the real C code (``ggml_backend_sched_reserve``, ``reset``,
``ggml_backend_sched_alloc_graph``, then ``ggml_backend_sched_get_buffer_size`` per backend): exact
bytes, offsets and split counts.

Unless a test says otherwise the backends are the fixtures of ``sched_fixtures``: a fake GPU (align
128, not host, CUDA batch rule with threshold 32) and the CPU (host buft, align 32); tensors are
f32, weights sit in their backend's buft with usage WEIGHTS, inputs are flagged INPUT.
"""

from __future__ import annotations

import pytest
from sched_fixtures import cpu, gpu, graph_of, reserve_then_alloc, weight

from toolkit.backend import profiles
from toolkit.ggml import F32, I32, Graph, ops
from toolkit.sched import Cause, Scheduler


# ---- one CPU backend, a chain -----------------------------------------------------------
def test_single_cpu_chain_reuses_in_place() -> None:
    """One CPU backend: ``x[10]``, ``a = scale(x)``, ``b = sqr(a)``, ``m = mul(a, b)``, ``r = sum_rows(m)``.

    a takes x's slot in place (x has one child), m takes a's slot in place: CPU = 128, 1 split."""
    s = Scheduler([cpu()], None, 64, False, True)

    def build() -> Graph:
        x = ops.new_tensor_1d(F32, 10, "x").set_input()
        a = ops.scale(x, 2.0)
        b = ops.sqr(a)
        m = ops.mul(a, b)
        return graph_of(ops.sum_rows(m).set_output(), size=64)

    reserve_then_alloc(s, build)
    assert s.n_splits == 1
    assert s.buffer_size(0) == 128
    allocs = {a.name: (a.offset, a.inplace_of) for a in s.plan().allocs}
    assert allocs["x"] == (0, None)
    assert allocs["node_0"] == (0, "x")          # a = scale(x) in place
    assert allocs["node_1"] == (64, None)        # b
    assert allocs["node_2"] == (0, "node_0")     # m in place of a
    assert allocs["node_3"] == (64, None)        # r


# ---- two backends (GPU, CPU), one weight on each ----------------------------------------
def _two_backend_mlp(T: int, op_offload: bool, parallel: bool = False) -> Scheduler:
    """GPU + CPU, w0[16x16] on the GPU, w1[16x16] on the CPU: ``h0 = mul_mat(w0, x[16xT])``,
    ``a0 = silu(h0)``, ``h1 = mul_mat(w1, a0)``, ``a1 = silu(h1)``, ``o = add(a1, a0)``."""
    g0, c = gpu(), cpu()
    s = Scheduler([g0, c], None, 2048, parallel, op_offload)

    def build() -> Graph:
        w0 = weight(g0, "w0", 16, 16)
        w1 = weight(c, "w1", 16, 16)
        x = ops.new_tensor_2d(F32, 16, T, "x").set_input()
        h0 = ops.mul_mat(w0, x).set_name("h0")
        a0 = ops.silu(h0).set_name("a0")
        h1 = ops.mul_mat(w1, a0).set_name("h1")
        a1 = ops.silu(h1).set_name("a1")
        o = ops.add(a1, a0).set_name("o").set_output()
        g = graph_of(o)
        assert [t.name for t in g.nodes] == ["h0", "a0", "h1", "a1", "o"]
        assert [t.name for t in g.leafs] == ["w1", "w0", "x"]
        return g

    reserve_then_alloc(s, build)
    return s


def test_two_backends_small_batch_not_offloaded() -> None:
    """T=4 < the offload threshold 32: GPU [h0, a0], CPU [h1, a1, o]; o reuses a0's copy made for h1."""
    s = _two_backend_mlp(4, True)
    assert s.n_splits == 2
    assert [(sp.backend_id, sp.i_start, sp.i_end) for sp in s.splits] == [(0, 0, 2), (1, 2, 5)]
    assert (s.buffer_size(0), s.buffer_size(1)) == (512, 512)
    p = s.plan()
    offs = {(a.buft, a.name): a.offset for a in p.allocs}
    assert offs[("CPU", "x")] == 0 and offs[("CUDA0", "CUDA0#x#0")] == 0 and offs[("CUDA0", "h0")] == 256
    assert offs[("CPU", "CPU#a0#0")] == 0 and offs[("CPU", "h1")] == 256
    # o reuses the copy of a0 made for h1: split 1 has a single input
    assert [i.name for i in p.splits[1].inputs] == ["a0"]


def test_two_backends_large_batch_offloads_host_weight() -> None:
    """T=64: h1 is op-offloaded; the host weight w1 becomes an input and starts a new GPU split."""
    s = _two_backend_mlp(64, True)
    assert s.n_splits == 2
    assert [s.backends[sp.backend_id].name for sp in s.splits] == ["CUDA0", "CUDA0"]
    assert (s.buffer_size(0), s.buffer_size(1)) == (12288, 4096)
    p = s.plan()
    h1 = next(n for n in p.nodes if n.name == "h1")
    assert h1.cause is Cause.OP_OFFLOAD and h1.split == 1
    offs = {(a.buft, a.name): a.offset for a in p.allocs}
    assert offs[("CUDA0", "CUDA0#w1#0")] == 0 and offs[("CUDA0", "h1")] == 8192


def test_two_backends_op_offload_off() -> None:
    """T=64 with op offload off: h1 stays with its weight on the CPU."""
    s = _two_backend_mlp(64, False)
    assert s.n_splits == 2
    assert [s.backends[sp.backend_id].name for sp in s.splits] == ["CUDA0", "CPU"]
    assert (s.buffer_size(0), s.buffer_size(1)) == (8192, 8192)


def test_two_backends_parallel_input_copies() -> None:
    """T=4 with pipeline parallelism: 4 persistent copies of each graph and split input."""
    s = _two_backend_mlp(4, True, parallel=True)
    assert s.n_copies == 4 and s.n_splits == 2
    assert (s.buffer_size(0), s.buffer_size(1)) == (1280, 2304)
    offs = {(a.buft, a.name): a.offset for a in s.plan().allocs}
    assert offs[("CPU", "h1")] == 2048 and offs[("CUDA0", "h0")] == 1024


# ---- a GPU that lacks an op -------------------------------------------------------------
def test_gpu_lacking_sqr_splits_three_ways() -> None:
    """The GPU lacks SQR: ``h = mul_mat(w0, x)``, ``q = sqr(h)``, ``t = scale(q)``, ``o = add(t, h)``.

    Pass 3 picks the CPU for q (best inputs); 3 splits GPU [h], CPU [q], GPU [t, o]."""
    g0, c = gpu(excluded_ops=["SQR"]), cpu()
    s = Scheduler([g0, c], None, 2048, False, True)

    def build() -> Graph:
        w0 = weight(g0, "w0", 8, 8)
        x = ops.new_tensor_2d(F32, 8, 4, "x").set_input()
        h = ops.mul_mat(w0, x).set_name("h")
        q = ops.sqr(h).set_name("q")
        t = ops.scale(q, 0.5).set_name("t")
        return graph_of(ops.add(t, h).set_name("o").set_output())

    reserve_then_alloc(s, build)
    assert s.n_splits == 3
    assert [s.backends[sp.backend_id].name for sp in s.splits] == ["CUDA0", "CPU", "CUDA0"]
    p = s.plan()
    q = next(n for n in p.nodes if n.name == "q")
    assert q.cause is Cause.BEST_INPUTS and q.backend == "CPU"
    assert [i.name for i in p.splits[2].inputs] == ["q"]
    assert (s.buffer_size(0), s.buffer_size(1)) == (256, 128)


# ---- BLAS sharing the CPU's buft --------------------------------------------------------
def test_blas_shares_cpu_buft() -> None:
    """A BLAS-like backend and the CPU share one host buft: ``h = mul_mat(w, x)``, ``a = silu(h)``,
    ``h2 = mul_mat(w, a)``; 3 splits without inputs, one de-duplicated buffer."""
    c = cpu()
    blas = profiles.blas_like(c)
    s = Scheduler([blas, c], None, 2048, False, True)

    def build() -> Graph:
        w = weight(c, "w", 8, 8)
        x = ops.new_tensor_2d(F32, 8, 2, "x").set_input()
        h = ops.mul_mat(w, x).set_name("h")
        a = ops.silu(h).set_name("a")
        return graph_of(ops.mul_mat(w, a).set_name("h2").set_output())

    reserve_then_alloc(s, build)
    assert s.n_splits == 3
    assert all(sp.n_inputs == 0 for sp in s.splits)
    assert (s.buffer_size(0), s.buffer_size(1)) == (128, 0)
    p = s.plan()
    assert {n.name: n.backend for n in p.nodes} == {"h": "BLAS", "a": "CPU", "h2": "BLAS"}
    offs = {a.name: a.offset for a in p.allocs}
    assert (offs["x"], offs["h"], offs["a"], offs["h2"]) == (0, 64, 64, 0)


# ---- split-input capacity ----------------------------------------------------------------
def _split_inputs_graph(g0, c, variant: bool) -> Graph:  # type: ignore[no-untyped-def]
    """35 GPU weights w_i[4] and CPU inputs x_i[4]: ``y_i = mul(x_i, w_i)``, ``acc = add(acc, y_i)``.

    The variant adds ``xx`` to x29, so one node brings two new inputs while the split holds 29."""
    acc = None
    for i in range(35):
        w = weight(g0, f"w{i}", 4)
        x = ops.new_tensor_1d(F32, 4, f"x{i}").set_input()
        if variant and i == 29:
            xx = ops.new_tensor_1d(F32, 4, "xx").set_input()
            x = ops.add(x, xx)
        y = ops.mul(x, w)
        acc = y if acc is None else ops.add(acc, y)
    assert acc is not None
    return graph_of(acc.set_output())


def test_split_inputs_capacity_forces_new_split() -> None:
    """The 31st new input starts a new split on the same backend: 2 splits of 30 + 5 inputs."""
    g0, c = gpu(), cpu()
    s = Scheduler([g0, c], None, 2048, False, True)
    reserve_then_alloc(s, lambda: _split_inputs_graph(g0, c, False))
    assert s.n_splits == 2
    assert [sp.n_inputs for sp in s.splits] == [30, 5]
    assert (s.buffer_size(0), s.buffer_size(1)) == (3840, 1120)


def test_split_inputs_capacity_grows_and_persists() -> None:
    """Two new inputs at 29 grow the capacity from 30 to 60 (1 split); the grown capacity persists
    in the split slot when the first graph is planned again on the same scheduler."""
    g0, c = gpu(), cpu()
    s = Scheduler([g0, c], None, 2048, False, True)
    reserve_then_alloc(s, lambda: _split_inputs_graph(g0, c, True))
    assert "increasing split inputs capacity from 30 to 60" in s.warnings
    assert s.n_splits == 1
    assert (s.buffer_size(0), s.buffer_size(1)) == (4608, 1152)
    # the first graph again, on the same scheduler: the capacity persisted, buffers did not shrink
    s.reset()
    reserve_then_alloc(s, lambda: _split_inputs_graph(g0, c, False))
    assert s.n_splits == 1
    assert s.buffer_size(0) == 4608
    assert s.split_capacities[0] == 60


# ---- buffers only grow ------------------------------------------------------------------
def test_buffers_never_shrink() -> None:
    """CPU, ``y = sqr(x)``, ``z = mul(x, y)`` reserved at n = 100, 10, 200: 832, 832 (kept), 1600."""
    s = Scheduler([cpu()], None, 64, False, True)
    for n, want in ((100, 832), (10, 832), (200, 1600)):
        x = ops.new_tensor_1d(F32, n, "x").set_input()
        y = ops.sqr(x)
        g = graph_of(ops.mul(x, y).set_output(), size=64)
        assert s.reserve(g)
        assert s.buffer_size(0) == want
        s.reset()


# ---- views ------------------------------------------------------------------------------
def test_views_never_reused_in_place() -> None:
    """CPU: ``a = sqr(x)``, ``v = view_1d(a, 8, 0)``, ``r = scale(v)``, ``s = sum(r)``, ``b = exp(x)``,
    ``m = sum(b)``, ``o = add(s, m)``; r cannot reuse v or a in place (a view is never own): CPU = 160."""
    s = Scheduler([cpu()], None, 64, False, True)

    def build() -> Graph:
        x = ops.new_tensor_1d(F32, 16, "x").set_input()
        a = ops.sqr(x).set_name("a")
        v = ops.view_1d(a, 8, 0).set_name("v")
        r = ops.scale(v, 2.0).set_name("r")
        sm = ops.sum(r).set_name("s")
        b = ops.exp(x).set_name("b")
        m = ops.sum(b).set_name("m")
        g = graph_of(ops.add(sm, m).set_name("o").set_output(), size=64)
        assert [t.name for t in g.nodes] == ["a", "v", "r", "s", "b", "m", "o"]
        return g

    reserve_then_alloc(s, build)
    assert s.buffer_size(0) == 160
    offs = {a.name: (a.offset, a.inplace_of) for a in s.plan().allocs}
    assert offs["a"] == (64, None) and offs["r"] == (128, None) and offs["s"] == (64, None)
    assert offs["b"] == (0, "x") and offs["m"] == (96, None) and offs["o"] == (64, "s")


# ---- a llama-like graph on three backends -------------------------------------------------
def _llama_like_build(g0, g1, c, T: int):  # type: ignore[no-untyped-def]
    """GPU0, GPU1, CPU: tok_embd on the CPU, layer 0 on GPU0, layer 1 and the output on GPU1; per layer
    ``norm_raw = rms_norm(cur)``, ``norm = mul(norm_raw, w_norm)``, ``ffn = mul_mat(w, norm)``,
    ``act = silu(ffn)``, ``l_out = add(act, cur)``; then ``logits = mul_mat(output, l_out-1)``."""
    E, V = 64, 100
    tok = weight(c, "tok_embd", E, V)
    layers = [(weight(g0, "blk0.w", E, E), weight(g0, "blk0.norm", E)),
              (weight(g1, "blk1.w", E, E), weight(g1, "blk1.norm", E))]
    out_w = weight(g1, "output", E, V)
    inp = ops.new_tensor_1d(I32, T, "inp_tokens").set_input()
    cur = ops.get_rows(tok, inp).set_name("inp_embd")
    norms = []
    for il, (w, w_norm) in enumerate(layers):
        norm_raw = ops.rms_norm(cur, 1e-5).set_name(f"norm_raw-{il}")
        norms.append(norm_raw)
        norm = ops.mul(norm_raw, w_norm).set_name(f"norm-{il}")
        ffn = ops.mul_mat(w, norm).set_name(f"ffn-{il}")
        act = ops.silu(ffn).set_name(f"act-{il}")
        cur = ops.add(act, cur).set_name(f"l_out-{il}")
    logits = ops.mul_mat(out_w, cur).set_name("logits").set_output()
    return graph_of(logits), norms


@pytest.mark.parametrize(("T", "parallel", "sizes"), [
    (1, False, (768, 768, 288)),
    (64, False, (49152, 49152, 16640)),
    (64, True, (98304, 189440, 17408)),
])
def test_llama_like_three_backends(T: int, parallel: bool, sizes: tuple[int, int, int]) -> None:
    """norm_raw-1 is expanded down from layer 0 onto GPU0, so the GPU1 split has 2 inputs."""
    g0, g1, c = gpu(0), gpu(1), cpu()
    s = Scheduler([g0, g1, c], None, 2048, parallel, True)
    reserve_then_alloc(s, lambda: _llama_like_build(g0, g1, c, T)[0])
    assert s.n_splits == 3
    assert tuple(s.buffer_size(i) for i in range(3)) == sizes
    p = s.plan()
    assert next(n for n in p.nodes if n.name == "norm_raw-1").backend == "CUDA0"
    assert [i.name for i in p.splits[2].inputs] == ["norm_raw-1", "l_out-0"]


def test_llama_norm_pin_removes_cross_gpu_input() -> None:
    """The llama graph callback's pin (``set_tensor_backend`` of norm_raw-il to layer il's GPU): the GPU1
    split keeps 1 input (l_out-0); sizes are unchanged."""
    g0, g1, c = gpu(0), gpu(1), cpu()
    s = Scheduler([g0, g1, c], None, 2048, False, True)
    built: dict[str, list] = {}

    def build() -> Graph:
        g, norms = _llama_like_build(g0, g1, c, 1)
        built["norms"] = norms
        return g

    def pins(s: Scheduler, g: Graph) -> None:
        for il, t in enumerate(built["norms"]):
            s.set_tensor_backend(t, il)

    reserve_then_alloc(s, build, pins)
    assert s.n_splits == 3
    p = s.plan()
    assert [i.name for i in p.splits[2].inputs] == ["l_out-0"]
    assert next(n for n in p.nodes if n.name == "norm_raw-1").cause is Cause.USER_PIN
    assert tuple(s.buffer_size(i) for i in range(3)) == (768, 768, 288)
