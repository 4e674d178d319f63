"""``gemma4`` (``LLM_ARCH_GEMMA4``, ``src/models/gemma4.cpp``): gemma3's iSWA with per-layer head
geometry, V = K on full layers without ``attn_v``, KV sharing, per-layer embeddings and the MoE
beside the dense MLP.

- keys (``llama_model_gemma4::load_arch_hparams``): the per-layer ``attention.sliding_window_pattern``
  (``SWAParams.layers``), ``attention.sliding_window``, ``rope.freq_base_swa``, the SWA layers' head
  sizes ``attention.key_length_swa`` / ``value_length_swa`` and ``rope.dimension_count_swa``
  (``SWAParams.n_embd_head_k`` & co., read by :meth:`HParams.n_embd_head_k_at`),
  ``attention.shared_kv_layers`` (``HParams.n_kv_shared``, ``has_kv``), ``embedding_length_per_layer_input``
  (``HParams.n_embd_per_layer``), ``final_logit_softcapping``, ``expert_feed_forward_length``;
  ``f_attention_scale`` is 1;
- per layer, in the file's order: ``attn_norm``, Q, K, V (absent on full layers when
  ``attn_v_full`` is False: V = K), ``attn_output``, Q/K norms (one head wide), ``post_attention_norm``,
  ``layer_output_scale``, ``rope_freqs`` (created by the first full layer and duplicated for the
  others, read on full layers only), the dense MLP and ``post_ffw_norm``; with experts the router and
  its scale, ``pre_ffw_norm_2``, ``post_ffw_norm_1/2``, the merged ``ffn_gate_up_exps``,
  ``ffn_down_exps`` and its per-expert ``scale``; with per-layer embeddings ``inp_gate``, ``proj``,
  ``post_norm`` (and ``per_layer_token_embd``, ``per_layer_model_proj``, ``per_layer_proj_norm``);
- RoPE type NEOX; llama's ``graph_max_nodes``.

The graph (``llama_model_gemma4::graph``): ``inp_scaled``; per layer ``attn_norm``, Q with its norm
and RoPE (``rope_freqs`` on full layers, the layer's ``n_rot``), and on a layer with its own cache K
(V = K's product when there is no ``attn_v``), the K norm, a weightless RMS norm of V, K's RoPE, the
attention at scale 1; a layer past ``n_layer - n_kv_shared`` attends through an earlier layer's cache
(``layer_reuse_cb``) and stores nothing; ``attn_post_norm``, ``attn_out``; the dense FFN, or the
dense MLP (``ffn_norm_1``, GEGLU, ``post_ffw_norm_1``) plus the MoE (``ffn_norm_2``, the router on
``rms_norm(attn_out) / sqrt(n_embd) * scale`` passed as ``probs_in``, GEGLU experts through the merged
tensor, the per-expert down scale, ``post_ffw_norm_2``); ``ffn_post_norm``, the residual, the per-layer
embedding, ``out_scaled``, ``l_out``; ``result_norm`` (``t_h_nextn``, a graph output), the output
rows, ``result_output`` with the final logit softcap (SCALE, TANH, SCALE).

KV sharing and the per-layer embeddings are built from the source; no measured case pins them (the
oracle's tiny Gemma 4 models have neither).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import GGUFError, UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import F32, I32
from toolkit.models import moe as moe_ffn
from toolkit.models.archs.base import ROPE_TYPE_NEOX, Architecture, TensorSpec
from toolkit.models.gguf_file import GGUFArray, GGUFFile
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.hparams import ROPE_FREQS_LAYER, SWAParams, WeightInfo
from toolkit.models.inputs import GraphInput

if TYPE_CHECKING:
    import numpy as np

    from toolkit.models.hparams import HParams
    from toolkit.models.memory import UBatch


@dataclass(eq=False)
class InputPerLayerTokens(GraphInput):
    """``build_inp_per_layer``'s ``llm_graph_input_embd``: its own copy of the token ids."""

    tokens: Tensor

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        import numpy as np
        return {self.tokens: ub.tokens.astype(np.int32)}


class Gemma4GraphBuilder(GraphBuilder):
    """``llama_model_gemma4::graph``."""

    out_ids: Tensor

    def rope(self, x: Tensor, pos: Tensor, il: int) -> Tensor:
        """``ggml_rope_ext`` with the layer's ``n_rot`` and base; ``rope_freqs`` on full layers only."""
        hp = self.hp
        factors = None if hp.is_swa(il) else self.model.rope_freqs.get(il)
        return ops.rope_ext(x, pos, factors, hp.n_rot_at(il), self.rope_type, hp.n_ctx_train, hp.rope_base(il))

    def build_inp_per_layer(self, res: GraphResult) -> Tensor:
        """``build_inp_per_layer``: the per-layer token embeddings ``[n_embd_per_layer, n_layer, n_tokens]``
        times sqrt(n_embd_per_layer), from their own token input."""
        hp, n_tokens = self.hp, res.n_tokens
        tokens = ops.new_tensor_1d(I32, n_tokens).set_input()
        res.inputs.append(InputPerLayerTokens(tokens))
        cur = ops.get_rows(self.model.w("per_layer_token_embd.weight"), tokens)
        cur = ops.reshape_3d(cur, hp.n_embd_per_layer, hp.n_layer, n_tokens)
        return self.cb(res, ops.scale(cur, math.sqrt(float(hp.n_embd_per_layer))), "inp_per_layer_selected", -1)

    def project_per_layer_inputs(self, res: GraphResult, inp_batch: Tensor, inp_per_layer: Tensor) -> Tensor:
        """``project_per_layer_inputs``: ``[n_embd_per_layer, n_tokens, n_layer]``."""
        hp, m, cb = self.hp, self.model, self.cb
        proj = ops.mul_mat(m.w("per_layer_model_proj.weight"), inp_batch)
        proj = ops.scale(proj, 1.0 / math.sqrt(float(hp.n_embd)))
        proj = ops.reshape_3d(proj, hp.n_embd_per_layer, hp.n_layer, res.n_tokens)
        proj = cb(res, self.build_norm(res, proj, m.w("per_layer_proj_norm.weight"), -1), "per_layer_proj", -1)
        cur = ops.scale(ops.add(proj, inp_per_layer), 1.0 / math.sqrt(2.0))
        cb(res, cur, "inp_per_layer", -1)
        return ops.cont(ops.permute(cur, 0, 2, 1, 3))

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        inpL = cb(res, ops.scale(inpL, math.sqrt(float(hp.n_embd))), "inp_scaled", -1)
        inp_pos = self.build_inp_pos(res)
        inp_attn = self.build_attn_inp_kv_iswa(res)
        out_ids = self.build_inp_out_ids(res)
        inp_per_layer = None
        if hp.n_embd_per_layer:
            inp_per_layer = self.build_inp_per_layer(res)
            res.graph.build_forward_expand(inp_per_layer)
            inp_per_layer = self.project_per_layer_inputs(res, inpL, inp_per_layer)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            H, n_tokens = hp.n_embd_head_k_at(il), res.n_tokens
            cur = cb(res, self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il), "attn_norm", il)
            q = cb(res, ops.mul_mat(m.w(p + "attn_q.weight"), cur), "Qcur", il)
            q = ops.reshape_3d(q, H, hp.n_head(il), n_tokens)
            q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
            q = cb(res, self.rope(q, inp_pos, il), "Qcur_pos", il)
            k: Tensor | None = None
            v: Tensor | None = None
            if hp.has_kv(il):
                k = cb(res, ops.mul_mat(m.w(p + "attn_k.weight"), cur), "Kcur", il)
                v = ops.mul_mat(m.w(p + "attn_v.weight"), cur) if self.has_v(il) else k
                cb(res, v, "Vcur", il)
                k = ops.reshape_3d(k, H, hp.n_head_kv(il), n_tokens)
                v = ops.reshape_3d(v, H, hp.n_head_kv(il), n_tokens)
                k = self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il)
                v = ops.rms_norm(v, hp.eps)
                cb(res, k, "Kcur_normed", il)
                cb(res, v, "Vcur_normed", il)
                k = cb(res, self.rope(k, inp_pos, il), "Kcur_pos", il)
            cur = self.build_attn(res, inp_attn, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                                  1.0, il)
            cur = cb(res, self.build_norm(res, cur, m.w(p + "post_attention_norm.weight"), il), "attn_post_norm", il)
            attn_out = cb(res, ops.add(cur, inpL), "attn_out", il)
            if hp.moe is not None:
                cur = self.moe_beside_mlp(res, il, attn_out)
            else:
                cur = cb(res, self.build_norm(res, attn_out, m.w(p + "ffn_norm.weight"), il), "ffn_norm", il)
                cur = cb(res, self.build_ffn(res, il, cur, "gelu"), "ffn_out", il)
            cur = self.build_norm(res, cur, m.w(p + "post_ffw_norm.weight"), -1)
            cb(res, cur, "ffn_post_norm", il)
            cur = ops.add(cur, attn_out)
            if inp_per_layer is not None:
                cur = self.per_layer_embd(res, il, cur, inp_per_layer)
            cur = cb(res, ops.mul(cur, m.w(p + "layer_output_scale.weight")), "out_scaled", il)
            inpL = cb(res, cur, "l_out", il)
        self.out_ids = out_ids
        return inpL

    def build_output(self, res: GraphResult, cur: Tensor) -> None:
        """``h_nextn`` (the output norm over every token, ``t_h_nextn``), the output rows
        (``embeddings_nextn_masked`` is false), ``result_norm``, the head and the final logit softcap."""
        hp, m, cb = self.hp, self.model, self.cb
        cur = cb(res, self.build_norm(res, cur, m.w("output_norm.weight"), -1), "h_nextn", -1)
        res.h_nextn = cur
        cur = cb(res, ops.get_rows(cur, self.out_ids), "result_norm", -1)
        res.embd = cur
        assert m.output is not None
        cur = ops.mul_mat(m.output, cur)
        cap = hp.final_logit_softcapping
        if cap:
            cur = ops.scale(ops.tanh(ops.scale(cur, 1.0 / cap)), cap)
        res.logits = cb(res, cur, "result_output", -1)

    def has_v(self, il: int) -> bool:
        return self.hp.is_swa(il) or self.hp.attn_v_full

    def moe_beside_mlp(self, res: GraphResult, il: int, attn_out: Tensor) -> Tensor:
        """The dense MLP (a shared expert) plus the routed experts, each with its own post-norm."""
        hp, m, cb = self.hp, self.model, self.cb
        assert hp.moe is not None
        p = f"blk.{il}."
        mlp = cb(res, self.build_norm(res, attn_out, m.w(p + "ffn_norm.weight"), il), "ffn_norm_1", il)
        mlp = self.build_ffn(res, il, mlp, "gelu")
        mlp = cb(res, self.build_norm(res, mlp, m.w(p + "post_ffw_norm_1.weight"), il), "ffn_mlp", il)
        moe = cb(res, self.build_norm(res, attn_out, m.w(p + "pre_ffw_norm_2.weight"), il), "ffn_norm_2", il)
        tmp = ops.rms_norm(attn_out, hp.eps)
        tmp = ops.scale(tmp, 1.0 / math.sqrt(float(hp.n_embd)))
        tmp = ops.mul(tmp, m.w(p + "ffn_gate_inp.scale"))
        logits = cb(res, ops.mul_mat(m.w(p + "ffn_gate_inp.weight"), tmp), "ffn_moe_logits", il)
        moe = moe_ffn.build_moe_ffn(
            res.graph, lambda t, name, i: self.cb(res, t, name, i), moe, None, None, None,
            m.w(p + "ffn_down_exps.weight"), hp.moe, il, type_op=moe_ffn.FFN_GELU, norm_w=True, probs_in=logits,
            gate_up_exps=m.w(p + "ffn_gate_up_exps.weight"), down_exps_s=m.w(p + "ffn_down_exps.scale"))
        moe = cb(res, self.build_norm(res, moe, m.w(p + "post_ffw_norm_2.weight"), il), "ffn_moe", il)
        return cb(res, ops.add(mlp, moe), "ffn_moe_combined", il)

    def per_layer_embd(self, res: GraphResult, il: int, cur: Tensor, inp_per_layer: Tensor) -> Tensor:
        """The per-layer embedding: gate, GELU, times this layer's slice, projection, norm, residual."""
        m, cb, p = self.model, self.cb, f"blk.{il}."
        pe_in = cb(res, cur, "pe_in", il)
        cur = ops.gelu(ops.mul_mat(m.w(p + "inp_gate.weight"), cur))
        x = inp_per_layer
        this = ops.view_2d(x, x.ne[0], x.ne[1], x.type.row_size(x.ne[0]), il * x.nb[2])
        cur = ops.mul_mat(m.w(p + "proj.weight"), ops.mul(cur, this))
        cur = cb(res, self.build_norm(res, cur, m.w(p + "post_norm.weight"), il), "per_layer_embd_out", il)
        return ops.add(pe_in, cur)


@final
@dataclass(frozen=True)
class Gemma4(Architecture):
    """``LLM_ARCH_GEMMA4``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        E, H, F = hp.n_embd, hp.n_embd_head_k_at(il), hp.n_ff(il)
        nq, nkv = H * hp.n_head(il), hp.n_embd_k_gqa(il)
        out = [TensorSpec("attn_norm", (E,)), TensorSpec("attn_q", (E, nq))]
        if hp.has_kv(il):
            out.append(TensorSpec("attn_k", (E, nkv)))
        # attn_v is TENSOR_NOT_REQUIRED: absent on full layers with V = K, and on the layers past
        # n_layer - n_kv_shared, whose checkpoints carry no K/V projections. llama.cpp would still
        # load (and never use) an attn_v a file put on a shared layer; the toolkit refuses such a
        # file as having a tensor gemma4 does not read (no measured case has one).
        if hp.has_kv(il) and (hp.is_swa(il) or hp.attn_v_full):
            out.append(TensorSpec("attn_v", (E, hp.n_embd_v_gqa(il))))
        out += [TensorSpec("attn_output", (nq, E)), TensorSpec("attn_q_norm", (H,))]
        if hp.has_kv(il):
            out.append(TensorSpec("attn_k_norm", (H,)))
        out += [TensorSpec("post_attention_norm", (E,)), TensorSpec("layer_output_scale", (1,)),
                TensorSpec("ffn_norm", (E,)), TensorSpec("ffn_gate", (E, F)), TensorSpec("ffn_up", (E, F)),
                TensorSpec("ffn_down", (F, E)), TensorSpec("post_ffw_norm", (E,))]
        if hp.moe is not None:
            X, FE = hp.moe.n_expert, hp.moe.ff(F)
            out += [TensorSpec("ffn_gate_inp", (E, X), "MUL_MAT", True), TensorSpec("ffn_gate_inp", (E,), kind="scale"),
                    TensorSpec("pre_ffw_norm_2", (E,)), TensorSpec("post_ffw_norm_1", (E,)),
                    TensorSpec("post_ffw_norm_2", (E,)), TensorSpec("ffn_gate_up_exps", (E, 2 * FE, X), "MUL_MAT_ID"),
                    TensorSpec("ffn_down_exps", (FE, E, X), "MUL_MAT_ID"),
                    TensorSpec("ffn_down_exps", (X,), kind="scale")]
        if hp.n_embd_per_layer:
            P = hp.n_embd_per_layer
            out += [TensorSpec("inp_gate", (E, P)), TensorSpec("proj", (P, E)), TensorSpec("post_norm", (E,))]
        return out

    def weights(self, hp: HParams) -> list[WeightInfo]:
        """The file's order: ``token_embd``, the per-layer embedding tables, ``output_norm``, the layers;
        ``rope_freqs`` sits in the first full layer (after its ``layer_output_scale``) and is created by
        each full layer's buffer type (``TENSOR_DUPLICATED``)."""
        out = [w for w in super().weights(hp) if w.name != "rope_freqs.weight"]
        norm = next(w for w in out if w.name == "output_norm.weight")
        out.remove(norm)
        head = [norm]
        if hp.n_embd_per_layer:
            P, L = hp.n_embd_per_layer, hp.n_layer
            head = [hp.weight("per_layer_token_embd.weight", (P * L, hp.n_vocab), -1, "GET_ROWS"),
                    hp.weight("per_layer_model_proj.weight", (hp.n_embd, P * L), 0),
                    hp.weight("per_layer_proj_norm.weight", (P,), 0, "MUL"), norm]
        out[1:1] = head
        full = [il for il in range(hp.n_layer) if not hp.is_swa(il)]
        if hp.rope_freqs is not None and full:
            at = next(i for i, w in enumerate(out) if w.name == f"blk.{full[0]}.layer_output_scale.weight") + 1
            out.insert(at, WeightInfo("rope_freqs.weight", (hp.n_rot // 2,), F32, ROPE_FREQS_LAYER, "ROPE",
                                      tuple(full)))
        return out

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        """``llama_model_gemma4::load_arch_hparams`` and ``llama_model::load_hparams``'s SWA head sizes.

        ``attention.sliding_window_pattern`` is one flag per layer (``get_key_or_arr``), the window is
        required; ``key_length_swa`` / ``value_length_swa`` / ``rope.dimension_count_swa`` default to the
        full layers' sizes (None here) and ``rope.freq_base_swa`` to ``rope.freq_base``. Whether full
        layers have ``attn_v`` is the file's tensor list (``TENSOR_NOT_REQUIRED``; without it V = K)."""
        n_layer = f.require_int(f.arch_key("block_count"))
        key = f.arch_key("attention.sliding_window_pattern")
        flags = f.get(key)
        if flags is None:
            raise GGUFError(f.path, "required key is missing (Gemma 4's per-layer sliding window)", None, key)
        layers = tuple(bool(x) for x in flags.tolist()) if isinstance(flags, GGUFArray) else (bool(flags),) * n_layer
        if len(layers) != n_layer:
            raise GGUFError(f.path, f"key has wrong array length; expected {n_layer}, got {len(layers)}",
                            f.fields[key].offset, key)
        swa = SWAParams(window=f.require_int(f.arch_key("attention.sliding_window")), layers=layers,
                        rope_freq_base=f.get_float(f.arch_key("rope.freq_base_swa"), None),
                        n_embd_head_k=f.get_int(f.arch_key("attention.key_length_swa"), None),
                        n_embd_head_v=f.get_int(f.arch_key("attention.value_length_swa"), None),
                        n_rot=f.get_int(f.arch_key("rope.dimension_count_swa"), None))
        full = [il for il in range(n_layer) if not layers[il]]
        return {"swa": swa, "n_kv_shared": f.get_int(f.arch_key("attention.shared_kv_layers"), 0) or 0,
                "n_embd_per_layer": f.require_int(f.arch_key("embedding_length_per_layer_input")),
                "final_logit_softcapping": f.get_float(f.arch_key("final_logit_softcapping"), 0.0) or 0.0,
                "attn_v_full": any(f"blk.{il}.attn_v.weight" in f.tensors for il in full)}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        swa = hp.swa
        assert swa is not None and swa.layers is not None
        out: dict[str, Any] = {"attention.sliding_window": swa.window,
                               "attention.sliding_window_pattern": list(swa.layers),
                               "attention.shared_kv_layers": hp.n_kv_shared,
                               "embedding_length_per_layer_input": hp.n_embd_per_layer}
        for k, v in (("rope.freq_base_swa", swa.rope_freq_base), ("attention.key_length_swa", swa.n_embd_head_k),
                     ("attention.value_length_swa", swa.n_embd_head_v), ("rope.dimension_count_swa", swa.n_rot)):
            if v is not None:
                out[k] = v
        if hp.final_logit_softcapping:
            out["final_logit_softcapping"] = hp.final_logit_softcapping
        return out

    def check(self, hp: HParams) -> None:
        if hp.swa is None:
            raise UnsupportedFeature("swa", f"{self.name} needs a sliding window (attention.sliding_window)")
        if hp.moe is not None and hp.moe.gating != moe_ffn.GATING_SOFTMAX:
            raise UnsupportedFeature(f"expert gating {hp.moe.gating}",
                                     f"{self.name}'s router is {moe_ffn.GATING_SOFTMAX!r} "
                                     "(LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX)")
        for il in range(hp.n_layer):
            if hp.n_embd_head_k_at(il) != hp.n_embd_head_v_at(il):
                raise UnsupportedFeature("n_embd_head_v", f"{self.name} requires n_embd_head_k == n_embd_head_v "
                                         f"(layer {il}: {hp.n_embd_head_k_at(il)} vs {hp.n_embd_head_v_at(il)})")


GEMMA4 = Gemma4("gemma4", Gemma4GraphBuilder, ROPE_TYPE_NEOX, qk_norm=True, tied_output_first=True,
                moe_tensors=("ffn_gate_up_exps",))
ARCHITECTURES = (GEMMA4,)

__all__ = ["ARCHITECTURES", "GEMMA4", "Gemma4", "Gemma4GraphBuilder", "InputPerLayerTokens"]
