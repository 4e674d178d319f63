"""A float64 numpy llama forward (no ggml, no JAX, no cache): the reference the quantized-type runtime tests
compare logits with, over weights already dequantized (by gguf-py or the tests' own block decoders)."""

from __future__ import annotations

import numpy as np

from toolkit.models import HParams


def llama_forward64(w: dict[str, np.ndarray], hp: HParams, tokens: list[int]) -> np.ndarray:
    """Logits [T, n_vocab] (float64) of every position of ``tokens``: RMS norm, NORM-mode RoPE on pairs
    (2i, 2i+1) of the first n_rot dims, causal grouped-query attention, SwiGLU FFN; ``w`` in numpy order."""
    W = {k: np.asarray(v, np.float64) for k, v in w.items()}
    T, H, hd = len(tokens), hp.n_head(), hp.n_embd_head_k
    nkv, rot = hp.n_head_kv(), hp.n_rot
    pos = np.arange(T, dtype=np.float64)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + hp.eps) * g

    def rope(x: np.ndarray) -> np.ndarray:
        inv = float(hp.rope_freq_base) ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
        ang = pos[:, None] * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0:rot:2], x[..., 1:rot:2]
        r = np.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1).reshape(T, x.shape[1], rot)
        return np.concatenate([r, x[..., rot:]], -1)

    def mm(x: np.ndarray, name: str) -> np.ndarray:
        return x @ W[name].T

    def silu(x: np.ndarray) -> np.ndarray:
        return x / (1.0 + np.exp(-x))

    x = W["token_embd.weight"][np.asarray(tokens)]
    causal = np.tril(np.ones((T, T), bool))
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope(mm(h, p + "attn_q.weight").reshape(T, H, hd))
        k = rope(mm(h, p + "attn_k.weight").reshape(T, nkv, hd))
        v = mm(h, p + "attn_v.weight").reshape(T, nkv, hd)
        k, v = np.repeat(k, H // nkv, axis=1), np.repeat(v, H // nkv, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        s = np.where(causal[None], s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", a, v).reshape(T, H * hd)
        x = x + mm(o, p + "attn_output.weight")
        h = rms(x, W[p + "ffn_norm.weight"])
        x = x + mm(silu(mm(h, p + "ffn_gate.weight")) * mm(h, p + "ffn_up.weight"), p + "ffn_down.weight")
    head = "output.weight" if "output.weight" in w else "token_embd.weight"
    return mm(rms(x, W["output_norm.weight"]), head)
