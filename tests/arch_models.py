"""The oracles' tiny qwen3 / gemma3 / Llama-3.x models, written with the ``gguf`` package, and an
independent plain-JAX forward of each (no ggml, no cache, no scheduler).

The writer follows the oracles' generators (make_gguf.py, make_llama3_gguf.py): weights drawn
from normal(0, 0.02) in float32 with ``numpy.random.default_rng(seed)`` tensor by tensor in file
order, norm weights 1, ``rope_freqs.weight`` given as values. With the same recipe it writes the
same weights, so the logits can be compared with llama.cpp's. The tokenizer is a placeholder of
the right size (only the weights decide the logits).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def recipe_of(entry: dict[str, Any]) -> dict[str, Any]:
    """A logits entry's generator recipe with every field the writer reads (the generators' defaults)."""
    r = dict(entry["gguf_recipe"]["recipe"])
    r.setdefault("arch", "llama")
    r.setdefault("head_dim", None)
    r.setdefault("sliding_window", 0)
    r.setdefault("swa_pattern", 0)
    r.setdefault("rope_freq_base_swa", None)
    r.setdefault("tied", r["arch"] == "gemma3")
    if "rope_freqs" in entry["gguf_recipe"]:
        r["rope_freqs"] = list(entry["gguf_recipe"]["rope_freqs"])
    r["n_vocab"] = int(entry["n_vocab"])
    return r


def head_dim(r: dict[str, Any]) -> int:
    return int(r["head_dim"] or r["n_embd"] // r["n_head"])


def tensor_list(r: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) in the generators' write order."""
    L, E, H, HKV, F = r["n_layer"], r["n_embd"], r["n_head"], r["n_head_kv"], r["n_ff"]
    hd, arch, V = head_dim(r), r["arch"], r["n_vocab"]
    out: list[tuple[str, tuple[int, ...], str]] = []
    if r.get("rope_freqs"):
        out.append(("rope_freqs.weight", (hd // 2,), "rope"))
    out.append(("token_embd.weight", (V, E), "mat"))
    for il in range(L):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (E,), "norm"), (p + "attn_q.weight", (H * hd, E), "mat"),
                (p + "attn_k.weight", (HKV * hd, E), "mat"), (p + "attn_v.weight", (HKV * hd, E), "mat"),
                (p + "attn_output.weight", (E, H * hd), "mat")]
        if arch in ("qwen3", "gemma3"):
            out += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
        if arch == "gemma3":
            out.append((p + "post_attention_norm.weight", (E,), "norm"))
        out += [(p + "ffn_norm.weight", (E,), "norm"), (p + "ffn_gate.weight", (F, E), "mat"),
                (p + "ffn_down.weight", (E, F), "mat"), (p + "ffn_up.weight", (F, E), "mat")]
        if arch == "gemma3":
            out.append((p + "post_ffw_norm.weight", (E,), "norm"))
    out.append(("output_norm.weight", (E,), "norm"))
    if not r["tied"]:
        out.append(("output.weight", (V, E), "mat"))
    return out


def write_model(path: str, r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Write the GGUF of recipe r; returns every weight as f32 (numpy order)."""
    import gguf

    arch, E, H = r["arch"], r["n_embd"], r["n_head"]
    hd, V = head_dim(r), r["n_vocab"]
    rng = np.random.default_rng(r.get("seed", 1234))
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"test-{arch}")
    w.add_uint32(f"{arch}.vocab_size", V)
    w.add_uint32(f"{arch}.context_length", r["n_ctx_train"])
    w.add_uint32(f"{arch}.embedding_length", E)
    w.add_uint32(f"{arch}.block_count", r["n_layer"])
    w.add_uint32(f"{arch}.feed_forward_length", r["n_ff"])
    w.add_uint32(f"{arch}.attention.head_count", H)
    w.add_uint32(f"{arch}.attention.head_count_kv", r["n_head_kv"])
    if r["head_dim"] is not None:
        w.add_uint32(f"{arch}.attention.key_length", hd)
        w.add_uint32(f"{arch}.attention.value_length", hd)
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    w.add_float32(f"{arch}.rope.freq_base", r["rope_freq_base"])
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", r["eps"])
    if r["sliding_window"]:
        w.add_uint32(f"{arch}.attention.sliding_window", r["sliding_window"])
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", r["swa_pattern"])
        if r["rope_freq_base_swa"] is not None:
            w.add_float32(f"{arch}.rope.freq_base_swa", r["rope_freq_base_swa"])
    w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    vals: dict[str, np.ndarray] = {}
    for name, shape, kind in tensor_list(r):
        if kind == "rope":
            arr = np.asarray(r["rope_freqs"], np.float32)
        elif kind == "norm":
            arr = np.ones(shape, dtype=np.float32)
        else:
            arr = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        w.add_tensor(name, arr)
        vals[name] = arr
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return vals


def reference(w: dict[str, np.ndarray], r: dict[str, Any], tokens: list[int], *, rope_freqs: bool = True,
              kv_f16: bool = True) -> np.ndarray:
    """Plain JAX forward of recipe r: logits [T, n_vocab] of every position.

    llama (NORM RoPE, ``rope_freqs`` dividing the angles when ``rope_freqs``), qwen3 (RMS norm on
    each head of Q and K, NEOX RoPE) and gemma3 (embeddings times sqrt(n_embd), QK-norm, Q times
    1/sqrt(head_dim), attention scale 1, sliding window on layers il % pattern < pattern - 1 with
    their own RoPE base, post-attention and post-FFN norms, tanh-GELU gated FFN, tied output).
    """
    import jax
    import jax.numpy as jnp

    W = {k: jnp.asarray(v) for k, v in w.items()}
    arch, T = r["arch"], len(tokens)
    H, nkv, hd, eps = r["n_head"], r["n_head_kv"], head_dim(r), r["eps"]
    pos = jnp.arange(T, dtype=jnp.float32)
    gemma = arch == "gemma3"

    def rms(x: jax.Array, g: jax.Array) -> jax.Array:
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x: jax.Array, base: float) -> jax.Array:  # x (T, heads, hd)
        inv = base ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        if rope_freqs and "rope_freqs.weight" in W:
            inv = inv / W["rope_freqs.weight"]
        ang = pos[:, None] * inv[None, :]
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        if arch == "llama":   # adjacent pairs
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(x.shape)
        x0, x1 = x[..., : hd // 2], x[..., hd // 2:]   # halves (NEOX)
        return jnp.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)

    def gelu(x: jax.Array) -> jax.Array:
        return 0.5 * x * (1.0 + jnp.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))

    def mm(x: jax.Array, name: str) -> jax.Array:
        return jnp.matmul(x, W[name].T, precision="highest")

    def kvr(x: jax.Array) -> jax.Array:
        return x.astype(jnp.float16).astype(jnp.float32) if kv_f16 else x

    x = W["token_embd.weight"][jnp.asarray(tokens)]
    if gemma:
        x = x * np.float32(np.sqrt(r["n_embd"]))
    ti, si = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    for il in range(r["n_layer"]):
        p = f"blk.{il}."
        n_pat = r["swa_pattern"]
        swa = bool(r["sliding_window"]) and (n_pat == 0 or il % n_pat < n_pat - 1)
        base = r["rope_freq_base_swa"] if (swa and r["rope_freq_base_swa"] is not None) else r["rope_freq_base"]
        h = rms(x, W[p + "attn_norm.weight"])
        q = mm(h, p + "attn_q.weight").reshape(T, H, hd)
        k = mm(h, p + "attn_k.weight").reshape(T, nkv, hd)
        v = mm(h, p + "attn_v.weight").reshape(T, nkv, hd)
        if arch in ("qwen3", "gemma3"):
            q, k = rms(q, W[p + "attn_q_norm.weight"]), rms(k, W[p + "attn_k_norm.weight"])
        q, k = rope(q, base), rope(k, base)
        scale = 1.0 / np.sqrt(hd)
        k, v = kvr(k), kvr(v)
        k, v = jnp.repeat(k, H // nkv, axis=1), jnp.repeat(v, H // nkv, axis=1)
        s = jnp.einsum("thd,shd->hts", q, k, precision="highest") * scale
        seen = si <= ti
        if swa:
            seen = seen & (ti - si < r["sliding_window"])
        a = jax.nn.softmax(jnp.where(seen[None], s, -jnp.inf), -1)
        o = mm(jnp.einsum("hts,shd->thd", a, v, precision="highest").reshape(T, H * hd), p + "attn_output.weight")
        if gemma:
            o = rms(o, W[p + "post_attention_norm.weight"])
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])
        act = gelu if gemma else jax.nn.silu
        f = mm(act(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
        if gemma:
            f = rms(f, W[p + "post_ffw_norm.weight"])
        x = x + f
    out = W.get("output.weight", W["token_embd.weight"])
    return np.asarray(jnp.matmul(rms(x, W["output_norm.weight"]), out.T, precision="highest"))
