"""Plain-JAX models traced, scheduled on 3 simulated devices and run, for tests/test_trace_run.py.

Run as a script (``python tests/trace_cases.py``): it sets 3 CPU devices before JAX starts,
which a pytest process that already imported JAX cannot do, and prints one JSON object with
a result per case. Nothing here asserts; the test module does.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "3")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", int(os.environ["JAX_NUM_CPU_DEVICES"]))

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from toolkit.backend import profiles  # noqa: E402
from toolkit.trace import check_plan, lacking, trace  # noqa: E402

# ---- the models (plain JAX) ------------------------------------------------------------------


def mlp(p: Any, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(x @ p["fc1"]["w"] + p["fc1"]["b"])
    return h @ p["fc2"]["w"] + p["fc2"]["b"]


def attention(p: Any, x: jax.Array) -> jax.Array:
    t, d = x.shape
    n_head = 4
    hd = d // n_head
    q = (x @ p["wq"]).reshape(t, n_head, hd).transpose(1, 0, 2)
    k = (x @ p["wk"]).reshape(t, n_head, hd).transpose(1, 0, 2)
    v = (x @ p["wv"]).reshape(t, n_head, hd).transpose(1, 0, 2)
    s = q @ k.transpose(0, 2, 1) / jnp.sqrt(jnp.float32(hd))
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    a = jax.nn.softmax(jnp.where(mask, s, -1e9), axis=-1)
    o = (a @ v).transpose(1, 0, 2).reshape(t, d)
    return o @ p["wo"]


def rms_norm(x: jax.Array, w: jax.Array, eps: float = 1e-5) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x: jax.Array, pos: jax.Array) -> jax.Array:
    """Rotary embedding with rotate-half (a concatenation)."""
    hd = x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
    ang = pos[:, None].astype(jnp.float32) * inv[None, :]
    cos = jnp.concatenate([jnp.cos(ang), jnp.cos(ang)], axis=-1)[:, None, :]
    sin = jnp.concatenate([jnp.sin(ang), jnp.sin(ang)], axis=-1)[:, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return x * cos + jnp.concatenate([-x2, x1], axis=-1) * sin


def transformer_block(p: Any, x: jax.Array, pos: jax.Array) -> jax.Array:
    t, d = x.shape
    n_head = 4
    hd = d // n_head
    h = rms_norm(x, p["attn_norm"])
    q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
    q = rope(q.reshape(t, n_head, hd), pos)
    k = rope(k.reshape(t, n_head, hd), pos)
    v = v.reshape(t, n_head, hd)
    s = jnp.einsum("thd,shd->hts", q, k) / jnp.sqrt(jnp.float32(hd))
    s = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), s, -jnp.inf)
    o = jnp.einsum("hts,shd->thd", jax.nn.softmax(s, axis=-1), v).reshape(t, d)
    x = x + o @ p["wo"]
    h = rms_norm(x, p["ffn_norm"])
    return x + (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]


def embed_classify(p: Any, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    e = p["tok_emb"][ids]
    h = jnp.tanh(e @ p["w"] + p["b"])
    logits = h @ p["tok_emb"].T
    return logits, jnp.argmax(logits, axis=-1)


def _normal(key: jax.Array, shape: tuple[int, ...], scale: float = 0.1) -> jax.Array:
    return scale * jax.random.normal(key, shape, dtype=jnp.float32)


def params_for(name: str, d: int = 32, vocab: int = 50, ff: int = 64) -> Any:
    keys = iter(jax.random.split(jax.random.PRNGKey(42), 16))
    if name == "mlp":
        return {"fc1": {"w": _normal(next(keys), (d, ff)), "b": _normal(next(keys), (ff,))},
                "fc2": {"w": _normal(next(keys), (ff, 16)), "b": _normal(next(keys), (16,))}}
    if name == "attention":
        return {w: _normal(next(keys), (d, d)) for w in ("wq", "wk", "wv", "wo")}
    if name == "transformer":
        return {"attn_norm": 1.0 + _normal(next(keys), (d,)), "wqkv": _normal(next(keys), (d, 3 * d)),
                "wo": _normal(next(keys), (d, d)), "ffn_norm": 1.0 + _normal(next(keys), (d,)),
                "w_gate": _normal(next(keys), (d, ff)), "w_up": _normal(next(keys), (d, ff)),
                "w_down": _normal(next(keys), (ff, d))}
    if name == "embed":
        return {"tok_emb": _normal(next(keys), (vocab, d), 1.0), "w": _normal(next(keys), (d, d)),
                "b": _normal(next(keys), (d,))}
    raise KeyError(name)


# ---- running a case --------------------------------------------------------------------------


def backends(min_batch: int = 32, lacking_on_sim0: tuple[str, ...] = ()) -> list[Any]:
    devs = jax.devices("cpu")
    n = len(devs)
    sim0 = profiles.simulated(0, executor=devs[0 % n], min_batch=min_batch)
    sim1 = profiles.simulated(1, executor=devs[1 % n], min_batch=min_batch)
    cpu = profiles.cpu(sim0.host_buft, executor=devs[2 % n])
    if lacking_on_sim0:
        lacking(sim0, *lacking_on_sim0)
    return [sim0, sim1, cpu]


def run_case(name: str, f: Any, params: Any, args: tuple[Any, ...], placement: Any, *, mode: str = "eager",
             op_offload: bool = True, parallel: bool = False, min_batch: int = 32,
             lacking_on_sim0: tuple[str, ...] = ()) -> dict[str, Any]:
    bk = backends(min_batch, lacking_on_sim0)
    tr = trace(f, *args, params=params, backends=bk, placement=placement)
    sch = tr.schedule(op_offload=op_offload, parallel=parallel)
    out = sch.run(*args, mode=mode)
    ref = jax.jit(f)(params, *args)
    outs, refs = jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)
    diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
             for a, b in zip(outs, refs, strict=True)]
    plan = sch.plan
    assert plan is not None
    g = sch.built.graph
    lacking_nodes = [t.name for t in g.nodes if t.op_params.get("primitive") in lacking_on_sim0]
    return {
        "name": name,
        "ok": sch.ok,
        "n_outputs": len(outs),
        "shapes_match": [tuple(np.shape(a)) == tuple(np.shape(b)) for a, b in zip(outs, refs, strict=True)],
        "dtypes_match": [str(np.asarray(a).dtype) == str(np.asarray(b).dtype) for a, b in zip(outs, refs, strict=True)],
        "max_abs_diff": max(diffs) if diffs else 0.0,
        "allclose": all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
                        for a, b in zip(outs, refs, strict=True)),
        "problems": check_plan(plan, g, bk),
        "n_nodes": g.n_nodes,
        "n_splits": plan.n_splits,
        "n_copies": plan.n_copies,
        "ops": sorted({t.op_desc() for t in g.nodes}),
        "ggml_ops": sorted({t.op.value for t in g.nodes}),
        "causes": sorted({p.cause.name for p in plan.nodes}),
        "backend_of": {p.name: p.backend for p in plan.nodes},
        "lacking_nodes": lacking_nodes,
        "split_backends": [s.backend for s in plan.splits],
        "buffers": {b.buft: b.allocated for b in plan.buffers},
        "inplace": sum(1 for a in plan.allocs if a.inplace_of),
        "ran_splits": len(sch.last_run.splits) if sch.last_run else 0,
        "run_copies": sch.last_run.n_copies if sch.last_run else 0,
        "devices": sorted({s.device for s in sch.last_run.splits}) if sch.last_run else [],
        "text": sch.to_text(),
    }


def all_cases() -> list[dict[str, Any]]:
    key = jax.random.PRNGKey(0)
    x32 = jax.random.normal(key, (8, 32), dtype=jnp.float32)
    pos = jnp.arange(8, dtype=jnp.int32)
    ids = jnp.array([3, 1, 4, 1, 5, 9, 2, 6], dtype=jnp.int32)
    cases = [
        run_case("mlp", mlp, params_for("mlp"), (x32,), {"fc1.*": 0, "fc2.*": 1}),
        run_case("attention", attention, params_for("attention"), (x32,), {"wq": 0, "wk": 0, "wv": 1, "wo": 1}),
        run_case("transformer", transformer_block, params_for("transformer"), (x32, pos),
                 {"attn_norm": 0, "wqkv": 0, "wo": 0, "*": 1}),
        run_case("transformer_jit", transformer_block, params_for("transformer"), (x32, pos),
                 {"attn_norm": 0, "wqkv": 0, "wo": 0, "*": 1}, mode="jit"),
        run_case("gather", embed_classify, params_for("embed"), (ids,), {"tok_emb": -1, "*": 0}),
        # SIM0 lacks exp and rsqrt: those nodes must leave it (pass 2 does not expand onto it)
        run_case("transformer_lacking", transformer_block, params_for("transformer"), (x32, pos), 0,
                 lacking_on_sim0=("exp", "rsqrt")),
        # weights in host memory, batch 8 >= min_batch 8: the MUL_MATs are offloaded to SIM0 (op offload)
        run_case("mlp_offload", mlp, params_for("mlp"), (x32,), -1, min_batch=8),
        run_case("mlp_no_offload", mlp, params_for("mlp"), (x32,), -1, min_batch=8, op_offload=False),
        # pipeline parallelism: 4 copies of inputs (GGML_SCHED_MAX_COPIES)
        run_case("attention_parallel", attention, params_for("attention"), (x32,), {"wq": 0, "wk": 0, "*": 1},
                 parallel=True),
    ]
    return cases


if __name__ == "__main__":
    results = all_cases()
    json.dump({"n_devices": len(jax.devices("cpu")), "cases": {r["name"]: r for r in results}}, sys.stdout)
