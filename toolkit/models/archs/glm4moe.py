"""``glm4moe`` (``LLM_ARCH_GLM4_MOE``, ``src/models/glm4-moe.cpp``): GLM-4.5, GLM-4.6, GLM-4.7, GLM-4.5-Air.

- keys (``llama_model_glm4_moe::load_arch_hparams``): ``expert_feed_forward_length``,
  ``expert_shared_count``, ``leading_dense_block_count``, ``expert_weights_scale``,
  ``expert_weights_norm``, ``expert_gating_func`` (absent: sigmoid), ``nextn_predict_layers``;
  ``rope.dimension_sections`` (M-RoPE, the vision variants: refused here); the expert groups are
  common keys;
- per layer, in ``load_arch_tensors``' order: ``attn_norm``, Q/K/V and their biases
  (``create_tensor_qkv``), ``attn_output``, the optional ``attn_q_norm`` / ``attn_k_norm``
  (``TENSOR_NOT_REQUIRED``: GLM-4.5 has them, GLM-4.5-Air not; ``HParams.qk_norm``),
  ``post_attention_norm``, then the dense FFN for the ``n_layer_dense_lead`` first layers, else the
  router, ``exp_probs_b`` (required), the experts (gate, down, up) and the shared expert; the NextN
  block(s) add ``nextn.*``, every tensor of them ``TENSOR_SKIP``: not loaded, not in the graph, but the
  block counts for ``-ngl`` and gets a KV cache (``llama_kv_cache`` walks ``n_layer_all``);
- RoPE type NEOX, partial (``n_rot`` of the head); one KV cache; llama's ``graph_max_nodes``.

The graph (``llama_model_glm4_moe::graph``): per layer ``attn_norm``, Q/K/V plus biases (``build_qkv``),
``Qcur_normed`` / ``Kcur_normed`` when the model has the norms, NEOX RoPE, attention at ``1/sqrt(head)``,
the output projection, the last layer's output rows, ``ffn_inp``, ``post_attn_norm``, the dense SwiGLU
(``ffn_out``) or ``build_moe_ffn`` (sigmoid + ``exp_probs_b``, ``expert_weights_norm``, the scale)
plus the shared expert (``ffn_shexp_out``, ``ffn_out``), ``l_out``; only the ``n_layer`` trunk blocks run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import ToolkitError, UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models import moe as moe_ffn
from toolkit.models.archs.base import (
    MOE_KEYS,
    ROPE_TYPE_NEOX,
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

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile
    from toolkit.models.hparams import HParams, WeightInfo


class Glm4MoeGraphBuilder(GraphBuilder):
    """``llama_model_glm4_moe::graph``."""

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_kv(res)
        out_ids = self.build_inp_out_ids(res)
        kq_scale = 1.0 / math.sqrt(float(hp.n_embd_head_v))
        for il in range(hp.n_layer):   # the NextN block(s) after the trunk are not run
            p = f"blk.{il}."
            inpSA = inpL
            cur = cb(res, self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il), "attn_norm", il)
            q, k, v = self.qkv(res, il, cur, bias=True)
            if hp.qk_norm:
                q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
                k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), "Kcur_normed", il)
            q = cb(res, self.rope(q, inp_pos, il), "Qcur", il)
            k = cb(res, self.rope(k, inp_pos, il), "Kcur", il)
            cb(res, v, "Vcur", il)
            # llama.cpp asks for F32 accumulation of the output projection here (ggml_mul_mat_set_prec): the
            # same node
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  kq_scale, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpSA = ops.get_rows(inpSA, out_ids)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = self.build_norm(res, ffn_inp, m.w(p + "post_attention_norm.weight"), il)
            cur = self.ffn(res, il, cb(res, cur, "post_attn_norm", il))
            inpL = cb(res, ops.add(cur, ffn_inp), "l_out", il)
        return inpL

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """The dense SwiGLU for the leading layers (``ffn_out``), else the routed experts plus the shared one."""
        hp, cb = self.hp, self.cb
        assert hp.moe is not None
        if not hp.moe.is_moe_layer(il):
            return cb(res, self.build_ffn(res, il, cur, "silu"), "ffn_out", il)
        routed = routed_experts(self, res, il, cur)
        shared = cb(res, self.build_ffn(res, il, cur, "silu", "_shexp"), "ffn_shexp_out", il)
        return cb(res, ops.add(routed, shared), "ffn_out", il)


@final
@dataclass(frozen=True)
class Glm4Moe(Architecture):
    """``LLM_ARCH_GLM4_MOE``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        assert hp.moe is not None
        E, Hk = hp.n_embd, hp.n_embd_head_k
        nq, nk, nv = Hk * hp.n_head(il), hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il)
        out = [TensorSpec("attn_norm", (E,)), TensorSpec("attn_q", (E, nq)), TensorSpec("attn_k", (E, nk)),
               TensorSpec("attn_v", (E, nv)), TensorSpec("attn_q", (nq,), "ADD", True, "bias"),
               TensorSpec("attn_k", (nk,), "ADD", True, "bias"), TensorSpec("attn_v", (nv,), "ADD", True, "bias"),
               TensorSpec("attn_output", (nq, E))]
        if hp.qk_norm:
            out += [TensorSpec("attn_q_norm", (Hk,)), TensorSpec("attn_k_norm", (Hk,))]
        out.append(TensorSpec("post_attention_norm", (E,)))
        if not hp.moe.is_moe_layer(il):
            out += ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up"))
        else:
            out += moe_layer_tensors(hp, il, ("ffn_gate_exps", "ffn_down_exps", "ffn_up_exps"))
        if hp.is_nextn(il):
            out += nextn_tensors(hp)
        return out

    def weights(self, hp: HParams) -> list[WeightInfo]:
        return head_after_token_embd(super().weights(hp))

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """``load_arch_hparams``; UnsupportedFeature for M-RoPE sections (the vision variants' ``ggml_rope_multi``)."""
        sections = f.get(f.arch_key("rope.dimension_sections"))
        if sections is not None and any(int(x) for x in (sections.tolist() if hasattr(sections, "tolist")
                                                         else sections)):
            raise UnsupportedFeature("glm4moe M-RoPE", f"{f.path}: {f.arch_key('rope.dimension_sections')} "
                                     "(ggml_rope_multi, the vision variants) is not built for glm4moe")
        return {**read_nextn(f), **read_moe(f, moe_ffn.GATING_SIGMOID, exp_probs_b=True), **read_yarn(f),
                "qk_norm": "blk.0.attn_q_norm.weight" in f.tensors}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        out: dict[str, Any] = {**moe_keys(hp), **yarn_keys(hp)}
        if hp.n_layer_nextn:
            out["nextn_predict_layers"] = hp.n_layer_nextn
        return out

    def check(self, hp: HParams) -> None:
        if hp.moe is None:
            raise ToolkitError(f"{self.name} needs experts (load_arch_tensors asserts n_expert > 0)")
        if not hp.moe.exp_probs_b:
            raise ToolkitError(f"{self.name}'s MoE layers have exp_probs_b (a required tensor)")
        if hp.moe.n_expert_shared <= 0:
            raise UnsupportedFeature("glm4moe without a shared expert",
                                     f"{self.name}'s graph adds the shared expert on every MoE layer")
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise ToolkitError(f"{self.name} needs n_embd_head_k == n_embd_head_v (llama.cpp asserts it)")


GLM4MOE = Glm4Moe("glm4moe", Glm4MoeGraphBuilder, ROPE_TYPE_NEOX, moe_tensors=("_shexp", "exp_probs_b"),
                  moe_keys=MOE_KEYS)
ARCHITECTURES = (GLM4MOE,)

__all__ = ["ARCHITECTURES", "GLM4MOE", "Glm4Moe", "Glm4MoeGraphBuilder"]
