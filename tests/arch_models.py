"""The oracles' tiny qwen3 / gemma3 / Llama-3.x models, written with the ``gguf`` package, and an
independent plain-JAX forward of each (no ggml, no cache, no scheduler).

The writer follows the oracles' generators (make_gguf.py, make_llama3_gguf.py): weights drawn
from normal(0, 0.02) in float32 with ``numpy.random.default_rng(seed)`` tensor by tensor in file
order, norm weights 1, ``rope_freqs.weight`` given as values. With the same recipe it writes the
same weights, so the logits can be compared with llama.cpp's. The tokenizer is a placeholder of
the right size (only the weights decide the logits).

What differs between architectures is one :class:`Reference` per architecture name in
:data:`REFERENCES` (the tensors of a layer in write order, the RoPE pairing, the norms, the FFN
activation, the embedding scale); a test adds an entry for an architecture of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from recipe_gguf import arch_keys, write_recipe_model

Tensors = list[tuple[str, tuple[int, ...], str]]


def _attn(p: str, E: int, H: int, HKV: int, hd: int) -> Tensors:
    return [(p + "attn_norm.weight", (E,), "norm"), (p + "attn_q.weight", (H * hd, E), "mat"),
            (p + "attn_k.weight", (HKV * hd, E), "mat"), (p + "attn_v.weight", (HKV * hd, E), "mat"),
            (p + "attn_output.weight", (E, H * hd), "mat")]


def _qk_norm(p: str, hd: int) -> Tensors:
    return [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]


def _ffn(p: str, E: int, F: int) -> Tensors:
    """ffn_norm and the gated FFN in the generators' order (gate, down, up)."""
    return [(p + "ffn_norm.weight", (E,), "norm"), (p + "ffn_gate.weight", (F, E), "mat"),
            (p + "ffn_down.weight", (E, F), "mat"), (p + "ffn_up.weight", (F, E), "mat")]


def llama_layer(p: str, E: int, H: int, HKV: int, hd: int, F: int) -> Tensors:
    return _attn(p, E, H, HKV, hd) + _ffn(p, E, F)


def qwen3_layer(p: str, E: int, H: int, HKV: int, hd: int, F: int) -> Tensors:
    return _attn(p, E, H, HKV, hd) + _qk_norm(p, hd) + _ffn(p, E, F)


def gemma3_layer(p: str, E: int, H: int, HKV: int, hd: int, F: int) -> Tensors:
    return (_attn(p, E, H, HKV, hd) + _qk_norm(p, hd) + [(p + "post_attention_norm.weight", (E,), "norm")]
            + _ffn(p, E, F) + [(p + "post_ffw_norm.weight", (E,), "norm")])


@dataclass(frozen=True)
class Reference:
    """One architecture's pieces of the reference forward and of the writer."""

    layer: Callable[[str, int, int, int, int, int], Tensors]  # (prefix, E, H, HKV, hd, F) -> write order
    neox: bool = False          # RoPE on halves (NEOX) instead of adjacent pairs (NORM)
    qk_norm: bool = False       # RMS norm on each head of Q and K before RoPE
    act: str = "silu"           # the gated FFN's activation: silu or gelu (tanh approximation)
    embd_scale: bool = False    # token embeddings times sqrt(n_embd)
    post_attn_norm: bool = False  # RMS norm of the attention output (post_attention_norm) before the residual
    post_ffn_norm: bool = False   # RMS norm of the FFN output (post_ffw_norm) before the residual
    tied: bool = False          # the generators' default: no output.weight


REFERENCES: dict[str, Reference] = {
    "llama": Reference(llama_layer),
    "qwen3": Reference(qwen3_layer, neox=True, qk_norm=True),
    "gemma3": Reference(gemma3_layer, neox=True, qk_norm=True, act="gelu", embd_scale=True, post_attn_norm=True,
                        post_ffn_norm=True, tied=True),
}


def recipe_of(entry: dict[str, Any]) -> dict[str, Any]:
    """A logits entry's generator recipe with every field the writer reads (the generators' defaults)."""
    r = dict(entry["gguf_recipe"]["recipe"])
    r.setdefault("arch", "llama")
    r.setdefault("head_dim", None)
    r.setdefault("sliding_window", 0)
    r.setdefault("swa_pattern", 0)
    r.setdefault("rope_freq_base_swa", None)
    r.setdefault("tied", REFERENCES[r["arch"]].tied)
    if "rope_freqs" in entry["gguf_recipe"]:
        r["rope_freqs"] = list(entry["gguf_recipe"]["rope_freqs"])
    r["n_vocab"] = int(entry["n_vocab"])
    return r


def _at(v: int | list[int], il: int) -> int:
    """A recipe size: one value for every layer, or a list with one per layer."""
    return v[il] if isinstance(v, list) else v


def head_dim(r: dict[str, Any]) -> int:
    return int(r["head_dim"] or r["n_embd"] // r["n_head"])


def tensor_list(r: dict[str, Any]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) in the generators' write order."""
    L, E, H, HKV, F = r["n_layer"], r["n_embd"], r["n_head"], r["n_head_kv"], r["n_ff"]
    hd, V = head_dim(r), r["n_vocab"]
    layer = REFERENCES[r["arch"]].layer
    out: list[tuple[str, tuple[int, ...], str]] = []
    if r.get("rope_freqs"):
        out.append(("rope_freqs.weight", (hd // 2,), "rope"))
    out.append(("token_embd.weight", (V, E), "mat"))
    for il in range(L):
        out += layer(f"blk.{il}.", E, H, _at(HKV, il), hd, F)
    out.append(("output_norm.weight", (E,), "norm"))
    if not r["tied"]:
        out.append(("output.weight", (V, E), "mat"))
    return out


def _write_kv(w: Any, r: dict[str, Any]) -> None:
    arch, hd = r["arch"], head_dim(r)
    u32, f32 = arch_keys(w, arch)
    u32("vocab_size", r["n_vocab"])
    u32("context_length", r["n_ctx_train"])
    u32("embedding_length", r["n_embd"])
    u32("block_count", r["n_layer"])
    u32("feed_forward_length", r["n_ff"])
    u32("attention.head_count", r["n_head"])
    if isinstance(r["n_head_kv"], list):   # one per layer (llama_model_loader::get_key_or_arr)
        w.add_array(f"{arch}.attention.head_count_kv", r["n_head_kv"])
    else:
        u32("attention.head_count_kv", r["n_head_kv"])
    if r["head_dim"] is not None:
        u32("attention.key_length", hd)
        u32("attention.value_length", hd)
    u32("rope.dimension_count", hd)
    f32("rope.freq_base", r["rope_freq_base"])
    f32("attention.layer_norm_rms_epsilon", r["eps"])
    if r["sliding_window"]:
        u32("attention.sliding_window", r["sliding_window"])
        u32("attention.sliding_window_pattern", r["swa_pattern"])
        if r["rope_freq_base_swa"] is not None:
            f32("rope.freq_base_swa", r["rope_freq_base_swa"])


def write_model(path: str, r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Write the GGUF of recipe r; returns every weight as f32 (numpy order)."""
    def fill(name: str, shape: tuple[int, ...], kind: str) -> np.ndarray | None:
        return np.asarray(r["rope_freqs"], np.float32) if kind == "rope" else None

    return write_recipe_model(path, r, tensor_list(r), _write_kv, fill=fill)


def reference(w: dict[str, np.ndarray], r: dict[str, Any], tokens: list[int], *, rope_freqs: bool = True,
              kv_f16: bool = True, kq_f16: bool = False, gelu_table: bool = True) -> np.ndarray:
    """Plain JAX forward of recipe r: logits [T, n_vocab] of every position.

    The architecture's :class:`Reference` picks the pieces: llama (NORM RoPE, ``rope_freqs``
    dividing the angles when ``rope_freqs``), qwen3 (RMS norm on each head of Q and K, NEOX RoPE)
    and gemma3 (embeddings times sqrt(n_embd), QK-norm, Q times 1/sqrt(head_dim), attention scale 1,
    post-attention and post-FFN norms, tanh-GELU gated FFN, tied output). A sliding window (any
    architecture whose recipe has one) covers layers il % pattern < pattern - 1, with their own
    RoPE base. ``kv_f16`` rounds K and V as the F16 cache does; ``kq_f16`` rounds Q and the attention
    weights to F16 as the products with that cache do without flash attention (ggml_compute_forward_mul_mat
    converts src1 to F16, the vec_dot_type of F16).
    """
    import jax
    import jax.numpy as jnp

    W = {k: jnp.asarray(v) for k, v in w.items()}
    ref, T = REFERENCES[r["arch"]], len(tokens)
    H, hd, eps = r["n_head"], head_dim(r), r["eps"]
    pos = jnp.arange(T, dtype=jnp.float32)

    def rms(x: jax.Array, g: jax.Array) -> jax.Array:
        return x / jnp.sqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x: jax.Array, base: float) -> jax.Array:  # x (T, heads, hd)
        inv = base ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
        if rope_freqs and "rope_freqs.weight" in W:
            inv = inv / W["rope_freqs.weight"]
        ang = pos[:, None] * inv[None, :]
        c, s = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
        if not ref.neox:   # adjacent pairs
            x0, x1 = x[..., 0::2], x[..., 1::2]
            return jnp.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(x.shape)
        x0, x1 = x[..., : hd // 2], x[..., hd // 2:]   # halves (NEOX)
        return jnp.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], -1)

    def gelu(x: jax.Array) -> jax.Array:
        """ggml_gelu_f32; ``gelu_table``: as ggml-cpu reads it from ggml_table_gelu_f16 (GGML_GELU_FP16),
        at x rounded to f16, an f16 result, 0 at or below -10 and x at or above 10."""
        def tanh_form(v: jax.Array) -> jax.Array:
            return 0.5 * v * (1.0 + jnp.tanh(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)))
        if not gelu_table:
            return tanh_form(x)
        mid = tanh_form(x.astype(jnp.float16).astype(jnp.float32)).astype(jnp.float16).astype(jnp.float32)
        return jnp.where(x <= -10.0, 0.0, jnp.where(x >= 10.0, x, mid))

    def mm(x: jax.Array, name: str) -> jax.Array:
        return jnp.matmul(x, W[name].T, precision="highest")

    def kvr(x: jax.Array, on: bool) -> jax.Array:
        return x.astype(jnp.float16).astype(jnp.float32) if on else x

    x = W["token_embd.weight"][jnp.asarray(tokens)]
    if ref.embd_scale:
        x = x * np.float32(np.sqrt(r["n_embd"]))
    ti, si = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
    for il in range(r["n_layer"]):
        p, nkv = f"blk.{il}.", _at(r["n_head_kv"], il)
        n_pat = r["swa_pattern"]
        swa = bool(r["sliding_window"]) and (n_pat == 0 or il % n_pat < n_pat - 1)
        base = r["rope_freq_base_swa"] if (swa and r["rope_freq_base_swa"] is not None) else r["rope_freq_base"]
        h = rms(x, W[p + "attn_norm.weight"])
        q = mm(h, p + "attn_q.weight").reshape(T, H, hd)
        k = mm(h, p + "attn_k.weight").reshape(T, nkv, hd)
        v = mm(h, p + "attn_v.weight").reshape(T, nkv, hd)
        if ref.qk_norm:
            q, k = rms(q, W[p + "attn_q_norm.weight"]), rms(k, W[p + "attn_k_norm.weight"])
        q, k = rope(q, base), rope(k, base)
        scale = 1.0 / np.sqrt(hd)
        q, k, v = kvr(q, kq_f16), kvr(k, kv_f16), kvr(v, kv_f16)
        k, v = jnp.repeat(k, H // nkv, axis=1), jnp.repeat(v, H // nkv, axis=1)
        s = jnp.einsum("thd,shd->hts", q, k, precision="highest") * scale
        seen = si <= ti
        if swa:
            seen = seen & (ti - si < r["sliding_window"])
        a = jax.nn.softmax(jnp.where(seen[None], s, -jnp.inf), -1)
        o = jnp.einsum("hts,shd->thd", kvr(a, kq_f16), v, precision="highest").reshape(T, H * hd)
        o = mm(o, p + "attn_output.weight")
        if ref.post_attn_norm:
            o = rms(o, W[p + "post_attention_norm.weight"])
        x = x + o
        h = rms(x, W[p + "ffn_norm.weight"])
        act = {"gelu": gelu, "silu": jax.nn.silu}[ref.act]
        f = mm(act(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
        if ref.post_ffn_norm:
            f = rms(f, W[p + "post_ffw_norm.weight"])
        x = x + f
    out = W.get("output.weight", W["token_embd.weight"])
    return np.asarray(jnp.matmul(rms(x, W["output_norm.weight"]), out.T, precision="highest"))
