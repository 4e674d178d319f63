"""toolkit.trace: jaxpr → ggml graph conversion, placement, support rules, errors (in-process, one device)."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toolkit
from toolkit.backend import profiles
from toolkit.ggml import BufferUsage, GGMLType, Op, TensorFlag, UnaryOp
from toolkit.sched import CAN_INPLACE_OPS
from toolkit.trace import LeafInfo, Step, UnsupportedPrimitive, lacking, only, support_table, trace


def _ops(tr: object) -> list[str]:
    return [t.op_desc() for t in tr.graph.nodes]  # type: ignore[attr-defined]


# ---- shapes, types, leafs -------------------------------------------------------------------

def test_ne_is_reversed_numpy_shape_and_types_map() -> None:
    tr = trace(lambda x, i, b: (jnp.exp(x), i + 1, ~b), jnp.ones((2, 3, 5)), jnp.ones((4,), jnp.int32),
               jnp.ones((7,), bool))
    exp, add, inv = tr.graph.nodes
    assert exp.ne == (5, 3, 2, 1) and exp.type is GGMLType.F32
    assert add.ne == (4, 1, 1, 1) and add.type is GGMLType.I32
    assert inv.type is GGMLType.I8  # bool: one byte, ggml has no bool type
    assert exp.nbytes == 2 * 3 * 5 * 4


def test_rank_above_four_folds_into_ne3() -> None:
    tr = trace(lambda x: x * x, jnp.ones((2, 3, 4, 5, 6)))
    (node,) = tr.graph.nodes
    assert node.ne == (6, 5, 4, 6)
    assert node.nbytes == 2 * 3 * 4 * 5 * 6 * 4


def test_leaf_kinds_and_flags() -> None:
    table = np.arange(6.0, dtype=np.float32)

    def f(p, x):
        return x * 3.0 + p["w"] + jnp.asarray(table)

    tr = trace(f, jnp.ones(6), params={"w": jnp.ones(6)})
    kinds = {t.extra.kind for t in tr.graph.leafs if isinstance(t.extra, LeafInfo)}
    assert kinds == {"input", "param", "literal", "const"}
    (inp,) = [t for t in tr.graph.leafs if t.extra.kind == "input"]
    assert inp.flags & TensorFlag.INPUT
    assert tr.graph.nodes[-1].flags & TensorFlag.OUTPUT
    assert all(not t.is_input for t in tr.graph.leafs if t.extra.kind != "input")


def test_dead_equations_are_dropped_and_nodes_follow_jaxpr_order() -> None:
    def f(x):
        unused = jnp.sin(x)  # noqa: F841 - dead code in the jaxpr
        return jnp.exp(x) + 1.0

    tr = trace(f, jnp.ones(3))
    assert "SIN" not in _ops(tr)
    assert _ops(tr) == ["EXP", "ADD"]


# ---- primitive → ggml op mapping ------------------------------------------------------------

def test_elementwise_and_matmul_mapping() -> None:
    def f(p, x):
        h = x @ p["w"] + p["b"]
        return jnp.tanh(h) * 2.0 - jnp.exp(h) / jnp.sqrt(jnp.abs(h) + 1.0)

    tr = trace(f, jnp.ones((4, 8)), params={"w": jnp.ones((8, 16)), "b": jnp.ones(16)})
    nodes = tr.graph.nodes
    mm = nodes[0]
    assert mm.op is Op.MUL_MAT and mm.ne == (16, 4, 1, 1)
    assert mm.src[0].name == "w" and mm.src[1].name == "in:0"  # ggml order: weight first
    ops = {t.op for t in nodes}
    assert {Op.ADD, Op.MUL, Op.SUB, Op.DIV, Op.SQRT, Op.UNARY} <= ops
    unary = {t.op_params["unary"] for t in nodes if t.op is Op.UNARY}
    assert unary == {UnaryOp.TANH, UnaryOp.EXP, UnaryOp.ABS}
    assert all(t.op_params["primitive"] for t in nodes)


def test_inplace_ops_only_on_elementwise_nodes() -> None:
    """Every node the allocator may compute in place has src0 of its own type and shape
    (``ggml_gallocr_allocate_node``'s in-place rule)."""

    def f(x, y):
        a = jnp.exp(x) + y[None, :]             # broadcast add: the full operand is src0
        b = 2.0 * a                             # scalar first: commuted into MUL(a, 2.0)
        c = jnp.concatenate([b, a], axis=0)     # CONCAT: never in place
        return (c.T @ c).sum(axis=-1), jnp.maximum(b, 0.0)

    tr = trace(f, jnp.ones((4, 8)), jnp.ones(8))
    for t in tr.graph.nodes:
        if t.op in CAN_INPLACE_OPS:
            s0 = t.src[0]
            assert s0.type is t.type and s0.ne == t.ne, t
        if t.op is Op.JAX:
            assert t.op not in CAN_INPLACE_OPS
    assert Op.JAX in {t.op for t in tr.graph.nodes}  # max and others stay JAX nodes


def test_views_reshape_permute_slice_split() -> None:
    def f(x):
        r = x.reshape(3, 2, 4)                 # RESHAPE view
        p = r.transpose(1, 0, 2)               # PERMUTE view
        c = p.reshape(6, 4)                    # not contiguous: a real copy (JAX node)
        a, b = jnp.split(x, 2, axis=1)         # two VIEWs
        s = x[1:3]                             # slice: VIEW
        return c, a + b, s

    tr = trace(f, jnp.arange(24.0).reshape(6, 4))
    by_prim = {t.op_params["primitive"] + ("" if ":" not in t.name else t.name[-2:]): t for t in tr.graph.nodes}
    r = next(t for t in tr.graph.nodes if t.op is Op.RESHAPE)
    assert r.view_src is not None and r.ne == (4, 2, 3, 1)
    p = next(t for t in tr.graph.nodes if t.op is Op.PERMUTE)
    assert p.view_src is not None and p.ne == (4, 3, 2, 1) and not p.is_contiguous
    copy = next(t for t in tr.graph.nodes if t.op is Op.JAX and t.op_params["primitive"] == "reshape")
    assert copy.view_src is None and copy.ne == (4, 6, 1, 1)
    assert by_prim["split:0"].op is Op.VIEW and by_prim["split:1"].view_offs == 2 * 4
    sl = by_prim["slice"]
    assert sl.op is Op.VIEW and sl.view_offs == 1 * 4 * 4 and sl.ne == (4, 2, 1, 1)


def test_concat_gather_and_multi_output() -> None:
    def f(p, ids, x):
        e = jnp.take(p["emb"], ids, axis=0)
        vals, idx = jax.lax.top_k(x, 2)
        return jnp.concatenate([e, e], axis=-1), jnp.concatenate([x, x, x]), vals, idx

    tr = trace(f, jnp.array([1, 2, 0]), jnp.ones((5, 4)), params={"emb": jnp.ones((10, 4))})
    nodes = tr.graph.nodes
    gr = next(t for t in nodes if t.op is Op.GET_ROWS)
    assert gr.src[0].name == "emb" and gr.ne == (4, 3, 1, 1)
    cc = next(t for t in nodes if t.op is Op.CONCAT)
    assert cc.op_params["dim"] == 0 and cc.ne == (8, 3, 1, 1)
    three = [t for t in nodes if t.op is Op.JAX and t.op_params["primitive"] == "concatenate"]
    assert len(three) == 1  # ggml CONCAT is binary: three operands stay one JAX node
    packed = next(t for t in nodes if t.op_params.get("n_outputs") == 2)
    outs = [t for t in nodes if t.view_src is packed]
    assert [o.type for o in outs] == [GGMLType.F32, GGMLType.I32]
    assert packed.nbytes == sum(o.nbytes for o in outs)
    assert outs[1].view_offs == outs[0].nbytes


def test_nested_calls_inline_or_kept() -> None:
    inner = jax.jit(lambda z: jnp.sin(z) + 1.0)

    def f(x):
        return inner(jax.nn.relu(x)) * 2.0

    flat = trace(f, jnp.ones(4))
    assert _ops(flat) == ["MAX", "SIN", "ADD", "MUL"]  # relu's custom_jvp and the jit inlined
    kept = trace(f, jnp.ones(4), inline=False)
    prims = [t.op_params["primitive"] for t in kept.graph.nodes]
    assert prims == ["custom_jvp_call", "jit", "mul"]
    assert kept.graph.nodes[1].op is Op.JAX


def test_custom_vjp_and_remat_inline() -> None:
    @jax.custom_vjp
    def g(x):
        return jnp.sin(x)

    g.defvjp(lambda x: (jnp.sin(x), x), lambda r, ct: (ct * jnp.cos(r),))
    tr = trace(lambda x: g(jax.checkpoint(lambda z: z * 2.0)(x)), jnp.ones(3))
    assert _ops(tr) == ["MUL", "SIN"]


# ---- errors ---------------------------------------------------------------------------------

def test_unsupported_control_flow_names_primitive_equation_and_line() -> None:
    def f(x):
        y = jnp.exp(x)
        return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, y)

    with pytest.raises(UnsupportedPrimitive) as e:
        trace(f, jnp.ones(3))
    err = e.value
    assert err.primitive == "while" and err.where == "equation 1"
    assert "test_trace_convert.py" in err.source
    msg = str(e.value)
    assert "'while'" in msg and "equation 1" in msg and "test_trace_convert.py" in msg and "opaque=" in msg


def test_unsupported_inside_nested_jit_and_scan() -> None:
    @jax.jit
    def inner(x):
        return jax.lax.cond(x.sum() > 0, lambda a: a + 1, lambda a: a - 1, x)

    with pytest.raises(UnsupportedPrimitive, match=r"'cond' \(equation 0 \(jit 'inner'\) > equation \d+\)"):
        trace(lambda x: inner(x) * 2, jnp.ones(3))
    with pytest.raises(UnsupportedPrimitive, match="'scan'"):
        trace(lambda x: jax.lax.scan(lambda c, a: (c + a, c), 0.0, x)[0], jnp.ones(3))


def test_side_effects_and_dtypes_are_refused() -> None:
    def f(x):
        jax.debug.print("x={x}", x=x)
        return x + 1

    with pytest.raises(UnsupportedPrimitive, match="side effects"):
        trace(f, jnp.ones(3))
    with pytest.raises(UnsupportedPrimitive, match="complex64 has no ggml type"):
        trace(lambda x: x * 1j, jnp.ones(3))


def test_opaque_keeps_control_flow_as_one_node_and_runs() -> None:
    def f(x):
        return jax.lax.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, jnp.exp(x))

    tr = trace(f, jnp.ones(3), opaque=("while",), backends=[profiles.cpu(executor=jax.devices()[0])])
    assert _ops(tr) == ["EXP", "WHILE"]
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(np.asarray(tr(x)), np.asarray(jax.jit(f)(x)))


# ---- placement ------------------------------------------------------------------------------

def _sim_backends() -> list:
    sim0, sim1 = profiles.simulated(0), profiles.simulated(1)
    return [sim0, sim1, profiles.cpu(sim0.host_buft)]


def test_placement_by_glob_predicate_and_default() -> None:
    params = {"layers": [{"wq": jnp.ones((4, 4)), "wo": jnp.ones((4, 4))} for _ in range(2)],
              "emb": jnp.ones((10, 4))}

    def f(p, x):
        for layer in p["layers"]:
            x = x @ layer["wq"] @ layer["wo"]
        return x + p["emb"][0]

    bk = _sim_backends()
    tr = trace(f, jnp.ones((2, 4)), params=params, backends=bk,
               placement={"layers.1.*": 1, (lambda path, v: v.shape[0] == 10): -1})
    assert tr.where() == {"emb": "CPU", "layers.0.wo": "SIM0", "layers.0.wq": "SIM0",
                          "layers.1.wo": "SIM1", "layers.1.wq": "SIM1"}
    for w in tr.weights:
        assert w.buffer.usage is BufferUsage.WEIGHTS and w.is_weight
    by_buft = {b.buft.name: b.size for b in tr.weight_buffers}
    assert by_buft == {"SIM0": 128, "SIM1": 128, "SIM_Host": 160}
    tr.place(bk, lambda path, v: bk[2] if path == "emb" else 0)
    assert tr.where()["emb"] == "CPU" and tr.where()["layers.1.wq"] == "SIM0"
    with pytest.raises(ValueError, match="backend index 5 out of range for 3 backends"):
        tr.place(bk, 5)


# ---- support and scheduling on one device ---------------------------------------------------

def test_lacking_and_only_filter_by_primitive() -> None:
    tr = trace(lambda x: jnp.exp(x) + jnp.cumsum(x), jnp.ones(4))
    sim = lacking(profiles.simulated(0), "cumsum")
    blas_like = only(profiles.simulated(1), {"exp"})
    exp, cumsum, add = tr.graph.nodes
    assert sim.supports_op(exp) and not sim.supports_op(cumsum) and sim.supports_op(add)
    assert blas_like.supports_op(exp) and not blas_like.supports_op(add)
    text = support_table(tr.graph.nodes, [sim, blas_like])
    assert "cumsum" in text and "SIM0" in text


def test_schedule_and_run_in_process_single_device() -> None:
    dev = jax.devices()[0]
    sim0 = lacking(profiles.simulated(0, executor=dev), "exp")
    bk = [sim0, profiles.cpu(sim0.host_buft, executor=dev)]

    def f(p, x):
        h = jax.nn.softmax(x @ p["w"], axis=-1)
        return (h @ p["w"].T).reshape(-1)

    p = {"w": jax.random.normal(jax.random.PRNGKey(0), (8, 8))}
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 8))
    tr = trace(f, x, params=p, backends=bk)
    sch = tr.schedule()
    assert sch.ok and sch.problems() == []
    exp = next(i for i, t in enumerate(sch.built.graph.nodes) if t.op_params["primitive"] == "exp")
    assert sch.node_backend[exp] == 1  # SIM0 lacks exp: the CPU runs it
    ref = jax.jit(f)(p, x)
    for mode in ("eager", "jit"):
        np.testing.assert_allclose(np.asarray(sch.run(x, mode=mode)), np.asarray(ref), rtol=1e-6, atol=1e-6)
    assert sch.last_run is not None and len(sch.last_run.splits) == sch.n_splits
    # a second schedule splits a fresh build (ggml_backend_sched_split_graph mutates a graph)
    again = tr.schedule()
    assert again.built.graph is not sch.built.graph and again.splits == sch.splits
    assert isinstance(sch.built.graph.nodes[0].extra, Step)


def test_toolkit_trace_is_lazy_and_callable() -> None:
    code = "import sys, toolkit; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    tr = toolkit.trace(lambda x: jnp.exp(x) * 2.0, jnp.ones((2, 3)))
    assert _ops(tr) == ["EXP", "MUL"]


# ---- edge cases run end to end (one device, two backends) ------------------------------------

def _two_backends() -> list:
    dev = jax.devices()[0]
    sim = profiles.simulated(0, executor=dev)
    return [sim, profiles.cpu(sim.host_buft, executor=dev)]


EDGE_CASES = {
    "identity_outputs": (lambda p, x: (x, p["w"], 1.0), {"w": jnp.ones(3)}, (jnp.arange(3.0),)),
    "rank5": (lambda p, x: jnp.sum(x * p["w"], axis=(0, 1)), {"w": jnp.ones((2, 3, 4, 5, 6))},
              (jnp.ones((2, 3, 4, 5, 6)),)),
    "multi_output": (lambda p, x: (jnp.argsort(x), jax.lax.top_k(x * p["w"], 2)), {"w": jnp.ones(3)},
                     (jnp.array([3.0, 1.0, 2.0]),)),
    "int_ops": (lambda p, x: (x // 2, x % 3, jnp.cumsum(x) * p["w"]), {"w": jnp.ones(3, jnp.int32)},
                (jnp.array([5, 7, 9]),)),
    "bf16": (lambda p, x: (x.astype(jnp.bfloat16) * p["w"]).astype(jnp.float32), {"w": jnp.ones(3, jnp.bfloat16)},
             (jnp.ones(3),)),
    "scatter_dynamic_slice": (lambda p, x: jax.lax.dynamic_slice(x.at[1].set(5.0), (1,), (2,)) * p["w"][:2],
                              {"w": jnp.ones(3)}, (jnp.arange(3.0),)),
    "concat_12": (lambda p, x: jnp.concatenate([x * p["w"]] * 12), {"w": jnp.ones(3)}, (jnp.arange(3.0),)),
}


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_edge_cases_run_equal_to_jit(name: str) -> None:
    f, p, args = EDGE_CASES[name]
    tr = trace(f, *args, params=p, backends=_two_backends())
    sch = tr.schedule()
    assert sch.ok and sch.problems() == []
    got, want = jax.tree_util.tree_leaves(sch.run(*args)), jax.tree_util.tree_leaves(jax.jit(f)(p, *args))
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_concat_of_twelve_is_a_tree_of_at_most_ten_sources() -> None:
    f, p, args = EDGE_CASES["concat_12"]
    tr = trace(f, *args, params=p)
    concats = [t for t in tr.graph.nodes if t.op_params["primitive"] == "concatenate"]
    assert len(concats) == 3 and all(len(t.srcs) <= 10 for t in concats)
    assert concats[-1].ne == (36, 1, 1, 1)


def test_pins_and_plan_checker() -> None:
    import dataclasses

    bk = _two_backends()
    tr = trace(lambda p, x: jnp.tanh(x @ p["w"]) + 1.0, jnp.ones((4, 8)), params={"w": jnp.ones((8, 8))},
               backends=bk)
    sch = tr.schedule(pins={"tanh.1": 1})
    assert sch.problems() == []
    by_name = {p.name: p for p in sch.plan.nodes}
    assert by_name["tanh.1"].backend == "CPU" and by_name["tanh.1"].cause.name == "USER_PIN"
    plan = sch.plan
    # the checker sees a gap between splits, a node outside its backend's split and overlapping tensors
    bad_splits = (dataclasses.replace(plan.splits[0], i_end=plan.splits[0].i_end - 1), *plan.splits[1:])
    assert any("consecutive" in p for p in tr_problems(dataclasses.replace(plan, splits=bad_splits)))
    a0 = next(a for a in plan.allocs if a.size > 0)
    clash = dataclasses.replace(a0, name="clash", inplace_of=None)
    assert any("overlaps" in p for p in tr_problems(dataclasses.replace(plan, allocs=(*plan.allocs, clash))))


def tr_problems(plan: object) -> list[str]:
    from toolkit.trace import check_plan

    return check_plan(plan)


def test_device_placement_target_and_budget_failure() -> None:
    dev = jax.devices()[0]
    sim = profiles.simulated(0, budget=64, executor=dev)
    bk = [sim, profiles.cpu(sim.host_buft)]
    f = lambda p, x: jnp.tanh(x @ p["w"])  # noqa: E731
    tr = trace(f, jnp.ones((4, 8)), params={"w": jnp.ones((8, 8))}, backends=bk, placement={"w": dev})
    assert tr.where() == {"w": "SIM0"}
    sch = tr.schedule()
    assert not sch.ok  # the SIM0 compute buffer does not fit in its 64-byte budget
    with pytest.raises(RuntimeError, match="could not allocate"):
        sch.run(jnp.ones((4, 8)))


def test_offline_planner_schedules_and_runs() -> None:
    f, p, args = EDGE_CASES["multi_output"]
    o = trace(f, *args, params=p, backends=_two_backends()).schedule(planner="offline")
    assert o.ok and o.problems() == []
    assert o.plan is not None
    for b in o.plan.buffers:  # no plan beats the peak of live bytes
        assert b.lower_bound is None or b.lower_bound <= b.needed
    got, want = jax.tree_util.tree_leaves(o.run(*args)), jax.tree_util.tree_leaves(jax.jit(f)(p, *args))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
