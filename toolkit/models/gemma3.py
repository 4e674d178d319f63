"""llama.cpp's gemma3 graph with iSWA (``src/models/gemma3.cpp``), node for node.

- ``inp_scaled``: the token embeddings times sqrt(n_embd);
- ``build_attn_inp_kv_iswa``: indices and a mask for the full cache and for the SWA cache;
  each layer attends through the cache its ``is_swa`` picks, with the SWA RoPE base there;
- per layer: QK-norm, NEOX RoPE, a SCALE of Q by ``f_attention_scale`` (the attention itself
  uses scale 1), ``attn_post_norm`` and ``sa_out``, ``ffn_norm``, the GELU-gated FFN
  (GEGLU), ``ffn_post_norm`` (its RMS norm named plain ``norm``) and ``l_out``;
- the output is the tied ``token_embd`` (the loader's duplicate on the output device).
"""

from __future__ import annotations

import math

from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.graph import GraphBuilder, LlamaGraph


class Gemma3GraphBuilder(GraphBuilder):
    """``llm_build_gemma3<iswa=true>``."""

    def ffn(self, res: LlamaGraph, il: int, cur: Tensor) -> Tensor:
        return self.build_ffn(res, il, cur, "gelu")

    def build_layers(self, res: LlamaGraph) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inpL = cb(res, ops.scale(inpL, math.sqrt(float(hp.n_embd))), "inp_scaled", -1)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_inp_attn(res)   # iSWA; without a sliding window in the file, one cache
        out_ids = self.build_inp_out_ids(res)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            cur = self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il)
            cb(res, cur, "attn_norm", il)
            q, k, v = self.qkv(res, il, cur)
            q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
            q = self.rope(q, inp_pos, il)
            k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), "Kcur_normed", il)
            k = self.rope(k, inp_pos, il)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            q = ops.scale(q, hp.f_attention_scale)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  1.0, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpL = ops.get_rows(inpL, out_ids)
            cur = self.build_norm(res, cur, m.w(p + "post_attention_norm.weight"), il)
            cb(res, cur, "attn_post_norm", il)
            sa_out = cb(res, ops.add(cur, inpL), "sa_out", il)
            cur = self.build_norm(res, sa_out, m.w(p + "ffn_norm.weight"), il)
            cb(res, cur, "ffn_norm", il)
            cur = self.ffn(res, il, cur)
            cb(res, cur, "ffn_out", il)
            cur = self.build_norm(res, cur, m.w(p + "post_ffw_norm.weight"), -1)
            cb(res, cur, "ffn_post_norm", il)
            cur = cb(res, ops.add(cur, sa_out), "l_out", il)
            inpL = cur
        return inpL
