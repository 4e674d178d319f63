"""llama.cpp's qwen3 graph (``src/models/qwen3.cpp``), node for node.

llama's layer with ``attn_q_norm``/``attn_k_norm`` RMS norms on the heads of Q and K before
RoPE (``Qcur_normed``, ``Kcur_normed``: four more nodes per layer), NEOX RoPE, and the
attention output projection left unnamed.
"""

from __future__ import annotations

from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.graph import GraphBuilder, LlamaGraph


class Qwen3GraphBuilder(GraphBuilder):
    """``llm_build_qwen3``."""

    def build_layers(self, res: LlamaGraph) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_kv(res)
        out_ids = self.build_inp_out_ids(res)
        kq_scale = self.kq_scale()
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
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
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  kq_scale, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpSA = ops.get_rows(inpSA, out_ids)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = self.build_norm(res, ffn_inp, m.w(p + "ffn_norm.weight"), il)
            cb(res, cur, "ffn_norm", il)
            cur = self.ffn(res, il, cur)
            if hp.moe is None:  # build_moe_ffn's result keeps its name, ffn_moe_out
                cb(res, cur, "ffn_out", il)
            cur = cb(res, ops.add(cur, ffn_inp), "l_out", il)
            inpL = cur
        return inpL
