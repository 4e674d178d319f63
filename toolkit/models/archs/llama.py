"""``llama`` (``src/models/llama.cpp``): Llama 1-3.x, and Mixtral-style experts in the FFN slot.

- keys: the common ones only (``llama_model_llama::load_arch_hparams`` reads the RMS epsilon,
  common here too); ``rope_freqs.weight`` (Llama-3.x rope scaling) is read as values;
- per layer (``load_arch_tensors``): ``attn_norm``, Q/K/V/O, ``ffn_norm``, then ``ffn_gate``,
  ``ffn_up``, ``ffn_down``, or with experts the router and the three expert tensors;
- RoPE type NORM; no Q/K norms; a KV cache; llama's ``graph_max_nodes``.

The graph, node for node: ``norm``/``attn_norm``, Q/K/V matmuls, reshapes and RoPE (with
``rope_freqs`` as the freq-factors source when the file has it), the attention block of
:class:`~toolkit.models.graph.GraphBuilder` (``kqv_out``, then ``attn_out``), the residual,
``ffn_norm``, the FFN slot (SWIGLU, or ``build_moe_ffn``) and ``l_out``. The last layer keeps only
the output rows (GET_ROWS with ``inp_out_ids``) before its FFN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.archs.base import (
    ROPE_TYPE_NORM,
    Architecture,
    TensorSpec,
    attn_tensors,
    ffn_tensors,
    moe_tensors,
)
from toolkit.models.graph import GraphBuilder, GraphResult

if TYPE_CHECKING:
    from toolkit.models.hparams import HParams


class LlamaGraphBuilder(GraphBuilder):
    """``llm_build_llama``."""

    def build_layers(self, res: GraphResult) -> Tensor:
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
                                  kq_scale, il, wo_s=m.tensors.get(p + "attn_output.scale"))
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


def layer_tensors(hp: HParams, il: int) -> list[TensorSpec]:
    """``llama_model_llama::load_arch_tensors``' layer: attention, ``ffn_norm``, the dense FFN or the experts."""
    ffn = moe_tensors(hp, il) if hp.moe is not None else ffn_tensors(hp, il, ("ffn_gate", "ffn_up", "ffn_down"))
    return [*attn_tensors(hp, il), TensorSpec("ffn_norm", (hp.n_embd,)), *ffn]


@final
@dataclass(frozen=True)
class Llama(Architecture):
    """``LLM_ARCH_LLAMA``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        return layer_tensors(hp, il)


LLAMA = Llama("llama", LlamaGraphBuilder, ROPE_TYPE_NORM, scaled_mm=True)
ARCHITECTURES = (LLAMA,)

__all__ = ["ARCHITECTURES", "LLAMA", "Llama", "LlamaGraphBuilder", "layer_tensors"]
