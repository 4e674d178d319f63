"""``qwen3`` and ``qwen3moe`` (``src/models/qwen3.cpp``, ``src/models/qwen3moe.cpp``).

qwen3moe is qwen3's layer with ``build_moe_ffn`` in the FFN slot, so both are one builder and
one record class, two records:

- keys: the common ones (qwen3moe's ``expert_feed_forward_length`` is read with the other MoE
  keys, :func:`toolkit.models.moe.from_gguf`);
- per layer: ``attn_norm``, Q/K/V/O, ``attn_q_norm``, ``attn_k_norm``, ``ffn_norm``, then
  ``ffn_gate``, ``ffn_down``, ``ffn_up`` (qwen3) or the router and the experts (qwen3moe, which
  ``load_arch_tensors`` refuses without experts);
- RoPE type NEOX; Q/K norms; a KV cache; llama's ``graph_max_nodes``.

The graph is llama's with ``attn_q_norm``/``attn_k_norm`` RMS norms on the heads of Q and K
before RoPE (``Qcur_normed``, ``Kcur_normed``: four more nodes per layer), and the attention
output projection left unnamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, final

from toolkit.errors import ToolkitError
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.archs.base import (
    ROPE_TYPE_NEOX,
    Architecture,
    TensorSpec,
    attn_tensors,
    ffn_tensors,
    moe_tensors,
    qk_norm_tensors,
)
from toolkit.models.graph import GraphBuilder, GraphResult

if TYPE_CHECKING:
    from toolkit.models.hparams import HParams


class Qwen3GraphBuilder(GraphBuilder):
    """``llm_build_qwen3`` (and ``llm_build_qwen3moe``: the FFN slot holds the experts)."""

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
            q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
            q = self.rope(q, inp_pos, il)
            k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), "Kcur_normed", il)
            k = self.rope(k, inp_pos, il)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  kq_scale, il, wo_s=m.tensors.get(p + "attn_output.scale"))
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


@final
@dataclass(frozen=True)
class Qwen3(Architecture):
    """``LLM_ARCH_QWEN3`` and, with ``experts=True``, ``LLM_ARCH_QWEN3MOE``."""

    experts: bool = False   # qwen3moe: the FFN slot must hold experts

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        out = [*attn_tensors(hp, il), *qk_norm_tensors(hp), TensorSpec("ffn_norm", (hp.n_embd,))]
        if hp.moe is not None:
            return out + moe_tensors(hp, il)
        return out + ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up"))

    def check(self, hp: HParams) -> None:
        # llama_model_qwen3moe::load_arch_tensors: "n_expert must be > 0 for QWEN3MOE"
        if self.experts and hp.moe is None:
            raise ToolkitError(f"{self.name} needs experts: n_expert must be > 0 (llama.cpp refuses the model)")


QWEN3 = Qwen3("qwen3", Qwen3GraphBuilder, ROPE_TYPE_NEOX, qk_norm=True, scaled_mm=True)
QWEN3MOE = Qwen3("qwen3moe", Qwen3GraphBuilder, ROPE_TYPE_NEOX, qk_norm=True, experts=True,
                  scaled_mm=True)
ARCHITECTURES = (QWEN3, QWEN3MOE)

__all__ = ["ARCHITECTURES", "QWEN3", "QWEN3MOE", "Qwen3", "Qwen3GraphBuilder"]
