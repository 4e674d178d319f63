"""``qwen35`` and ``qwen35moe`` (Qwen3.5 / Qwen3.6: ``src/models/qwen35.cpp``, ``qwen35moe.cpp``,
``delta-net-base.cpp``): three of every four layers a gated delta net with a recurrent state, every
``full_attention_interval``-th (default 4) gated attention with a KV cache; one builder, one record
class, two records.

- keys (:meth:`Qwen35.read_hparams`): ``rope.dimension_sections``, ``ssm.conv_kernel`` /
  ``inner_size`` / ``state_size`` / ``time_step_rank`` / ``group_count`` (every one required: a
  hybrid GGUF without one is refused naming it), ``attention.recurrent_layers`` or
  ``full_attention_interval``; qwen35moe adds ``expert_shared_feed_forward_length``;
- per layer (the file's order): ``attn_norm``, ``post_attention_norm``; an attention layer
  ``attn_q`` (Q and its gate, 2 x wide), ``attn_k``, ``attn_v``, ``attn_output``, ``attn_q_norm``,
  ``attn_k_norm``; a recurrent layer ``attn_qkv``, ``attn_gate`` (z), ``ssm_conv1d``, ``ssm_dt.bias``,
  ``ssm_a``, ``ssm_beta``, ``ssm_alpha``, ``ssm_norm``, ``ssm_out``; then the FFN (qwen35: gate, down,
  up; qwen35moe: the router, the experts and the sigmoid-gated shared expert);
- the weights start ``token_embd``, ``output_norm``, ``output`` (``load_arch_tensors``' order);
- RoPE type IMROPE (40, ``ggml_rope_multi`` with four positions per token, partial ``n_rot``);
  memory ``llama_memory_hybrid``; ``graph_max_nodes`` = ``max(40 * n_tokens, 32 * n_tensors)``.

The graph (``llama_model_qwen35moe::graph``): per layer ``attn_norm`` (expanded at once), the
recurrent or attention block, ``attn_residual``, ``attn_post_norm``, the FFN (``ffn_out``), ``l_out``;
after the layers the output norm ``h_nextn`` (``t_h_nextn``, a graph output), then the output rows
(``result_norm``, ``embeddings_nextn_masked`` false) and ``result_output``.

NextN/MTP blocks (``nextn_predict_layers``, appended after the trunk: ``block_count`` is ``n_layer_all``)
are read as llama.cpp reads them when MTP is not loaded: ``load_block_mtp`` creates a full-attention
block (qwen35moe: with the MoE FFN) plus ``nextn.eh_proj`` / ``enorm`` / ``hnorm`` / ``shared_head_norm``,
every tensor ``TENSOR_SKIP`` (in the file, never loaded); the block counts for layer placement and for
nothing else (not in the graph, the KV cache or the recurrent state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import GGUFError, ToolkitError
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import I32
from toolkit.models.archs.base import Architecture, TensorSpec, ffn_tensors, moe_tensors
from toolkit.models.gguf_file import GGUFArray
from toolkit.models.graph import GraphResult
from toolkit.models.hparams import HParams, WeightInfo
from toolkit.models.hybrid import HybridGraphBuilder
from toolkit.models.inputs import InputAttnKV, InputPos, InputRS
from toolkit.models.memory import MEMORY_HYBRID
from toolkit.models.moe import build_moe_ffn
from toolkit.models.ssm import RecurrentParams, interval_layers

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile

# llama_rope_type: LLAMA_ROPE_TYPE_IMROPE = GGML_ROPE_TYPE_IMROPE (interleaved M-RoPE)
ROPE_TYPE_IMROPE = 40
# llama_hparams::n_pos_per_embd for M-RoPE
N_POS_PER_EMBD = 4


class Qwen35GraphBuilder(HybridGraphBuilder):
    """``llama_model_qwen35::graph`` / ``llama_model_qwen35moe::graph``."""

    def build_inp_pos(self, res: GraphResult) -> Tensor:
        """Four positions per token (``n_pos_per_embd``)."""
        t = ops.new_tensor_1d(I32, res.n_tokens * N_POS_PER_EMBD).set_input()
        res.inputs.append(InputPos(t, N_POS_PER_EMBD))
        return t

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        inpL = self.build_inp_embd(res)
        cb(res, inpL, "model.input_embed", -1)
        inp = self.build_inp_mem_hybrid(res)
        inp_pos = self.build_inp_pos(res)
        self.out_ids = self.build_inp_out_ids(res)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
            cur = cb(res, self.build_norm(res, inpL, m.w(p + "attn_norm.weight"), il), "attn_norm", il)
            res.graph.build_forward_expand(cur)
            if hp.is_recr(il):
                cur = self.build_layer_attn_linear(res, inp.rs, cur, il)
            else:
                cur = self.build_layer_attn(res, inp.attn, cur, inp_pos, il)
            cur = cb(res, ops.add(cur, inpSA), "attn_residual", il)
            ffn_residual = cur
            post = cb(res, self.build_norm(res, cur, m.w(p + "post_attention_norm.weight"), il), "attn_post_norm", il)
            cur = cb(res, self.ffn(res, il, post), "ffn_out", il)
            cur = cb(res, ops.add(cur, ffn_residual), "post_moe" if hp.moe is not None else "post_ffn", il)
            inpL = cb(res, cur, "l_out", il)
        return inpL

    def build_output_norm(self, res: GraphResult, cur: Tensor) -> Tensor:
        """The output norm is ``h_nextn`` (a graph output); the output rows are picked after it."""
        cur = self.cb(res, self.build_norm(res, cur, self.model.w("output_norm.weight"), -1), "h_nextn", -1)
        res.h_nextn = cur
        return self.cb(res, ops.get_rows(cur, self.out_ids), "result_norm", -1)

    # ---- the gated attention layer --------------------------------------------------------------
    def build_layer_attn(self, res: GraphResult, inp: InputAttnKV, cur: Tensor, inp_pos: Tensor, il: int) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        p = f"blk.{il}."
        hd, n_head, n_tokens = hp.n_embd_head_v, hp.n_head(il), res.n_tokens
        q_full = cb(res, ops.mul_mat(m.w(p + "attn_q.weight"), cur), "Qcur_full", il)
        es = q_full.type.row_size(1)
        q = cb(res, ops.view_3d(q_full, hd, n_head, n_tokens, es * hd * 2, es * hd * 2 * n_head, 0),
               "Qcur_reshaped", il)
        q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), "Qcur_normed", il)
        k = cb(res, ops.mul_mat(m.w(p + "attn_k.weight"), cur), "Kcur", il)
        v = cb(res, ops.mul_mat(m.w(p + "attn_v.weight"), cur), "Vcur", il)
        k = ops.reshape_3d(k, hd, hp.n_head_kv(il), n_tokens)
        k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), "Kcur_normed", il)
        gate = ops.view_3d(q_full, hd, n_head, n_tokens, es * hd * 2, es * hd * 2 * n_head, es * hd)
        gate = cb(res, ops.cont_2d(gate, hd * n_head, n_tokens), "gate_reshaped", il)
        v = ops.reshape_3d(v, hd, hp.n_head_kv(il), n_tokens)
        q = self.rope_multi(q, inp_pos)
        k = self.rope_multi(k, inp_pos)
        cb(res, q, "Qcur", il)
        cb(res, k, "Kcur", il)
        cb(res, v, "Vcur", il)
        cur = self.build_attn(res, inp, None, None, q, k, v, None, None, None, 1.0 / math.sqrt(hd), il)
        cb(res, cur, "attn_pregate", il)
        gate = cb(res, ops.sigmoid(gate), "gate_sigmoid", il)
        cur = cb(res, ops.mul(cur, gate), "attn_gated", il)
        return cb(res, ops.mul_mat(m.w(p + "attn_output.weight"), cur), "attn_output", il)

    def rope_multi(self, x: Tensor, pos: Tensor) -> Tensor:
        hp = self.hp
        assert hp.rope_sections is not None
        return ops.rope_multi(x, pos, None, hp.n_rot, hp.rope_sections, self.rope_type, hp.n_ctx_train,
                              hp.rope_freq_base)

    # ---- the gated delta net layer ------------------------------------------------------------------
    def build_layer_attn_linear(self, res: GraphResult, inp: InputRS, cur: Tensor, il: int) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        rp = hp.recurrent
        assert rp is not None
        p = f"blk.{il}."
        n_seqs = res.n_seqs
        n_seq_tokens = res.n_tokens // n_seqs
        head_k_dim, num_k_heads, num_v_heads = rp.d_state, rp.n_group, rp.dt_rank
        head_v_dim = rp.d_inner // num_v_heads
        qkv_mixed = ops.mul_mat(m.w(p + "attn_qkv.weight"), cur)
        qkv_mixed = cb(res, ops.reshape_3d(qkv_mixed, qkv_mixed.ne[0], n_seq_tokens, n_seqs),
                       "linear_attn_qkv_mixed", il)
        z = cb(res, ops.mul_mat(m.w(p + "attn_gate.weight"), cur), "z", il)
        beta = ops.mul_mat(m.w(p + "ssm_beta.weight"), cur)
        beta = cb(res, ops.reshape_4d(beta, 1, num_v_heads, n_seq_tokens, n_seqs), "beta", il)
        beta = cb(res, ops.sigmoid(beta), "beta_sigmoid", il)
        alpha = ops.mul_mat(m.w(p + "ssm_alpha.weight"), cur)
        alpha = cb(res, ops.reshape_3d(alpha, num_v_heads, n_seq_tokens, n_seqs), "alpha", il)
        alpha_softplus = cb(res, ops.softplus(ops.add(alpha, m.w(p + "ssm_dt.bias"))), "a_softplus", il)
        gate = cb(res, ops.mul(alpha_softplus, m.w(p + "ssm_a")), "gate", il)
        gate = ops.reshape_4d(gate, 1, num_v_heads, n_seq_tokens, n_seqs)
        rs = inp.rs
        conv_states_all, ssm_states_all = rs.r_of(il), rs.s_of(il)
        conv_kernel = m.w(p + "ssm_conv1d.weight")
        conv_input = self.build_conv_state(res, inp, conv_states_all, qkv_mixed, conv_kernel.ne[0],
                                           rp.conv_channels, il)
        state = self.build_rs(res, inp, ssm_states_all, hp.n_embd_s(), n_seqs)
        state = cb(res, ops.reshape_4d(state, head_v_dim, head_v_dim, num_v_heads, n_seqs), "state_predelta", il)
        conv_out = cb(res, ops.ssm_conv(conv_input, conv_kernel), "conv_output_raw", il)
        mix = cb(res, ops.silu(conv_out), "conv_output_silu", il)
        t = mix.type
        nb1 = t.row_size(head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads)
        q_conv = ops.view_4d(mix, head_k_dim, num_k_heads, n_seq_tokens, n_seqs, t.row_size(head_k_dim), nb1,
                             nb1 * n_seq_tokens, 0)
        k_conv = ops.view_4d(mix, head_k_dim, num_k_heads, n_seq_tokens, n_seqs, t.row_size(head_k_dim), nb1,
                             nb1 * n_seq_tokens, head_k_dim * num_k_heads * t.row_size(1))
        v_conv = ops.view_4d(mix, head_v_dim, num_v_heads, n_seq_tokens, n_seqs, t.row_size(head_v_dim), nb1,
                             nb1 * n_seq_tokens, t.row_size(2 * head_k_dim * num_k_heads))
        cb(res, q_conv, "q_conv", il)
        cb(res, k_conv, "k_conv", il)
        cb(res, v_conv, "v_conv", il)
        q_conv = cb(res, ops.l2_norm(q_conv, hp.eps), "q_conv_predelta", il)
        k_conv = cb(res, ops.l2_norm(k_conv, hp.eps), "k_conv_predelta", il)
        cb(res, v_conv, "v_conv_predelta", il)
        output = self.build_recurrent_attn(res, inp, ssm_states_all, q_conv, k_conv, v_conv, gate, beta, state, il)
        z_2d = ops.reshape_4d(z, head_v_dim, num_v_heads, n_seq_tokens, n_seqs)
        normed = self.build_norm(res, output, m.w(p + "ssm_norm.weight"), il)
        out = ops.mul(normed, ops.silu(z_2d))                       # build_norm_gated
        out = cb(res, ops.reshape_3d(out, head_v_dim * num_v_heads, n_seq_tokens, n_seqs), "final_output", il)
        cur = cb(res, ops.mul_mat(m.w(p + "ssm_out.weight"), out), "linear_attn_out", il)
        return ops.reshape_2d(cur, hp.n_embd, n_seq_tokens * n_seqs)

    # ---- the FFN ----------------------------------------------------------------------------------------
    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """qwen35: the dense SwiGLU; qwen35moe: ``build_moe_ffn`` plus the shared expert, gated by
        ``sigmoid(ffn_gate_inp_shexp · x)`` (``build_layer_ffn``)."""
        if self.hp.moe is None:
            return self.build_ffn(res, il, cur, "silu")
        p = f"blk.{il}."
        m, cb = self.model, self.cb
        moe_out = build_moe_ffn(res.graph, lambda t, name, i: cb(res, t, name, i), cur,
                                m.w(p + "ffn_gate_inp.weight"), m.w(p + "ffn_up_exps.weight"),
                                m.w(p + "ffn_gate_exps.weight"), m.w(p + "ffn_down_exps.weight"), self.hp.moe, il)
        cb(res, moe_out, "ffn_moe_out", il)
        up = cb(res, ops.mul_mat(m.w(p + "ffn_up_shexp.weight"), cur), "ffn_up", il)
        g = cb(res, ops.mul_mat(m.w(p + "ffn_gate_shexp.weight"), cur), "ffn_gate", il)
        act = cb(res, ops.swiglu_split(g, up), "ffn_swiglu", il)
        shexp = cb(res, ops.mul_mat(m.w(p + "ffn_down_shexp.weight"), act), "ffn_down", il)
        cb(res, shexp, "ffn_shexp", il)
        shared_gate = cb(res, ops.mul_mat(m.w(p + "ffn_gate_inp_shexp.weight"), cur), "shared_expert_gate", il)
        shared_gate = cb(res, ops.sigmoid(shared_gate), "shared_expert_gate_sigmoid", il)
        shexp = cb(res, ops.mul(shexp, shared_gate), "ffn_shexp_gated", il)
        return cb(res, ops.add(moe_out, shexp), "ffn_out", il)


_SSM_KEYS = (("ssm.conv_kernel", "d_conv"), ("ssm.inner_size", "d_inner"), ("ssm.state_size", "d_state"),
             ("ssm.time_step_rank", "dt_rank"), ("ssm.group_count", "n_group"))


@final
@dataclass(frozen=True)
class Qwen35(Architecture):
    """``LLM_ARCH_QWEN35`` and, with ``experts=True``, ``LLM_ARCH_QWEN35MOE``."""

    experts: bool = False

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        E = hp.n_embd
        out = [TensorSpec("attn_norm", (E,)), TensorSpec("post_attention_norm", (E,))]
        if not hp.is_recr(il):
            hd, H = hp.n_embd_head_k, hp.n_head(il)
            out += [TensorSpec("attn_q", (E, hd * H * 2)), TensorSpec("attn_k", (E, hp.n_embd_k_gqa(il))),
                    TensorSpec("attn_v", (E, hp.n_embd_v_gqa(il))), TensorSpec("attn_output", (hd * H, E)),
                    TensorSpec("attn_q_norm", (hd,)), TensorSpec("attn_k_norm", (hd,))]
        else:
            rp = hp.recurrent
            assert rp is not None
            value_dim, conv_dim = rp.d_inner, rp.conv_channels
            nvh = rp.dt_rank
            out += [TensorSpec("attn_qkv", (E, conv_dim)), TensorSpec("attn_gate", (E, value_dim)),
                    TensorSpec("ssm_conv1d", (rp.d_conv, conv_dim), "SSM_CONV", keep_f32=True),
                    TensorSpec("ssm_dt", (nvh,), "ADD", kind="bias"), TensorSpec("ssm_a", (nvh,), "MUL", kind=""),
                    TensorSpec("ssm_beta", (E, nvh)), TensorSpec("ssm_alpha", (E, nvh)),
                    TensorSpec("ssm_norm", (rp.d_state,)), TensorSpec("ssm_out", (value_dim, E))]
        if hp.moe is None:
            out += ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up"))
        else:
            router, gate, down, up = moe_tensors(hp, il)
            fs = hp.moe.n_ff_shexp or hp.n_ff(il)
            out += [router, down, gate, up, TensorSpec("ffn_gate_inp_shexp", (E,), "MUL_MAT"),
                    TensorSpec("ffn_gate_shexp", (E, fs)), TensorSpec("ffn_up_shexp", (E, fs)),
                    TensorSpec("ffn_down_shexp", (fs, E))]
        if hp.is_nextn(il):
            # load_block_mtp's NextN tensors (embed_tokens and shared_head_head are TENSOR_NOT_REQUIRED:
            # a file without them, as the converter's, has none)
            out += [TensorSpec("nextn.eh_proj", (2 * E, E)), TensorSpec("nextn.enorm", (E,)),
                    TensorSpec("nextn.hnorm", (E,)), TensorSpec("nextn.shared_head_norm", (E,))]
        return out

    def weights(self, hp: HParams) -> list[WeightInfo]:
        """``load_arch_tensors`` creates ``output_norm`` and ``output`` right after ``token_embd``."""
        out = super().weights(hp)
        head = [w for w in out if w.name in ("output_norm.weight", "output.weight")]
        rest = [w for w in out if w.name not in ("output_norm.weight", "output.weight")]
        return [rest[0], *head, *rest[1:]]

    def graph_max_nodes(self, n_tensors: int, n_tokens: int) -> int:
        """``llama_context::graph_max_nodes`` for the recurrent hybrids: ``max(40 * n_tokens, 32 * n_tensors)``."""
        return max(40 * n_tokens, 32 * n_tensors)

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        a = self.name
        vals = {}
        for key, field_ in _SSM_KEYS:
            v = f.get(f"{a}.{key}")
            if v is None:
                raise GGUFError(f.path, f"required key is missing ({a} needs it for the gated delta net)",
                                None, f"{a}.{key}")
            vals[field_] = int(v)
        n_layer_all = int(f.get(f"{a}.block_count"))
        # NextN/MTP blocks after the trunk: n_layer() = n_layer_all - n_layer_nextn
        n_nextn = int(f.get(f"{a}.nextn_predict_layers") or 0)
        if n_nextn >= n_layer_all:
            raise GGUFError(f.path, f"n_layer_nextn must be < n_layer_all ({n_layer_all})", None,
                            f"{a}.nextn_predict_layers")
        n_layer = n_layer_all - n_nextn
        recr = f.get(f"{a}.attention.recurrent_layers")
        # the MTP blocks are never recurrent (is_recr_impl false past n_layer()): the trunk's flags are kept
        layers = tuple(bool(x) for x in _array(recr))[:n_layer] if recr is not None else \
            interval_layers(n_layer, int(f.get(f"{a}.full_attention_interval") or 4))
        sections = f.get(f"{a}.rope.dimension_sections")
        # a qwen35moe file has no feed_forward_length (llama.cpp's n_ff is 0 and nothing reads it): n_ff_exp
        n_ff = {} if f.get(f"{a}.feed_forward_length") is not None else \
            {"n_ff": int(f.get(f"{a}.expert_feed_forward_length") or 0)}
        return {**n_ff, "n_layer": n_layer, "n_layer_nextn": n_nextn, "recurrent": RecurrentParams(layers, **vals),
                "rope_sections": tuple(int(x) for x in _array(sections))[:4] if sections is not None else (0, 0, 0, 0)}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        rp = hp.recurrent
        assert rp is not None
        out: dict[str, Any] = {f"ssm.{k.split('.')[1]}": getattr(rp, fld) for k, fld in _SSM_KEYS}
        # one flag per block (get_key_or_arr over n_layer_all): the NextN/MTP blocks are not recurrent
        out["attention.recurrent_layers"] = [bool(x) for x in rp.layers] + [False] * hp.n_layer_nextn
        if hp.n_layer_nextn:
            out["nextn_predict_layers"] = hp.n_layer_nextn
        out["rope.dimension_sections"] = list(hp.rope_sections or (0, 0, 0, 0))
        if hp.moe is not None and hp.moe.n_ff_shexp:
            out["expert_shared_feed_forward_length"] = hp.moe.n_ff_shexp
        return out

    def check(self, hp: HParams) -> None:
        if hp.recurrent is None or not hp.recurrent.d_state:
            raise ToolkitError(f"{self.name} needs its recurrent layers' ssm sizes (ssm.conv_kernel, ssm.inner_size, "
                               "ssm.state_size, ssm.time_step_rank, ssm.group_count)")
        if hp.rope_sections is None:
            raise ToolkitError(f"{self.name} needs rope.dimension_sections (ggml_rope_multi)")
        if self.experts and hp.moe is None:
            raise ToolkitError(f"{self.name} needs experts: n_expert must be > 0")
        if not self.experts and hp.moe is not None:
            raise ToolkitError(f"{self.name} has a dense FFN; a model with experts is qwen35moe")
        if hp.n_embd_head_k != hp.n_embd_head_v:
            raise ToolkitError(f"{self.name} needs n_embd_head_k == n_embd_head_v (llama.cpp asserts it)")


def _array(v: Any) -> list[Any]:
    """A GGUF array key's elements (a :class:`GGUFArray` read through ``tolist``; a list as given)."""
    return v.tolist() if isinstance(v, GGUFArray) else list(v)


QWEN35 = Qwen35("qwen35", Qwen35GraphBuilder, ROPE_TYPE_IMROPE, qk_norm=True, memory=MEMORY_HYBRID)
QWEN35MOE = Qwen35("qwen35moe", Qwen35GraphBuilder, ROPE_TYPE_IMROPE, qk_norm=True, memory=MEMORY_HYBRID,
                   experts=True)
ARCHITECTURES = (QWEN35, QWEN35MOE)

__all__ = ["ARCHITECTURES", "QWEN35", "QWEN35MOE", "Qwen35", "Qwen35GraphBuilder"]
