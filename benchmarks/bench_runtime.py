"""JAX runtime benchmark: scheduled run vs one jax.jit, rebuild vs reuse, RSS over rebuild cycles.

    python benchmarks/bench_runtime.py [--cycles 1000] [--iters 10] [--weight-types q4_0,iq2_xxs] [--json]

1. tokens/s of a prompt through the scheduled graph on one CPU device (graph reused between
   calls, as llama.cpp reuses it) beside one ``jax.jit`` of a plain llama forward with the
   same weights;
2. the ms of a rebuild (sched_reserve of a new scheduler + compiling its splits: cold XLA
   compile, persistent-cache load, in-memory hit) beside the reuse path;
3. tokens/s of that prompt per weight type (F32, F16, BF16, every quantized type), beside F32;
4. process RSS after 10 and after N alternating rebuild/reuse cycles, each compiling its
   splits (cache hits after the first: executables are shared by signature, and the LRU
   bounds them, so dropped schedulers leave nothing behind).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def reference_forward(hp: Any) -> Any:
    """A plain JAX llama forward over a whole prompt (no ggml, no cache), to be jitted once."""
    import jax
    import jax.numpy as jnp

    H, hd, nkv, rot = hp.n_head(), hp.n_embd_head_k, hp.n_head_kv(), hp.n_rot

    def rms(x: Any, g: Any) -> Any:
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + hp.eps) * g

    def fwd(W: dict[str, Any], tokens: Any) -> Any:
        T = tokens.shape[0]
        pos = jnp.arange(T, dtype=jnp.float32)
        inv = hp.rope_freq_base ** (-jnp.arange(0, rot, 2, dtype=jnp.float32) / rot)
        ang = pos[:, None] * inv[None, :]
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]

        def rope(x: Any) -> Any:
            x0, x1 = x[..., 0:rot:2], x[..., 1:rot:2]
            r = jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(x.shape[0], x.shape[1], rot)
            return jnp.concatenate([r, x[..., rot:]], -1)

        mm = lambda x, n: x @ W[n].T  # noqa: E731
        x = W["token_embd.weight"][tokens]
        causal = jnp.tril(jnp.ones((T, T), bool))
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            h = rms(x, W[p + "attn_norm.weight"])
            q = rope(mm(h, p + "attn_q.weight").reshape(T, H, hd))
            k = jnp.repeat(rope(mm(h, p + "attn_k.weight").reshape(T, nkv, hd)), H // nkv, 1)
            v = jnp.repeat(mm(h, p + "attn_v.weight").reshape(T, nkv, hd), H // nkv, 1)
            a = jax.nn.softmax(jnp.where(causal[None], jnp.einsum("thd,shd->hts", q, k) / np.sqrt(hd), -jnp.inf), -1)
            x = x + mm(jnp.einsum("hts,shd->thd", a, v).reshape(T, H * hd), p + "attn_output.weight")
            h = rms(x, W[p + "ffn_norm.weight"])
            x = x + mm(jax.nn.silu(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
        return mm(rms(x, W["output_norm.weight"]), "output.weight")

    return jax.jit(fwd)


def make_ctx(hp: Any, **cp: Any) -> Any:
    from toolkit.context import Context
    from toolkit.jaxrt.runtime import init_random_weights
    from toolkit.models import ContextParams

    args: dict[str, Any] = dict(n_ctx=256, n_batch=256, n_ubatch=128, flash_attn="off", type_k="f32", type_v="f32")
    args.update(cp)
    ctx = Context(hp, ContextParams(**args), parallel=False)
    w = dict(ctx.setup.model.tensors)
    values = init_random_weights(w, seed=1, tied=hp.tied)
    return ctx, values


def bench_throughput(iters: int, n_tokens: int) -> dict[str, Any]:
    import jax

    from toolkit.jaxrt.runtime import runtime_of
    from toolkit.models import HParams

    hp = HParams(n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=1536, n_vocab=4096, name="bench")
    ctx, values = make_ctx(hp, n_ubatch=n_tokens, n_batch=n_tokens)
    rt = runtime_of(ctx)
    prompt = list(np.random.default_rng(0).integers(0, hp.n_vocab, n_tokens))
    ref = reference_forward(hp)
    W = {k: jax.device_put(v) for k, v in values.items()}
    toks = jax.device_put(np.asarray(prompt, np.int32))

    def sched_once() -> np.ndarray:
        rt.clear()
        return rt.decode(prompt)

    def ref_once() -> np.ndarray:
        return np.asarray(ref(W, toks))

    for _ in range(2):
        a, b = sched_once(), ref_once()
    err = float(np.abs(a - b).max() / np.abs(b).max())
    t_s, t_r = [], []
    for _ in range(iters):  # interleaved, so machine load hits both alike
        t0 = time.perf_counter()
        sched_once()
        t_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ref_once()
        t_r.append(time.perf_counter() - t0)
    s, r = statistics.median(t_s), statistics.median(t_r)
    return {"model": f"{hp.n_layer}L E{hp.n_embd} ff{hp.n_ff()} V{hp.n_vocab}", "n_tokens": n_tokens,
            "scheduled_tok_s": n_tokens / s, "jit_reference_tok_s": n_tokens / r, "ratio": r / s,
            "max_rel_err": err, "graph_reused": rt.log[-1].graph_reused}


# the ggml_half fields (d, m / dmin) of each block struct of ggml-common.h, by byte offset
F16_FIELDS = {"q8_0": (0,), "q4_0": (0,), "q4_1": (0, 2), "q5_0": (0,), "q5_1": (0, 2), "q2_k": (80, 82),
              "q3_k": (108,), "q4_k": (0, 2), "q5_k": (0, 2), "q6_k": (208,), "iq4_nl": (0,), "iq4_xs": (0,),
              "tq1_0": (52,), "tq2_0": (64,), "iq2_xxs": (0,), "iq2_xs": (0,), "iq2_s": (0,), "iq3_xxs": (0,),
              "iq3_s": (0,), "iq1_s": (0,), "iq1_m": (), "nvfp4": (), "q1_0": (0,), "q2_0": (0,)}


def _small_scales(name: str, raw: np.ndarray, rng: np.random.Generator) -> None:
    """Small scales in random blocks (rows, blocks, type_size), in place: the f16 fields, block_iq1_m's f16
    split over the top nibbles of its four uint16 scales, block_nvfp4's four UE4M3 bytes."""
    for off in F16_FIELDS[name]:
        f = (rng.uniform(-1, 1, raw.shape[:2]) * 2e-3).astype(np.float16)
        raw[..., off:off + 2] = f[..., None].view(np.uint8)
    if name == "iq1_m":
        d = (rng.uniform(-1, 1, raw.shape[:2]) * 2e-3).astype(np.float16).view(np.uint16)
        sc = raw[..., 48:56].copy().view(np.uint16) & 0x0FFF
        for k in range(4):
            sc[..., k] |= ((d >> (4 * k)) & 0xF) << 12
        raw[..., 48:56] = sc.view(np.uint8)
    if name == "nvfp4":
        raw[..., :4] = rng.integers(0x08, 0x18, (*raw.shape[:2], 4), dtype=np.uint8)  # 2^-8 .. 2^-6


def bench_weight_types(iters: int, n_tokens: int, types: list[str] | None = None) -> dict[str, float]:
    """tokens/s of a prompt through the scheduled graph per weight type (every matrix of that type: random
    valid blocks, small scales), F32 first; ``types`` (lower-case names) picks some of them."""
    from toolkit.context import Context
    from toolkit.ggml.types import GGMLType
    from toolkit.jaxrt.gguf_io import random_weights, write_gguf
    from toolkit.jaxrt.runtime import load_weights, runtime_of
    from toolkit.models import ContextParams, HParams, archs

    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    prompt = list(rng.integers(0, 4096, n_tokens))
    with tempfile.TemporaryDirectory(prefix="toolkit-bench-wt-") as d:
        for name in ("f32", "f16", "bf16", *F16_FIELDS):
            if types is not None and name != "f32" and name not in types:
                continue
            t = GGMLType.parse(name)
            hp = HParams(n_layer=4, n_embd=512, n_head=8, n_head_kv=4, n_ff=1536, n_vocab=4096, dtype=t, name="bench")
            vals = random_weights(hp, 1, 0.02)
            for w in archs.get(hp.arch).weights(hp):
                if w.type is t and t.is_quantized:
                    raw = rng.integers(0, 256, (w.ne[1], w.ne[0] // t.blck_size, t.type_size), dtype=np.uint8)
                    _small_scales(name, raw, rng)
                    vals[w.name] = raw.reshape(w.ne[1], -1)
            path = os.path.join(d, f"{name}.gguf")
            write_gguf(path, hp, vals)
            cp = ContextParams(n_ctx=256, n_batch=n_tokens, n_ubatch=n_tokens, flash_attn="off",
                               type_k="f32", type_v="f32")
            ctx = Context(hp, cp, parallel=False)
            load_weights(ctx, path)
            rt = runtime_of(ctx)
            times = []
            for i in range(iters + 1):
                rt.clear()
                t0 = time.perf_counter()
                rt.decode(prompt)
                if i:  # the first call compiles
                    times.append(time.perf_counter() - t0)
            out[t.name] = n_tokens / statistics.median(times)
    return out


def bench_rebuild_reuse(reps: int) -> dict[str, Any]:
    from toolkit.jaxrt.compile import default_cache
    from toolkit.jaxrt.runtime import compile_splits, decode
    from toolkit.models import presets

    hp = dataclasses.replace(presets.tiny("f32"), n_vocab=256)
    ctx, _ = make_ctx(hp, n_ubatch=32, n_batch=256)
    decode(ctx, [1, 2, 3])
    out: dict[str, list[float]] = {"rebuild_cold_compile": [], "rebuild_persistent_cache": [],
                                   "rebuild_cache_hit": [], "reuse": []}
    offload = ctx.sched_params_cur.op_offload
    for i in range(reps):
        for kind in out:
            if kind == "rebuild_cold_compile":
                # a graph shape never compiled before: XLA really compiles
                default_cache().clear()
                t0 = time.perf_counter()
                offload = not offload
                ev = ctx.update(op_offload=offload)
                compile_splits(ctx, 40 + i)
            elif kind == "rebuild_persistent_cache":
                default_cache().clear()
                t0 = time.perf_counter()
                offload = not offload
                ev = ctx.update(op_offload=offload)
                compile_splits(ctx, 40 + i)
            elif kind == "rebuild_cache_hit":
                t0 = time.perf_counter()
                offload = not offload
                ev = ctx.update(op_offload=offload)
                compile_splits(ctx, 40 + i)
            else:
                t0 = time.perf_counter()
                ev = ctx.update(max_nodes=ctx.sched_params_cur.max_nodes)
                compile_splits(ctx, 40 + i)
            out[kind].append((time.perf_counter() - t0) * 1e3)
            assert ev.decision == ("reused" if kind == "reuse" else "rebuilt"), (kind, ev.decision)
    return {k: statistics.median(v) for k, v in out.items()}


def _live(cls: type) -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, cls))


def bench_rss(cycles: int, keep_events: int) -> dict[str, Any]:
    from toolkit.jaxrt.compile import default_cache
    from toolkit.jaxrt.runtime import compile_splits, decode
    from toolkit.models import presets

    hp = dataclasses.replace(presets.tiny("f32"), n_vocab=256)
    ctx, _ = make_ctx(hp, n_ubatch=32, n_batch=256)
    decode(ctx, [1, 2, 3])
    cache = default_cache()
    rss: dict[int, float] = {}
    decisions = {"rebuilt": 0, "reused": 0}
    offload = ctx.sched_params_cur.op_offload
    t0 = time.perf_counter()
    for i in range(1, cycles + 1):
        offload = not offload
        decisions[ctx.update(op_offload=offload).decision] += 1   # a new scheduler: its splits compile
        compile_splits(ctx, 1 + i % 3)
        decisions[ctx.update(max_nodes=ctx.sched_params_cur.max_nodes).decision] += 1  # reuse
        compile_splits(ctx, 1 + i % 3)
        if keep_events:
            # the context keeps every ReserveEvent (each with its plan snapshot); the runtime keeps none
            del ctx.events[:-keep_events]
        if i in (10, cycles):
            gc.collect()
            rss[i] = rss_mb()
    from jax.stages import Compiled

    from toolkit.sched import Scheduler

    return {"cycles": cycles, "rss_mb": rss, "seconds": time.perf_counter() - t0, "decisions": decisions,
            "live_schedulers": _live(Scheduler), "live_executables": _live(Compiled),
            "events_kept": len(ctx.events),
            "cache_entries": len(cache.entries), "cache_max": cache.max_entries, "cache_hits": cache.hits,
            "cache_misses": cache.misses, "evictions": cache.evictions, "events": len(ctx.events)}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--n-tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--keep-events", type=int, default=10,
                    help="trim the context's event history to this many per cycle (0: keep all)")
    ap.add_argument("--weight-types", default=None,
                    help="comma-separated weight types for the per-type tokens/s (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from toolkit.jaxrt.compile import enable_persistent_cache

    with tempfile.TemporaryDirectory(prefix="toolkit-bench-jax-") as d:
        enable_persistent_cache(d)  # a fresh persistent cache: "cold" means a real XLA compile
        types = args.weight_types.lower().split(",") if args.weight_types else None
        res = {"throughput": bench_throughput(args.iters, args.n_tokens),
               "weight_types_tok_s": bench_weight_types(max(1, args.iters // 4), args.n_tokens, types),
               "rebuild_vs_reuse_ms": bench_rebuild_reuse(args.reps), "rss": bench_rss(args.cycles, args.keep_events)}
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    t, rr, rs = res["throughput"], res["rebuild_vs_reuse_ms"], res["rss"]
    print(f"throughput ({t['model']}, prompt of {t['n_tokens']} tokens, one CPU device)")
    print(f"  scheduled run   {t['scheduled_tok_s']:10.1f} tok/s   (graph reused: {t['graph_reused']})")
    print(f"  jax.jit forward {t['jit_reference_tok_s']:10.1f} tok/s")
    print(f"  ratio           {t['ratio']:10.3f}x        (logits max rel err {t['max_rel_err']:.1e})")
    wt = res["weight_types_tok_s"]
    print("tokens/s per weight type (every matrix of that type, dequantized in the kernels), vs F32")
    for k, v in wt.items():
        print(f"  {k:7s} {v:10.1f} tok/s   {v / wt['F32']:6.2f}x")
    print("rebuild (sched_reserve + compile splits) vs reuse, median ms")
    for k, v in rr.items():
        print(f"  {k:26s} {v:9.1f}")
    print(f"RSS over alternating rebuild/reuse cycles with split compilation ({rs['seconds']:.1f} s)")
    for n, mb in rs["rss_mb"].items():
        print(f"  after {n:5d} cycles  {mb:8.1f} MB")
    print(f"  decisions {rs['decisions']}, compile cache {rs['cache_entries']}/{rs['cache_max']} entries, "
          f"{rs['cache_hits']} hits, {rs['cache_misses']} compiles, {rs['evictions']} evictions")
    print(f"  live Scheduler objects {rs['live_schedulers']}, live XLA executables {rs['live_executables']}, "
          f"context events kept {rs['events_kept']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
