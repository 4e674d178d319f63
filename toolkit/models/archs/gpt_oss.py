"""``gpt-oss`` (``LLM_ARCH_OPENAI_MOE``, ``src/models/openai-moe.cpp``).

- keys (``llama_model_openai_moe::load_arch_hparams``): ``expert_feed_forward_length``,
  ``attention.sliding_window`` (required; ``LLAMA_SWA_TYPE_STANDARD``),
  ``attention.sliding_window_pattern`` (default 2, ``set_swa_pattern``: the even layers are SWA),
  ``rope.freq_base_swa`` (default: the model's base); the common loader's ``rope.scaling.*`` (YaRN);
- per layer, in ``load_arch_tensors``' order: ``attn_norm``, ``post_attention_norm``, Q/K/V and
  their biases (``create_tensor_qkv``), ``attn_output``, ``attn_sinks``, the router and the experts
  (gate, down, up), then the biases of the output, the router and the experts;
  ``output_norm`` and ``output`` come right after ``token_embd`` (:meth:`GptOss.weights`);
- RoPE type NEOX; no Q/K norms; iSWA's two KV caches; llama's ``graph_max_nodes``.

The graph, node for node (``llama_model_openai_moe::graph``):

- ``build_attn_inp_kv_iswa``; per layer ``attn_norm``, Q/K/V each plus its bias (``build_qkv``),
  NEOX RoPE with YaRN, attention with the layer's ``attn_sinks`` (FLASH_ATTN_EXT's src[4], or the
  SOFT_MAX's src[2] without flash attention) at scale ``1/sqrt(n_rot)``, the output projection plus
  its bias (``attn_out``), ``ffn_inp``, ``attn_post_norm``;
- ``build_moe_ffn`` with the router bias, SOFTMAX_WEIGHT gating (top-k on the biased logits, a
  softmax over the k chosen), ``norm_w = false``, ADD_ID expert biases and ``SWIGLU_OAI``;
- ``l_out``; the last one is ``t_h_nextn``, a graph output (never freed: it holds its memory to the
  end, which the compute buffer shows); the output rows are picked after the last layer
  (``embeddings_nextn_masked`` is false), then ``result_norm`` and ``result_output``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models import moe as moe_ffn
from toolkit.models.archs.base import ROPE_TYPE_NEOX, Architecture, TensorSpec, moe_tensors, read_yarn, yarn_keys
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import SWAParams

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile
    from toolkit.models.hparams import HParams, WeightInfo

# load_arch_hparams: uint32_t swa_period = 2
SWA_PATTERN_DEFAULT = 2


class GptOssGraphBuilder(GraphBuilder):
    """``llama_model_openai_moe::graph``."""

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """``build_moe_ffn`` with every bias, ``LLM_FFN_SWIGLU_OAI_MOE``, ``norm_w = false`` and the
        hyperparameters' gating (SOFTMAX_WEIGHT)."""
        p, m, hp = f"blk.{il}.", self.model, self.hp
        assert hp.moe is not None
        return moe_ffn.build_moe_ffn(
            res.graph, lambda t, name, i: self.cb(res, t, name, i), cur,
            m.w(p + "ffn_gate_inp.weight"), m.w(p + "ffn_up_exps.weight"), m.w(p + "ffn_gate_exps.weight"),
            m.w(p + "ffn_down_exps.weight"), hp.moe, il, gate_inp_b=m.w(p + "ffn_gate_inp.bias"),
            up_exps_b=m.w(p + "ffn_up_exps.bias"), gate_exps_b=m.w(p + "ffn_gate_exps.bias"),
            down_exps_b=m.w(p + "ffn_down_exps.bias"), type_op=moe_ffn.FFN_SWIGLU_OAI, norm_w=False)

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_kv_iswa(res)
        out_ids = self.build_inp_out_ids(res)
        kq_scale = 1.0 / math.sqrt(float(hp.n_rot))
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
            cur = self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il)
            cb(res, cur, "attn_norm", il)
            q, k, v = self.qkv(res, il, cur, bias=True)
            q = self.rope(q, inp_pos, il)
            k = self.rope(k, inp_pos, il)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), m.w(p + "attn_output.bias"),
                                  q, k, v, None, m.w(p + "attn_sinks.weight"), None, kq_scale, il)
            cb(res, cur, "attn_out", il)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = self.build_norm(res, ffn_inp, m.w(p + "post_attention_norm.weight"), il)
            cb(res, cur, "attn_post_norm", il)
            cur = self.ffn(res, il, cur)
            cb(res, cur, "ffn_moe_out", il)
            inpL = cb(res, ops.add(cur, ffn_inp), "l_out", il)
        res.h_nextn = inpL   # res->t_h_nextn: a graph output
        # !cparams.embeddings_nextn_masked: the output rows are picked after the last layer
        return ops.get_rows(inpL, out_ids)


@final
@dataclass(frozen=True)
class GptOss(Architecture):
    """``LLM_ARCH_OPENAI_MOE``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        assert hp.moe is not None
        E, H, rot = hp.n_embd, hp.n_head(il), hp.n_rot
        nq, nkv = H * rot, hp.n_head_kv(il) * rot
        X, FE = hp.moe.n_expert, hp.moe.ff(hp.n_ff(il))
        return [
            TensorSpec("attn_norm", (E,)), TensorSpec("post_attention_norm", (E,)),
            TensorSpec("attn_q", (E, nq)), TensorSpec("attn_k", (E, nkv)), TensorSpec("attn_v", (E, nkv)),
            TensorSpec("attn_q", (nq,), "ADD", True, "bias"), TensorSpec("attn_k", (nkv,), "ADD", True, "bias"),
            TensorSpec("attn_v", (nkv,), "ADD", True, "bias"),
            TensorSpec("attn_output", (nq, E)), TensorSpec("attn_sinks", (H,), "FLASH_ATTN_EXT", True),
            *moe_tensors(hp, il),
            TensorSpec("attn_output", (E,), "ADD", True, "bias"),
            TensorSpec("ffn_gate_inp", (X,), "ADD", True, "bias"),
            TensorSpec("ffn_gate_exps", (FE, X), "ADD_ID", True, "bias"),
            TensorSpec("ffn_down_exps", (E, X), "ADD_ID", True, "bias"),
            TensorSpec("ffn_up_exps", (FE, X), "ADD_ID", True, "bias"),
        ]

    def weights(self, hp: HParams) -> list[WeightInfo]:
        """``load_arch_tensors`` creates ``output_norm`` and ``output`` right after ``token_embd``, before
        the layers (the order of the file, which the memory-mapped CPU buffer's span follows)."""
        out = super().weights(hp)
        head = [w for w in out if w.name in ("output_norm.weight", "output.weight")]
        rest = [w for w in out if w not in head]
        i = next(j for j, w in enumerate(rest) if w.name == "token_embd.weight") + 1
        return [*rest[:i], *head, *rest[i:]]

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """``load_arch_hparams``: the window (required), its period (default 2), the SWA RoPE base, the
        experts (SOFTMAX_WEIGHT gating) and the YaRN keys; a file without ``feed_forward_length`` (as
        gpt-oss files are: llama.cpp's ``n_ff`` is 0 and nothing reads it) gets ``n_ff = n_ff_exp``."""
        key = f.arch_key("attention.sliding_window")
        n_swa = f.get_int(key)
        if not n_swa:
            raise UnsupportedFeature(key, f"{f.path}: {self.name} needs {key} (llama.cpp requires the key)")
        pkey = f.arch_key("attention.sliding_window_pattern")
        if f.get(pkey) is not None and not isinstance(f.get(pkey), int):
            raise UnsupportedFeature(pkey, f"{f.path}: {pkey} is a per-layer array; only a period is supported")
        out: dict[str, Any] = {"swa": SWAParams(window=n_swa, pattern=f.get_int(pkey, SWA_PATTERN_DEFAULT) or 0,
                                                rope_freq_base=f.get_float(f.arch_key("rope.freq_base_swa")))}
        n_expert = f.get_int(f.arch_key("expert_count")) or 0
        n_ff_exp = f.get_int(f.arch_key("expert_feed_forward_length")) or 0
        if n_expert > 0:
            out["moe"] = moe_ffn.MoEParams(n_expert, f.get_int(f.arch_key("expert_used_count")) or 0, n_ff_exp,
                                           gating=moe_ffn.GATING_SOFTMAX_WEIGHT)
        if f.get(f.arch_key("feed_forward_length")) is None and n_ff_exp:
            out["n_ff"] = n_ff_exp
        out.update(read_yarn(f))
        return out

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        assert hp.swa is not None
        out: dict[str, Any] = {"attention.sliding_window": hp.swa.window,
                               "attention.sliding_window_pattern": hp.swa.pattern}
        if hp.swa.rope_freq_base is not None:
            out["rope.freq_base_swa"] = hp.swa.rope_freq_base
        out.update(yarn_keys(hp))
        return out

    def check(self, hp: HParams) -> None:
        if hp.moe is None:
            raise UnsupportedFeature("experts", f"{self.name} needs experts (load_arch_tensors creates them)")
        if hp.moe.gating != moe_ffn.GATING_SOFTMAX_WEIGHT:
            raise UnsupportedFeature(f"expert gating {hp.moe.gating}",
                                     f"{self.name}'s router is {moe_ffn.GATING_SOFTMAX_WEIGHT!r} "
                                     "(LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT)")
        if hp.swa is None:
            raise UnsupportedFeature("swa", f"{self.name} needs a sliding window (attention.sliding_window)")
        if hp.swa.layers is not None:
            raise UnsupportedFeature("swa", f"{self.name}'s sliding window is a period (set_swa_pattern), "
                                     "not per-layer flags")


GPT_OSS = GptOss("gpt-oss", GptOssGraphBuilder, ROPE_TYPE_NEOX)
ARCHITECTURES = (GPT_OSS,)

__all__ = ["ARCHITECTURES", "GPT_OSS", "GptOss", "GptOssGraphBuilder"]
