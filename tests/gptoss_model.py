"""The third oracle's tiny gpt-oss models, written with the ``gguf`` package, and an independent
numpy forward of them (no ggml, no cache, no scheduler).

The writer follows the oracle's generator (make_gguf3.py, presets ``tiny_gptoss_mxfp4`` and
``tiny_gptoss_f32``): keys as ``write_kv`` writes them for gpt-oss (no ``feed_forward_length``), the
tensors in ``tensor_list_ne``'s order (``load_arch_tensors``' order: ``output_norm`` and ``output``
right after ``token_embd``), every tensor but the norms drawn from normal(0, 0.02) in float32 with
``numpy.random.default_rng(seed)`` one after the other, norms 1, the experts quantized to MXFP4 by
``gguf.quants.quantize`` when the recipe says so. With the same recipe it writes the same weights,
so the logits can be compared with llama.cpp's. The tokenizer is a placeholder of the right size.

The reference (:func:`reference`) is written from the model's definition: NEOX RoPE with YaRN
(ggml's ``rope_yarn``: ramped interpolation, magnitude ``1 + 0.1 ln(factor)``), attention with a
sink logit per head in the softmax's denominator, the sliding window on even layers, the router's
top-k then a softmax over the k logits, ``swiglu_oai`` experts with biases.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from recipe_gguf import arch_keys, numpy_order, write_recipe_model

Tensors = list[tuple[str, tuple[int, ...], str]]   # (name, ggml ne, kind)

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0


def recipe_of(entry: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A logits entry's generator recipe (``gguf_recipe.recipe``) with the vocabulary size, and changes."""
    r = dict(entry["gguf_recipe"]["recipe"])
    r["n_vocab"] = int(entry["n_vocab"])
    r.update(changes)
    return r


def tensor_list(r: dict[str, Any]) -> Tensors:
    """make_gguf3.py's ``tensor_list_ne`` for gpt-oss."""
    L, E, V = r["n_layer"], r["n_embd"], r["n_vocab"]
    H, HKV, rot, X, FE = r["n_head"], r["n_head_kv"], r["n_rot"], r["n_expert"], r["n_ff_exp"]
    out: Tensors = [("token_embd.weight", (E, V), "mat"), ("output_norm.weight", (E,), "norm"),
                    ("output.weight", (E, V), "mat")]
    for il in range(L):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (E,), "norm"), (p + "post_attention_norm.weight", (E,), "norm"),
                (p + "attn_q.weight", (E, H * rot), "mat"), (p + "attn_k.weight", (E, HKV * rot), "mat"),
                (p + "attn_v.weight", (E, HKV * rot), "mat"), (p + "attn_q.bias", (H * rot,), "vec"),
                (p + "attn_k.bias", (HKV * rot,), "vec"), (p + "attn_v.bias", (HKV * rot,), "vec"),
                (p + "attn_output.weight", (H * rot, E), "mat"), (p + "attn_sinks.weight", (H,), "vec"),
                (p + "ffn_gate_inp.weight", (E, X), "router"), (p + "ffn_gate_exps.weight", (E, FE, X), "expert"),
                (p + "ffn_down_exps.weight", (FE, E, X), "expert"), (p + "ffn_up_exps.weight", (E, FE, X), "expert"),
                (p + "attn_output.bias", (E,), "vec"), (p + "ffn_gate_inp.bias", (X,), "vec"),
                (p + "ffn_gate_exps.bias", (FE, X), "f32mat"), (p + "ffn_down_exps.bias", (E, X), "f32mat"),
                (p + "ffn_up_exps.bias", (FE, X), "f32mat")]
    return out


def _write_kv(w: Any, r: dict[str, Any]) -> None:
    A = r["arch"]
    u32, f32 = arch_keys(w, A)
    for key, value in (("vocab_size", r["n_vocab"]), ("context_length", r["n_ctx_train"]),
                       ("embedding_length", r["n_embd"]), ("block_count", r["n_layer"]),
                       ("attention.head_count", r["n_head"]), ("attention.head_count_kv", r["n_head_kv"])):
        u32(key, value)
    f32("rope.freq_base", r["rope_freq_base"])
    f32("attention.layer_norm_rms_epsilon", r["eps"])
    for key, value in (("attention.key_length", r["head_dim"]), ("attention.value_length", r["head_dim"]),
                       ("rope.dimension_count", r["n_rot"]), ("expert_count", r["n_expert"]),
                       ("expert_used_count", r["n_expert_used"]), ("expert_feed_forward_length", r["n_ff_exp"])):
        u32(key, value)
    rs = r["rope_scaling"]
    w.add_string(f"{A}.rope.scaling.type", rs["type"])
    f32("rope.scaling.factor", rs["factor"])
    u32("rope.scaling.original_context_length", rs["orig_ctx"])
    u32("attention.sliding_window", r["sliding_window"])
    u32("attention.sliding_window_pattern", r["swa_pattern"])


def write_model(path: str, r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Write the GGUF of recipe r; returns every weight as the file holds it, in f32 (numpy order;
    MXFP4 experts dequantized by gguf.quants)."""
    import gguf

    mx = r["expert_dtype"] == "mxfp4"
    MX = gguf.GGMLQuantizationType.MXFP4

    def store(w: Any, name: str, arr: np.ndarray, kind: str) -> np.ndarray:
        if kind != "expert" or not mx:
            w.add_tensor(name, arr)
            return arr
        q = gguf.quants.quantize(arr, MX)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=MX)
        return gguf.quants.dequantize(q, MX).reshape(arr.shape).astype(np.float32)

    ft = gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mx else gguf.LlamaFileType.ALL_F32
    return write_recipe_model(path, r, numpy_order(tensor_list(r)), _write_kv,
                              name=f"test-{r.get('preset', r['arch'])}", file_type=int(ft), store=store)


def _yarn(r: dict[str, Any], T: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, n_rot/2] of ggml's rope_yarn with llama.cpp's context values (ext_factor 1,
    attn_factor 1, beta_fast 32, beta_slow 1) for the recipe's YaRN scaling."""
    d, base = r["n_rot"], float(r["rope_freq_base"])
    factor, n_orig = float(r["rope_scaling"]["factor"]), int(r["rope_scaling"]["orig_ctx"])
    freq_scale = 1.0 / factor

    def corr_dim(n_rot: float) -> float:
        return d * math.log(n_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(0.0, math.floor(corr_dim(32.0))), min(d - 1.0, math.ceil(corr_dim(1.0)))
    i = np.arange(d // 2, dtype=np.float64)
    extrap = np.arange(T, dtype=np.float64)[:, None] * base ** (-2 * i / d)[None, :]
    ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
    theta = freq_scale * extrap * (1 - ramp) + extrap * ramp
    mscale = 1.0 + 0.1 * math.log(factor)
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def reference(w: dict[str, np.ndarray], r: dict[str, Any], tokens: list[int], *, kv_f16: bool = True,
              kq_f16: bool = False, window: bool = True, sinks: bool = True) -> np.ndarray:
    """Logits [T, n_vocab] of every position (float64 arithmetic over the file's weights). ``kv_f16``
    rounds K and V as the F16 cache does; ``kq_f16`` rounds Q and the attention weights to F16 as the
    products with that cache do without flash attention (ggml_compute_forward_mul_mat converts src1 to
    F16, the vec_dot_type of F16); ``window=False`` drops the sliding window and ``sinks=False``
    the attention sinks (to show that each matters)."""
    W = {k: v.astype(np.float64) for k, v in w.items()}
    T, H, HKV, hd = len(tokens), r["n_head"], r["n_head_kv"], r["head_dim"]
    k_used, eps = r["n_expert_used"], r["eps"]
    cos, sin = _yarn(r, T)
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * g

    def rope(x: np.ndarray) -> np.ndarray:   # NEOX: halves
        x0, x1 = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)

    def kvr(x: np.ndarray, on: bool = kv_f16) -> np.ndarray:
        return x.astype(np.float16).astype(np.float64) if on else x

    x = W["token_embd.weight"][np.asarray(tokens)]
    ti, si = np.arange(T)[:, None], np.arange(T)[None, :]
    for il in range(r["n_layer"]):
        p, n = f"blk.{il}.", r["swa_pattern"]
        swa = window and il % n < n - 1
        h = rms(x, W[p + "attn_norm.weight"])
        q = (h @ W[p + "attn_q.weight"].T + W[p + "attn_q.bias"]).reshape(T, H, hd)
        k = (h @ W[p + "attn_k.weight"].T + W[p + "attn_k.bias"]).reshape(T, HKV, hd)
        v = (h @ W[p + "attn_v.weight"].T + W[p + "attn_v.bias"]).reshape(T, HKV, hd)
        q, k, v = kvr(rope(q), kq_f16), kvr(rope(k)), kvr(v)
        k, v = np.repeat(k, H // HKV, axis=1), np.repeat(v, H // HKV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(r["n_rot"])
        seen = si <= ti
        if swa:
            seen = seen & (ti - si < r["sliding_window"])
        s = np.where(seen[None], s, -np.inf)
        sink = W[p + "attn_sinks.weight"][:, None, None] if sinks else np.full((H, 1, 1), -np.inf)
        m = np.maximum(s.max(-1, keepdims=True), sink)
        e = np.exp(s - m)
        a = e / (e.sum(-1, keepdims=True) + np.exp(sink - m))
        o = np.einsum("hts,shd->thd", kvr(a, kq_f16), v).reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        x = x + o + W[p + "attn_output.bias"]
        h = rms(x, W[p + "post_attention_norm.weight"])
        logits = h @ W[p + "ffn_gate_inp.weight"].T + W[p + "ffn_gate_inp.bias"]
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :k_used]
        sel = np.take_along_axis(logits, top, -1)
        wts = np.exp(sel - sel.max(-1, keepdims=True))
        wts = wts / wts.sum(-1, keepdims=True)
        ffn = np.zeros_like(x)
        for t in range(T):
            for j in range(k_used):
                ex = top[t, j]
                g = W[p + "ffn_gate_exps.weight"][ex] @ h[t] + W[p + "ffn_gate_exps.bias"][ex]
                u = W[p + "ffn_up_exps.weight"][ex] @ h[t] + W[p + "ffn_up_exps.bias"][ex]
                g = np.minimum(g, SWIGLU_LIMIT)
                u = np.clip(u, -SWIGLU_LIMIT, SWIGLU_LIMIT)
                act = g / (1.0 + np.exp(-SWIGLU_ALPHA * g)) * (u + 1.0)
                ffn[t] += wts[t, j] * (W[p + "ffn_down_exps.weight"][ex] @ act + W[p + "ffn_down_exps.bias"][ex])
        x = x + ffn
    return (rms(x, W["output_norm.weight"]) @ W["output.weight"].T).astype(np.float32)
