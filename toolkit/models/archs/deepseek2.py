"""``deepseek2`` (``LLM_ARCH_DEEPSEEK2``, ``src/models/deepseek2.cpp``): DeepSeek V2/V3/R1, Kimi K2,
GLM-4.7-Flash, Mistral Small 4 — multi-head latent attention (MLA) and DeepSeek's MoE routing.

- keys (``llama_model_deepseek2::load_arch_hparams``): ``leading_dense_block_count``,
  ``attention.q_lora_rank`` (required but for the lite variants: 26 or 27 blocks, or 48 with a
  128256-token vocabulary), ``attention.kv_lora_rank``, ``attention.key_length_mla`` /
  ``value_length_mla`` (both set: MLA, :class:`~toolkit.models.hparams.MLAParams`),
  ``expert_feed_forward_length``, ``expert_shared_count``, ``expert_weights_scale``,
  ``expert_weights_norm``, ``expert_gating_func`` (absent: softmax, or sigmoid for GLM 4.7 Lite's 47 or
  48 blocks with a 154880-token vocabulary), ``rope.scaling.yarn_log_multiplier`` divided by 0.1
  (the converter's factor, cancelled) and ``nextn_predict_layers``; the expert groups are common keys;
- per layer, in ``load_arch_tensors``' order: ``attn_norm``, ``attn_q_a_norm``, ``attn_kv_a_norm``,
  ``attn_q_a`` and ``attn_q_b`` (or ``attn_q`` without a Q LoRA rank), ``attn_kv_a_mqa``, the split
  ``attn_k_b`` ``[qk_nope, kv_lora_rank, n_head]`` / ``attn_v_b`` ``[kv_lora_rank, v_head, n_head]``,
  ``attn_output``, ``ffn_norm``, then the dense FFN for the ``n_layer_dense_lead`` first layers, else
  the router, ``exp_probs_b`` (optional), the experts (down, gate, up) and the shared expert
  (``*_shexp``, width ``n_ff_exp * n_expert_shared``); a NextN/MTP block adds ``nextn.*`` and is
  skipped (``TENSOR_SKIP``); ``output_norm`` and ``output`` follow ``token_embd`` in the file;
- RoPE type NORM on the ``n_rot`` rotary part only; one K-only KV cache (``has_v = !is_mla``) of
  ``kv_lora_rank + n_rot`` values per token and one head; llama's ``graph_max_nodes``.

The graph (``llama_model_deepseek2::graph``, absorbed MLA): ``build_attn_inp_k``; per layer
``attn_norm``; ``q`` = ``wq_b · rms_norm(wq_a · x)`` viewed as ``q_nope`` / ``q_pe`` per head;
``kv_cmpr_pe = wkv_a_mqa · x`` viewed as ``kv_cmpr`` (RMS-normed) and ``k_pe``; RoPE on ``q_pe`` and
``k_pe``; ``q_nope_absorbed = wk_b · q_nope`` (3-D, one matrix per head); ``Qcur = concat(q_nope_absorbed,
q_pe)``, ``Kcur = concat(kv_cmpr, k_pe)`` (one head), ``Vcur = kv_cmpr``; the attention over the K-only
cache with ``v_mla = wv_b`` (``fattn_mla`` / ``kqv_mla``) at ``kq_scale = mscale² / sqrt(n_embd_head_k_mla)``
(YaRN's mscale: ``attn_factor (1 + 0.1 ln(1/freq_scale)) (1 + 0.1 yarn_log_mul ln(1/freq_scale))``);
``ffn_inp``, ``ffn_norm``, the dense SwiGLU (``ffn_out``) or ``build_moe_ffn`` (sigmoid or softmax
gating, ``exp_probs_b``, expert groups, ``expert_weights_norm``, the weights scale) plus the shared
expert (``ffn_shexp``, ``ffn_out``); ``l_out``. The last layer keeps only the output rows before its FFN.

Not built (refused): the legacy unsplit ``attn_kv_b`` (no ``key_length_mla``: MHA-style MLA), the
attention temperature tuning of Mistral Large (``attention.temperature_scale``) and the merged
``ffn_gate_up_exps``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import GGUFError, ToolkitError, UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models import moe as moe_ffn
from toolkit.models.archs.base import (
    MOE_KEYS,
    ROPE_TYPE_NORM,
    Architecture,
    TensorSpec,
    ffn_tensors,
    head_after_token_embd,
    moe_keys,
    moe_layer_tensors,
    nextn_tensors,
    read_moe,
    read_nextn,
    read_yarn,
    routed_experts,
    yarn_keys,
)
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import MLAParams

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile
    from toolkit.models.hparams import HParams, WeightInfo

# [TAG_DEEPSEEK2_YARN_LOG_MUL_FIX]: the converter multiplies mscale_all_dim by 0.1, load_arch_hparams divides
YARN_LOG_MUL_CONVERTER_FACTOR = 0.1


def kq_scale(hp: HParams) -> float:
    """``llama_model_deepseek2::graph``'s KQ scale, float32 as llama.cpp: YaRN's factor cancelled back
    (``attn_factor_org``), then ``mscale = attn_factor_org (1 + 0.1 yarn_log_mul ln(1/freq_scale))`` and
    ``mscale² / sqrt(n_embd_head_k_mla)``.

    >>> from toolkit.models import presets
    >>> round(kq_scale(presets.get("tiny_deepseek2")), 6)
    0.18713
    """
    import numpy as np  # where it runs: the planning path imports no numpy

    assert hp.mla is not None
    f32 = np.float32
    ys = hp.rope_scaling
    attn_factor = f32(ys.attn_factor if ys is not None else 1.0)
    inv = f32(1.0) / f32(ys.freq_scale if ys is not None else 1.0)
    log_mul = f32(ys.yarn_log_mul if ys is not None else 0.0)
    org = attn_factor * (f32(1.0) + f32(0.1) * np.log(inv))
    mscale = org * (f32(1.0) + f32(0.1) * log_mul * np.log(inv))
    return float(f32(1.0) * mscale * mscale / np.sqrt(f32(hp.mla.n_embd_head_k_mla)))


class DeepSeek2GraphBuilder(GraphBuilder):
    """``llama_model_deepseek2::graph`` (the absorbed MLA path)."""

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_k(res)
        out_ids = self.build_inp_out_ids(res)
        scale = kq_scale(hp)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
            cur = cb(res, self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il), "attn_norm", il)
            q, k, v = self.mla_qkv(res, il, cur, inp_pos)
            cur = self.build_attn_k(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v,
                                    m.w(p + "attn_v_b.weight"), scale, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpSA = ops.get_rows(inpSA, out_ids)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = cb(res, self.build_norm(res, ffn_inp, m.w(p + "ffn_norm.weight"), il), "ffn_norm", il)
            cur = self.ffn(res, il, cur)
            inpL = cb(res, ops.add(cur, ffn_inp), "l_out", il)
        return inpL

    def mla_qkv(self, res: GraphResult, il: int, cur: Tensor, inp_pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The absorbed MLA's ``Qcur`` ``[kv_lora_rank + n_rot, n_head, T]``, ``Kcur`` ``[kv_lora_rank +
        n_rot, 1, T]`` and ``Vcur`` (the normed ``kv_cmpr``, ``[kv_lora_rank, 1, T]``)."""
        hp, m, cb = self.hp, self.model, self.cb
        mla = hp.mla
        assert mla is not None
        p = f"blk.{il}."
        n_tokens, n_head, rot = res.n_tokens, hp.n_head(il), hp.n_rot
        nope, kv_lora = mla.n_embd_head_k_mla - rot, mla.kv_lora_rank
        if mla.q_lora_rank:
            q = cb(res, ops.mul_mat(m.w(p + "attn_q_a.weight"), cur), "q", il)
            q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_a_norm.weight"), il), "q", il)
            q = cb(res, ops.mul_mat(m.w(p + "attn_q_b.weight"), q), "q", il)
        else:   # the lite variants
            q = cb(res, ops.mul_mat(m.w(p + "attn_q.weight"), cur), "q", il)
        q = cb(res, ops.reshape_3d(q, mla.n_embd_head_k_mla, n_head, n_tokens), "q", il)
        kv_cmpr_pe = cb(res, ops.mul_mat(m.w(p + "attn_kv_a_mqa.weight"), cur), "kv_cmpr_pe", il)
        row = kv_cmpr_pe.type.row_size(kv_lora + rot)
        kv_cmpr = cb(res, ops.view_2d(kv_cmpr_pe, kv_lora, n_tokens, row, 0), "kv_cmpr", il)
        k_pe = cb(res, ops.view_3d(kv_cmpr_pe, rot, 1, n_tokens, row, row, kv_cmpr_pe.type.row_size(kv_lora)),
                  "k_pe", il)
        k_pe = cb(res, self.rope(k_pe, inp_pos, il), "k_pe", il)
        kv_cmpr = cb(res, self.build_norm(res, kv_cmpr, m.w(p + "attn_kv_a_norm.weight"), il), "kv_cmpr", il)
        q_nope = cb(res, ops.view_3d(q, nope, n_head, n_tokens, q.nb[1], q.nb[2], 0), "q_nope", il)
        q_pe = cb(res, ops.view_3d(q, rot, n_head, n_tokens, q.nb[1], q.nb[2], q.type.row_size(nope)), "q_pe", il)
        q_pe = cb(res, self.rope(q_pe, inp_pos, il), "q_pe", il)
        q_nope = cb(res, ops.permute(q_nope, 0, 2, 1, 3), "q_nope_perm", il)
        absorbed = cb(res, ops.mul_mat(m.w(p + "attn_k_b.weight"), q_nope), "q_nope_absorbed", il)
        absorbed = cb(res, ops.permute(absorbed, 0, 2, 1, 3), "q_nope_absorbed_perm", il)
        # the rotary part goes last, so that a context shift can rotate K in place
        q_cur = cb(res, ops.concat(absorbed, q_pe, 0), "Qcur", il)
        kv_cmpr = cb(res, ops.reshape_3d(kv_cmpr, kv_lora, 1, n_tokens), "kv_cmpr_reshape", il)
        k_cur = cb(res, ops.concat(kv_cmpr, k_pe, 0), "Kcur", il)
        v_cur = cb(res, kv_cmpr, "Vcur", il)
        return q_cur, k_cur, v_cur

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """The dense SwiGLU for the leading layers (``ffn_out``), else ``build_moe_ffn`` plus the shared expert."""
        hp, cb = self.hp, self.cb
        assert hp.moe is not None
        if not hp.moe.is_moe_layer(il):
            return cb(res, self.build_ffn(res, il, cur, "silu"), "ffn_out", il)
        return cb(res, ops.add(routed_experts(self, res, il, cur),
                               cb(res, self.build_ffn(res, il, cur, "silu", "_shexp"), "ffn_shexp", il)), "ffn_out", il)


@final
@dataclass(frozen=True)
class DeepSeek2(Architecture):
    """``LLM_ARCH_DEEPSEEK2``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        mla, moe = hp.mla, hp.moe
        assert mla is not None and moe is not None
        E, H, rot = hp.n_embd, hp.n_head(il), hp.n_rot
        nope, kv_lora, q_lora = mla.n_embd_head_k_mla - rot, mla.kv_lora_rank, mla.q_lora_rank
        out = [TensorSpec("attn_norm", (E,))]
        if q_lora:
            out.append(TensorSpec("attn_q_a_norm", (q_lora,)))
        out.append(TensorSpec("attn_kv_a_norm", (kv_lora,)))
        if q_lora:
            out += [TensorSpec("attn_q_a", (E, q_lora)), TensorSpec("attn_q_b", (q_lora, H * mla.n_embd_head_k_mla))]
        else:
            out.append(TensorSpec("attn_q", (E, H * mla.n_embd_head_k_mla)))
        out += [TensorSpec("attn_kv_a_mqa", (E, kv_lora + rot)), TensorSpec("attn_k_b", (nope, kv_lora, H)),
                TensorSpec("attn_v_b", (kv_lora, mla.n_embd_head_v_mla, H)),
                TensorSpec("attn_output", (H * mla.n_embd_head_v_mla, E)), TensorSpec("ffn_norm", (E,))]
        if not moe.is_moe_layer(il):
            out += ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up"))
        else:
            out += moe_layer_tensors(hp, il, ("ffn_down_exps", "ffn_gate_exps", "ffn_up_exps"))
        if hp.is_nextn(il):
            out += nextn_tensors(hp)
        return out

    def weights(self, hp: HParams) -> list[WeightInfo]:
        return head_after_token_embd(super().weights(hp))

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """``load_arch_hparams``; UnsupportedFeature for a file without MLA head sizes (the legacy ``attn_kv_b``
        layout) or with the attention temperature tuning."""
        def key(k: str) -> str:
            return f.arch_key(k)

        k_mla, v_mla = f.get_int(key("attention.key_length_mla")), f.get_int(key("attention.value_length_mla"))
        if not k_mla or not v_mla:
            raise UnsupportedFeature("deepseek2 without MLA", f"{f.path}: no {key('attention.key_length_mla')} / "
                                     "value_length_mla: the unsplit attn_kv_b layout (MLA as MHA) is not built")
        if f.get_float(key("attention.temperature_scale")):
            raise UnsupportedFeature("attention temperature scale", f"{f.path}: {key('attention.temperature_scale')}"
                                     " (Mistral Large's temperature tuning) is not built")
        out: dict[str, Any] = read_nextn(f)
        n_layer = out.get("n_layer", f.require_int(key("block_count")))
        n_vocab = f.get_int(key("vocab_size"))
        if n_vocab is None:
            tokens = f.get_array("tokenizer.ggml.tokens")
            n_vocab = len(tokens) if tokens is not None else 0
        is_lite = n_layer in (26, 27) or (n_layer == 48 and n_vocab == 128256)
        q_lora = f.get_int(key("attention.q_lora_rank"))
        if q_lora is None and not is_lite:
            raise GGUFError(f.path, "required key is missing", None, key("attention.q_lora_rank"))
        kv_lora = f.require_int(key("attention.kv_lora_rank"))
        # GLM 4.7 Lite's files have no gating key and route with a sigmoid; DeepSeek V2/V2.5's with a softmax
        glm_lite = n_layer in (47, 48) and n_vocab == 154880
        out.update(read_moe(f, moe_ffn.GATING_SIGMOID if glm_lite else moe_ffn.GATING_SOFTMAX, True))
        # exp_probs_b is TENSOR_NOT_REQUIRED here: absent when the first MoE layer has its router without it
        # (a file without tensor names, as a log's, keeps it: every DeepSeek V3-style file has it)
        lead = out["moe"].n_layer_dense_lead
        if f"blk.{lead}.ffn_gate_inp.weight" in f.tensors and f"blk.{lead}.exp_probs_b.bias" not in f.tensors:
            out["moe"] = dataclasses.replace(out["moe"], exp_probs_b=False)
        out["mla"] = MLAParams(0 if is_lite else (q_lora or 0), kv_lora, k_mla, v_mla)
        out.update(read_yarn(f, YARN_LOG_MUL_CONVERTER_FACTOR, mscale_is_log_mul=True))
        return out

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        mla = hp.mla
        assert mla is not None
        out: dict[str, Any] = {"attention.kv_lora_rank": mla.kv_lora_rank,
                               "attention.key_length_mla": mla.n_embd_head_k_mla,
                               "attention.value_length_mla": mla.n_embd_head_v_mla, **moe_keys(hp),
                               **yarn_keys(hp, YARN_LOG_MUL_CONVERTER_FACTOR)}
        if mla.q_lora_rank:
            out["attention.q_lora_rank"] = mla.q_lora_rank
        if hp.n_layer_nextn:
            out["nextn_predict_layers"] = hp.n_layer_nextn
        return out

    def check(self, hp: HParams) -> None:
        if hp.mla is None:
            raise UnsupportedFeature("deepseek2 without MLA", f"{self.name} is built with MLA only (hp.mla)")
        if hp.moe is None:
            raise ToolkitError(f"{self.name} needs experts (load_arch_tensors: n_expert must be > 0)")
        mla = hp.mla
        if mla.n_embd_head_k_mla - hp.n_rot < 1:
            raise ToolkitError(f"{self.name}: n_embd_head_k_mla={mla.n_embd_head_k_mla} must exceed n_rot={hp.n_rot}")
        if hp.n_embd_head_k != mla.kv_lora_rank + hp.n_rot or hp.n_head_kv(0) != 1:
            raise ToolkitError(f"{self.name}'s absorbed MLA caches kv_lora_rank + n_rot = "
                               f"{mla.kv_lora_rank + hp.n_rot} values of one KV head (attention.key_length, "
                               f"head_count_kv 1); got {hp.n_embd_head_k} and {hp.n_head_kv(0)}")
        if hp.n_embd_head_v != mla.kv_lora_rank:
            raise ToolkitError(f"{self.name}'s absorbed MLA needs value_length = kv_lora_rank = {mla.kv_lora_rank}, "
                               f"got {hp.n_embd_head_v}")


DEEPSEEK2 = DeepSeek2("deepseek2", DeepSeek2GraphBuilder, ROPE_TYPE_NORM, moe_tensors=("_shexp", "exp_probs_b"),
                      moe_keys=MOE_KEYS)
ARCHITECTURES = (DEEPSEEK2,)

__all__ = ["ARCHITECTURES", "DEEPSEEK2", "DeepSeek2", "DeepSeek2GraphBuilder", "kq_scale"]
