"""The third oracle's tiny Gemma 4 models (presets ``tiny_gemma4_f32`` and ``tiny_gemma4moe_f32``),
written with the ``gguf`` package.

The writer follows the oracle's generator (make_gguf3.py): the keys ``write_kv`` writes for gemma4
(``head_count_kv`` and ``sliding_window_pattern`` as per-layer arrays, the SWA head sizes, no KV
sharing, no per-layer embeddings, the final logit softcap), the tensors in ``tensor_list_ne``'s
order (``load_arch_tensors``' order: ``output_norm`` right after ``token_embd``, no ``output``: the
head is tied; full layers without ``attn_v``; ``rope_freqs`` after the first full layer's
``layer_output_scale``), every tensor of kind mat/expert/router drawn from normal(0, 0.02) in float32
with ``numpy.random.default_rng(seed)`` one after the other, norms (and the router and down scales,
``layer_output_scale``) 1, ``rope_freqs`` 1 for the rotated pairs and 1e30 for the others (drawing
nothing). With the same recipe it writes the same weights, so the logits can be compared with
llama.cpp's. The tokenizer is a placeholder of the right size: the tokens are given, and no Gemma 4
graph reads the vocabulary.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from recipe_gguf import arch_keys, numpy_order, write_recipe_model

Tensors = list[tuple[str, tuple[int, ...], str]]   # (name, ggml ne, kind)


def recipe_of(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A logits entry's generator recipe (``gguf_recipe.recipe``) with the vocabulary size, and changes."""
    r = dict(entry["gguf_recipe"]["recipe"])
    r["n_vocab"] = int(entry["n_vocab"])
    r.update(changes)
    return r


def tensor_list(r: dict[str, Any]) -> Tensors:
    """make_gguf3.py's ``tensor_list_ne`` for gemma4."""
    L, E, V, H, F = r["n_layer"], r["n_embd"], r["n_vocab"], r["n_head"], r["n_ff"]
    X = r.get("n_expert", 0)
    out: Tensors = [("token_embd.weight", (E, V), "mat"), ("output_norm.weight", (E,), "norm")]
    first_full = True
    for il in range(L):
        p, swa, kv = f"blk.{il}.", r["swa_layers"][il], il < L - r.get("n_kv_shared", 0)
        hd = r["head_dim_swa"] if swa else r["head_dim"]
        hkv = r["n_head_kv_swa"] if swa else r["n_head_kv_full"]
        out += [(p + "attn_norm.weight", (E,), "norm"), (p + "attn_q.weight", (E, hd * H), "mat")]
        if kv:
            out.append((p + "attn_k.weight", (E, hd * hkv), "mat"))
        if swa and kv:       # a KV-shared layer's checkpoint has no V projection (nor K)
            out.append((p + "attn_v.weight", (E, hd * hkv), "mat"))
        out += [(p + "attn_output.weight", (hd * H, E), "mat"), (p + "attn_q_norm.weight", (hd,), "norm")]
        if kv:
            out.append((p + "attn_k_norm.weight", (hd,), "norm"))
        out += [(p + "post_attention_norm.weight", (E,), "norm"), (p + "layer_output_scale.weight", (1,), "norm")]
        if not swa and first_full:
            out.append(("rope_freqs.weight", (hd // 2,), "ropefreqs"))
            first_full = False
        out += [(p + "ffn_norm.weight", (E,), "norm"), (p + "ffn_gate.weight", (E, F), "mat"),
                (p + "ffn_up.weight", (E, F), "mat"), (p + "ffn_down.weight", (F, E), "mat"),
                (p + "post_ffw_norm.weight", (E,), "norm")]
        if X:
            FE = r["n_ff_exp"]
            out += [(p + "ffn_gate_inp.weight", (E, X), "router"), (p + "ffn_gate_inp.scale", (E,), "norm"),
                    (p + "pre_ffw_norm_2.weight", (E,), "norm"), (p + "post_ffw_norm_1.weight", (E,), "norm"),
                    (p + "post_ffw_norm_2.weight", (E,), "norm"),
                    (p + "ffn_gate_up_exps.weight", (E, 2 * FE, X), "expert"),
                    (p + "ffn_down_exps.weight", (FE, E, X), "expert"), (p + "ffn_down_exps.scale", (X,), "norm")]
    return out


def _write_kv(w: Any, r: dict[str, Any]) -> None:
    """make_gguf3.py's ``write_kv`` for gemma4, in its order."""
    A = r["arch"]
    u32, f32 = arch_keys(w, A)
    u32("vocab_size", r["n_vocab"])
    u32("context_length", r["n_ctx_train"])
    u32("embedding_length", r["n_embd"])
    u32("block_count", r["n_layer"])
    u32("feed_forward_length", r["n_ff"])
    w.add_uint32(f"{A}.attention.head_count", r["n_head"])
    w.add_array(f"{A}.attention.head_count_kv",
                [r["n_head_kv_swa"] if sw else r["n_head_kv_full"] for sw in r["swa_layers"]])
    f32("rope.freq_base", r["rope_freq_base"])
    f32("attention.layer_norm_rms_epsilon", r["eps"])
    u32("attention.key_length", r["head_dim"])
    u32("attention.value_length", r["head_dim"])
    u32("rope.dimension_count", r["n_rot"])
    if r.get("n_expert"):
        u32("expert_count", r["n_expert"])
        u32("expert_used_count", r["n_expert_used"])
        u32("expert_feed_forward_length", r["n_ff_exp"])
    u32("attention.shared_kv_layers", r.get("n_kv_shared", 0))
    u32("embedding_length_per_layer_input", 0)
    w.add_array(f"{A}.attention.sliding_window_pattern", [bool(x) for x in r["swa_layers"]])
    u32("attention.key_length_swa", r["head_dim_swa"])
    u32("attention.value_length_swa", r["head_dim_swa"])
    u32("rope.dimension_count_swa", r["n_rot_swa"])
    f32("rope.freq_base_swa", r["rope_freq_base_swa"])
    u32("attention.sliding_window", r["sliding_window"])
    f32("final_logit_softcapping", r["final_logit_softcapping"])


def write_model(path: str, r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Write the GGUF of recipe r (every tensor F32); returns every weight as the file holds it (numpy order)."""
    def fill(name: str, shape: tuple[int, ...], kind: str) -> np.ndarray | None:
        if kind != "ropefreqs":
            return None
        # conversion/gemma.py Gemma4Model.generate_extra_tensors
        n_pairs = int(r["head_dim"] * r["rope_partial_full"] / 2)
        return np.array([1.0] * n_pairs + [1e30] * (shape[0] - n_pairs), dtype=np.float32)

    return write_recipe_model(path, r, numpy_order(tensor_list(r)), _write_kv,
                              name=f"test-{r.get('preset', r['arch'])}", fill=fill)


def _gelu(x: np.ndarray, table: bool) -> np.ndarray:
    """ggml_gelu_f32, the tanh approximation; ``table``: as ggml-cpu reads it (``GGML_GELU_FP16``):
    ``ggml_table_gelu_f16`` at x rounded to f16, an f16 result, 0 at or below -10 and x at or above 10."""
    def tanh_form(v: np.ndarray) -> np.ndarray:
        return 0.5 * v * (1.0 + np.tanh(0.7978845608028654 * v * (1.0 + 0.044715 * v * v)))
    if not table:
        return tanh_form(x)
    mid = tanh_form(x.astype(np.float16).astype(np.float64)).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, mid))


def reference(w: dict[str, np.ndarray], r: dict[str, Any], tokens: list[int], *, kv_f16: bool = True,
              kq_f16: bool = True, window: bool = True, rope_freqs: bool = True, v_norm: bool = True,
              gelu_table: bool = True) -> np.ndarray:
    """Logits [T, n_vocab] of every position, float64 arithmetic over the file's weights, written from
    ``llama_model_gemma4::graph``: embeddings times sqrt(n_embd); per layer Q, K with their norms and
    NEOX RoPE (the layer's base and ``n_rot``, ``rope_freqs`` dividing the full layers' frequencies), V
    (K's product on full layers) under a weightless RMS norm, attention at scale 1 with the standard
    window (``p1 - p0 >= n_swa`` masked) on SWA layers; the post-attention norm and residual; the GEGLU
    MLP, beside it the routed GEGLU experts (router on ``rms_norm(x) / sqrt(n_embd) * scale``, softmax,
    top-k, weights normalized, per-expert down scale) each with its norms; the post-FFN norm, the
    residual, ``layer_output_scale``; the output norm, the tied head, the softcap ``c tanh(x / c)``.
    A layer from ``n_layer - n_kv_shared`` on reads the cache of the last layer of its kind before that
    point (``layer_reuse_cb``: two layers back for SWA, one for full). ``kv_f16`` rounds K and V as the
    F16 cache does; ``kq_f16`` rounds Q and the attention weights to
    F16 as the products with that cache do without flash attention (ggml_compute_forward_mul_mat
    converts src1 to F16, the vec_dot_type of F16); ``window``, ``rope_freqs`` and ``v_norm`` False
    drop the window, the full layers' frequency factors and the V norm (to show that each matters)."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    T, H, E, eps = len(tokens), r["n_head"], r["n_embd"], r["eps"]
    pos = np.arange(T, dtype=np.float64)

    def rms(x: np.ndarray, g: np.ndarray | None = None) -> np.ndarray:
        y = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
        return y if g is None else y * g

    def rope(x: np.ndarray, n_rot: int, base: float, ff: np.ndarray | None) -> np.ndarray:   # NEOX: halves
        theta = pos[:, None] * base ** (-2.0 * np.arange(n_rot // 2) / n_rot)[None, :]
        if ff is not None:
            theta = theta / ff[None, : n_rot // 2]
        cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        x0, x1, rest = x[..., : n_rot // 2], x[..., n_rot // 2: n_rot], x[..., n_rot:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos, rest], -1)

    def f16(x: np.ndarray, on: bool) -> np.ndarray:
        return x.astype(np.float16).astype(np.float64) if on else x

    def geglu(h: np.ndarray, gate: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
        return (_gelu(h @ gate.T, gelu_table) * (h @ up.T)) @ down.T

    x = W["token_embd.weight"][np.asarray(tokens)] * np.sqrt(float(E))
    ti, si = np.arange(T)[:, None], np.arange(T)[None, :]
    start = r["n_layer"] - r.get("n_kv_shared", 0)        # n_layer_kv_from_start
    kv: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for il in range(r["n_layer"]):
        p, swa = f"blk.{il}.", r["swa_layers"][il]
        hd = r["head_dim_swa"] if swa else r["head_dim"]
        hkv = r["n_head_kv_swa"] if swa else r["n_head_kv_full"]
        n_rot = r["n_rot_swa"] if swa else r["n_rot"]
        base = r["rope_freq_base_swa"] if swa else r["rope_freq_base"]
        ff = W["rope_freqs.weight"] if not swa and rope_freqs else None
        h = rms(x, W[p + "attn_norm.weight"])
        q = f16(rope(rms((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), W[p + "attn_q_norm.weight"]),
                     n_rot, base, ff), kq_f16)
        if il < start:
            kc = h @ W[p + "attn_k.weight"].T
            vc = h @ W[p + "attn_v.weight"].T if swa else kc
            k = rms(kc.reshape(T, hkv, hd), W[p + "attn_k_norm.weight"])
            v = vc.reshape(T, hkv, hd)
            v = rms(v) if v_norm else v
            kv[il] = f16(rope(k, n_rot, base, ff), kv_f16), f16(v, kv_f16)
        k, v = kv[il if il < start else start - (2 if swa else 1)]
        k, v = np.repeat(k, H // hkv, axis=1), np.repeat(v, H // hkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k)
        seen = si <= ti
        if swa and window:
            seen = seen & (ti - si < r["sliding_window"])
        s = np.where(seen[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a = a / a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", f16(a, kq_f16), v).reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        attn_out = rms(o, W[p + "post_attention_norm.weight"]) + x
        mlp = geglu(rms(attn_out, W[p + "ffn_norm.weight"]), W[p + "ffn_gate.weight"], W[p + "ffn_up.weight"],
                    W[p + "ffn_down.weight"])
        if r.get("n_expert"):
            mlp = rms(mlp, W[p + "post_ffw_norm_1.weight"])
            hm = rms(attn_out, W[p + "pre_ffw_norm_2.weight"])
            logits = (rms(attn_out) / np.sqrt(float(E)) * W[p + "ffn_gate_inp.scale"]) @ W[p + "ffn_gate_inp.weight"].T
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs = probs / probs.sum(-1, keepdims=True)
            top = np.argsort(-probs, axis=-1, kind="stable")[:, : r["n_expert_used"]]
            wts = np.take_along_axis(probs, top, -1)
            wts = wts / wts.sum(-1, keepdims=True)
            FE, moe = r["n_ff_exp"], np.zeros_like(x)
            for t in range(T):
                for j, ex in enumerate(top[t]):
                    gu = W[p + "ffn_gate_up_exps.weight"][ex] @ hm[t]
                    down = W[p + "ffn_down_exps.weight"][ex] @ (_gelu(gu[:FE], gelu_table) * gu[FE:])
                    moe[t] += wts[t, j] * down * W[p + "ffn_down_exps.scale"][ex]
            mlp = mlp + rms(moe, W[p + "post_ffw_norm_2.weight"])
        x = (rms(mlp, W[p + "post_ffw_norm.weight"]) + attn_out) * W[p + "layer_output_scale.weight"]
    logits = rms(x, W["output_norm.weight"]) @ W["token_embd.weight"].T
    cap = r["final_logit_softcapping"]
    return (cap * np.tanh(logits / cap)).astype(np.float32)
