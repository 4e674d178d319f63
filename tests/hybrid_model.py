"""The third oracle's tiny hybrids (``qwen35``, ``qwen35moe``, ``lfm2``), written with the ``gguf`` package.

The writer follows the oracle's generator (make_gguf3.py, presets ``tiny_qwen35_f32``, ``tiny_qwen35moe_f32``,
``tiny_qwen35moe_mtp_f32`` and ``tiny_lfm2_f32``): the keys ``write_kv`` writes for these architectures, the
tensors in ``tensor_list_ne``'s order (``load_arch_tensors``' order), every tensor but the norms drawn from
normal(0, 0.02) in float32 with ``numpy.random.default_rng(seed)`` one after the other, norms 1. With the same
recipe it writes the same weights, so the logits can be compared with llama.cpp's. The tokenizer is a
placeholder of the right size (the logits depend on token ids only).
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


def _qkv(p: str, E: int, nq: int, nk: int, nv: int) -> Tensors:
    return [(p + "attn_q.weight", (E, nq), "mat"), (p + "attn_k.weight", (E, nk), "mat"),
            (p + "attn_v.weight", (E, nv), "mat")]


def _qwen35(r: dict[str, Any]) -> Tensors:
    L, E, V = r["n_layer"], r["n_embd"], r["n_vocab"]
    H, HKV, hd = r["n_head"], r["n_head_kv"], r["head_dim"]
    nkh, nvh, ds = r["ssm_n_group"], r["ssm_dt_rank"], r["ssm_d_state"]
    key_dim, value_dim = ds * nkh, ds * nvh
    conv_dim = 2 * key_dim + value_dim
    out: Tensors = [("token_embd.weight", (E, V), "mat"), ("output_norm.weight", (E,), "norm"),
                    ("output.weight", (E, V), "mat")]
    for il in range(L + r["n_nextn"]):
        p = f"blk.{il}."
        out += [(p + "attn_norm.weight", (E,), "norm"), (p + "post_attention_norm.weight", (E,), "norm")]
        if (il + 1) % r["full_attention_interval"] == 0 or il >= L:
            out += _qkv(p, E, hd * H * 2, hd * HKV, hd * HKV)
            out += [(p + "attn_output.weight", (hd * H, E), "mat"), (p + "attn_q_norm.weight", (hd,), "norm"),
                    (p + "attn_k_norm.weight", (hd,), "norm")]
        else:
            out += [(p + "attn_qkv.weight", (E, conv_dim), "mat"), (p + "attn_gate.weight", (E, value_dim), "mat"),
                    (p + "ssm_conv1d.weight", (r["ssm_d_conv"], conv_dim), "f32mat"),
                    (p + "ssm_dt.bias", (nvh,), "vec"), (p + "ssm_a", (nvh,), "vec"),
                    (p + "ssm_beta.weight", (E, nvh), "mat"), (p + "ssm_alpha.weight", (E, nvh), "mat"),
                    (p + "ssm_norm.weight", (ds,), "norm"), (p + "ssm_out.weight", (value_dim, E), "mat")]
        if r["arch"] == "qwen35moe":
            X, FE, FS = r["n_expert"], r["n_ff_exp"], r["n_ff_shexp"]
            out += [(p + "ffn_gate_inp.weight", (E, X), "router"), (p + "ffn_down_exps.weight", (FE, E, X), "expert"),
                    (p + "ffn_gate_exps.weight", (E, FE, X), "expert"),
                    (p + "ffn_up_exps.weight", (E, FE, X), "expert"), (p + "ffn_gate_inp_shexp.weight", (E,), "vec"),
                    (p + "ffn_gate_shexp.weight", (E, FS), "mat"), (p + "ffn_up_shexp.weight", (E, FS), "mat"),
                    (p + "ffn_down_shexp.weight", (FS, E), "mat")]
        else:
            F = r["n_ff"]
            out += [(p + "ffn_gate.weight", (E, F), "mat"), (p + "ffn_down.weight", (F, E), "mat"),
                    (p + "ffn_up.weight", (E, F), "mat")]
        if il >= L:
            out += [(p + "nextn.eh_proj.weight", (2 * E, E), "mat"), (p + "nextn.enorm.weight", (E,), "norm"),
                    (p + "nextn.hnorm.weight", (E,), "norm"), (p + "nextn.shared_head_norm.weight", (E,), "norm")]
    return out


def _lfm2(r: dict[str, Any]) -> Tensors:
    L, E, V = r["n_layer"], r["n_embd"], r["n_vocab"]
    H, HKV, F, lc = r["n_head"], r["n_head_kv"], r["n_ff"], r["l_cache"]
    hd = E // H
    out: Tensors = [("token_embd.weight", (E, V), "mat"), ("token_embd_norm.weight", (E,), "norm")]
    for il in range(L):
        p = f"blk.{il}."
        out += [(p + "ffn_norm.weight", (E,), "norm"), (p + "ffn_gate.weight", (E, F), "mat"),
                (p + "ffn_down.weight", (F, E), "mat"), (p + "ffn_up.weight", (E, F), "mat"),
                (p + "attn_norm.weight", (E,), "norm")]
        if il in r["attn_layers"]:
            out += [(p + "attn_q_norm.weight", (hd,), "norm"), (p + "attn_k_norm.weight", (hd,), "norm")]
            out += _qkv(p, E, E, HKV * hd, HKV * hd)
            out.append((p + "attn_output.weight", (E, E), "mat"))
        else:
            out += [(p + "shortconv.conv.weight", (lc, E), "f32mat"),
                    (p + "shortconv.in_proj.weight", (E, 3 * E), "mat"),
                    (p + "shortconv.out_proj.weight", (E, E), "mat")]
    return out


def tensor_list(r: dict[str, Any]) -> Tensors:
    """make_gguf3.py's ``tensor_list_ne`` for the hybrids."""
    return _lfm2(r) if r["arch"] == "lfm2" else _qwen35(r)


def _write_kv(w: Any, r: dict[str, Any]) -> None:
    A = r["arch"]
    u32, f32 = arch_keys(w, A)
    u32("vocab_size", r["n_vocab"])
    u32("context_length", r["n_ctx_train"])
    u32("embedding_length", r["n_embd"])
    u32("block_count", r["n_layer"] + r["n_nextn"])
    if r.get("n_ff"):
        u32("feed_forward_length", r["n_ff"])
    u32("attention.head_count", r["n_head"])
    if A == "lfm2":
        w.add_array(f"{A}.attention.head_count_kv",
                    [r["n_head_kv"] if il in r["attn_layers"] else 0 for il in range(r["n_layer"])])
    else:
        u32("attention.head_count_kv", r["n_head_kv"])
    f32("rope.freq_base", r["rope_freq_base"])
    f32("attention.layer_norm_rms_epsilon", r["eps"])
    if r.get("head_dim"):
        u32("attention.key_length", r["head_dim"])
        u32("attention.value_length", r["head_dim"])
    if r.get("n_rot"):
        u32("rope.dimension_count", r["n_rot"])
    if r.get("n_expert"):
        u32("expert_count", r["n_expert"])
        u32("expert_used_count", r["n_expert_used"])
    if r.get("n_ff_exp"):
        u32("expert_feed_forward_length", r["n_ff_exp"])
    if r.get("n_ff_shexp"):
        u32("expert_shared_feed_forward_length", r["n_ff_shexp"])
    if A in ("qwen35", "qwen35moe"):
        w.add_array(f"{A}.rope.dimension_sections", r["rope_sections"])
        u32("full_attention_interval", r["full_attention_interval"])
        u32("ssm.conv_kernel", r["ssm_d_conv"])
        u32("ssm.state_size", r["ssm_d_state"])
        u32("ssm.group_count", r["ssm_n_group"])
        u32("ssm.time_step_rank", r["ssm_dt_rank"])
        u32("ssm.inner_size", r["ssm_d_state"] * r["ssm_dt_rank"])
    if r["n_nextn"]:
        u32("nextn_predict_layers", r["n_nextn"])
    if A == "lfm2":
        u32("shortconv.l_cache", r["l_cache"])


def write_model(path: str, r: dict[str, Any]) -> dict[str, np.ndarray]:
    """Write the GGUF of recipe r (F32 throughout); returns every weight (numpy order)."""
    return write_recipe_model(path, r, numpy_order(tensor_list(r)), _write_kv)
