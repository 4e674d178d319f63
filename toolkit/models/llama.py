"""llama.cpp's llama graph (``src/models/llama.cpp``, dense FFN), node for node.

Per layer: ``norm``/``attn_norm``, Q/K/V matmuls, reshapes and RoPE (with ``rope_freqs`` as
the freq-factors source when the file has it, Llama-3.x rope scaling), the attention block
of :class:`~toolkit.models.graph.GraphBuilder` (``kqv_out``, then ``attn_out``), the residual,
``ffn_norm``, the FFN slot (SWIGLU) and ``l_out``. The last layer keeps only the output rows
(GET_ROWS with ``inp_out_ids``) before its FFN.
"""

from __future__ import annotations

from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.graph import ROPE_TYPE_NORM, GraphBuilder, LlamaGraph

__all__ = ["ROPE_TYPE_NORM", "LlamaGraph", "LlamaGraphBuilder"]


class LlamaGraphBuilder(GraphBuilder):
    """``llm_build_llama``."""

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
            q = self.rope(q, inp_pos, il)
            k = self.rope(k, inp_pos, il)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  kq_scale, il)
            cb(res, cur, "attn_out", il)
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
