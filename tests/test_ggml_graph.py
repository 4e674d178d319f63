"""Graph building in ggml's order (build_forward_expand), names, capacity, text form.

Node and leaf orders of the two-backend MLP and of the view graph (the graphs of
tests/test_sched_vectors.py) are the ones ``ggml_build_forward_expand`` gives in the real C code.
"""

from __future__ import annotations

import pytest

from toolkit.ggml import F32, I32, Graph, GraphFull, Op, Tensor, build_graph, ops


def _names(ts: list[Tensor]) -> list[str]:
    return [t.name for t in ts]


def _two_backend_mlp() -> Tensor:
    """h0 = mul_mat(w0, x), a0 = silu(h0), h1 = mul_mat(w1, a0), a1 = silu(h1), o = add(a1, a0)."""
    w0 = ops.new_tensor_2d(F32, 16, 16, "w0")
    w1 = ops.new_tensor_2d(F32, 16, 16, "w1")
    x = ops.new_tensor_2d(F32, 16, 4, "x").set_input()
    h0 = ops.mul_mat(w0, x).set_name("h0")
    a0 = ops.silu(h0).set_name("a0")
    h1 = ops.mul_mat(w1, a0).set_name("h1")
    a1 = ops.silu(h1).set_name("a1")
    return ops.add(a1, a0).set_name("o").set_output()


def test_two_backend_mlp_order() -> None:
    g = build_graph([_two_backend_mlp()])
    assert _names(g.nodes) == ["h0", "a0", "h1", "a1", "o"]
    assert _names(g.leafs) == ["w1", "w0", "x"]


def test_view_graph_order_views_are_nodes() -> None:
    x = ops.new_tensor_1d(F32, 16, "x")
    a = ops.sqr(x).set_name("a")
    v = ops.view_1d(a, 8, 0).set_name("v")
    r = ops.scale(v, 2.0).set_name("r")
    s = ops.sum(r).set_name("s")
    b = ops.exp(x).set_name("b")
    m = ops.sum(b).set_name("m")
    o = ops.add(s, m).set_name("o")
    g = build_graph([o])
    assert _names(g.nodes) == ["a", "v", "r", "s", "b", "m", "o"]
    assert _names(g.leafs) == ["x"]
    assert g.nodes[1].op is Op.VIEW


def test_sources_before_users_each_once() -> None:
    g = build_graph([_two_backend_mlp()])
    seen: set[int] = set(id(t) for t in g.leafs)
    for t in g.nodes:
        assert all(id(s) in seen for s in t.srcs)
        seen.add(id(t))
    assert len(seen) == g.n_nodes + g.n_leafs


def test_expand_twice_adds_nothing_and_counts_new_nodes() -> None:
    out = _two_backend_mlp()
    g = Graph(16)
    assert g.build_forward_expand(out) == 5
    assert g.build_forward_expand(out) == 0
    extra = ops.scale(out, 0.5)
    assert g.build_forward_expand(extra) == 1
    assert g.n_nodes == 6 and g.n_leafs == 3


def test_several_outputs_expand_in_call_order() -> None:
    x = ops.new_tensor_1d(F32, 4, "x")
    p = ops.sqr(x).set_name("p")
    q = ops.sqrt(x).set_name("q")
    g = build_graph([q, p])
    assert _names(g.nodes) == ["q", "p"]


def test_unnamed_tensors_get_position_names() -> None:
    x = ops.new_tensor_1d(F32, 4)
    y = ops.new_tensor_1d(F32, 4)
    z = ops.mul(ops.add(x, y), x)
    g = build_graph([z])
    assert _names(g.leafs) == ["leaf_0", "leaf_1"]
    assert _names(g.nodes) == ["node_0", "node_1"]


def test_use_counts() -> None:
    out = _two_backend_mlp()
    g = build_graph([out])
    by_name = {t.name: t for t in g.nodes + g.leafs}
    assert g.use_count(by_name["a0"]) == 2  # h1 and o
    assert g.use_count(by_name["x"]) == 1
    assert g.use_count(out) == 0


@pytest.mark.parametrize("size", [1, 2, 4])
def test_capacity_error_names_the_limit(size: int) -> None:
    x = ops.new_tensor_1d(F32, 4, "x")
    t = x
    for i in range(size + 1):
        t = ops.sqr(t).set_name(f"sq{i}")
    g = Graph(size)
    with pytest.raises(GraphFull, match=rf"capacity {size} exceeded by node sq{size} \(n_nodes would be {size + 1}\)"):
        g.build_forward_expand(t)
    assert isinstance(GraphFull("x"), ValueError)


def test_leaf_capacity() -> None:
    xs = [ops.new_tensor_1d(F32, 4, f"x{i}") for i in range(3)]
    with pytest.raises(GraphFull, match=r"capacity 2 exceeded by leaf x2"):
        build_graph([ops.concat(ops.concat(xs[0], xs[1], 0), xs[2], 0)], size=2)


def test_bad_size() -> None:
    with pytest.raises(ValueError, match="positive, got 0"):
        Graph(0)


def test_text_form_lists_index_op_name_shape_sources() -> None:
    g = build_graph([_two_backend_mlp()])
    lines = g.to_text(leafs=True).splitlines()
    assert lines[0].startswith("graph: 5 nodes, 3 leafs")
    node_lines = [ln for ln in lines if ln.startswith("node #")]
    leaf_lines = [ln for ln in lines if ln.startswith("leaf #")]
    assert len(node_lines) == 5 and len(leaf_lines) == 3
    for i, (ln, t) in enumerate(zip(node_lines, g.nodes, strict=True)):
        head, _, srcs = ln.partition("<-")
        assert head.startswith(f"node #{i:3d}")
        assert f"({t.op_desc():>10s})" in head and t.name in head and t.shape_str() in head
        assert [s.strip() for s in srcs.split(",")] == [s.name for s in t.srcs]
    assert "MUL_MAT" in node_lines[0] and "SILU" in node_lines[1]
    assert str(g) == g.to_text()


def test_get_rows_and_rope_in_a_graph() -> None:
    tok = ops.new_tensor_2d(F32, 8, 10, "token_embd")
    ids = ops.new_tensor_1d(I32, 3, "inp_tokens").set_input()
    emb = ops.get_rows(tok, ids).set_name("inp_embd")
    q = ops.reshape_3d(emb, 4, 2, 3)
    pos = ops.new_tensor_1d(I32, 3, "inp_pos").set_input()
    rq = ops.rope_ext(q, pos, None, 4).set_name("Qcur")
    g = build_graph([rq])
    assert _names(g.leafs) == ["token_embd", "inp_tokens", "inp_pos"]
    assert [t.op for t in g.nodes] == [Op.GET_ROWS, Op.RESHAPE, Op.ROPE]


def test_pad_appends_zeros_after_each_dimension() -> None:
    """``ggml_pad(a, p0, p1, p2, p3)`` is ``ggml_pad_ext`` with nothing before: ne grows by p, a new tensor
    (not a view), params lp0, rp0, ... rp3 and the circular flag 0."""
    a = ops.new_tensor_2d(F32, 6, 3, "v")
    p = ops.pad(a, 2, 1)
    assert p.ne == (8, 4, 1, 1) and p.op is Op.PAD and p.src == [a] and p.view_src is None
    assert p.op_params == {"lp0": 0, "rp0": 2, "lp1": 0, "rp1": 1, "lp2": 0, "rp2": 0, "lp3": 0, "rp3": 0,
                           "circular": 0}
    assert p.nbytes == 8 * 4 * 4
    with pytest.raises(ValueError, match="ggml_pad"):
        ops.pad(a, -1)
