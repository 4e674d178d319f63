"""``lfm2`` (``src/models/lfm2.cpp``): LFM2's short-convolution hybrid on ``llama_memory_hybrid``.

- keys (:meth:`Lfm2.read_hparams`): ``shortconv.l_cache``; a layer is recurrent when its
  ``attention.head_count_kv`` is 0 (``is_recr``), which ``llama_memory_hybrid``'s default filters
  follow; its state is the convolution's ``n_embd * (l_cache - 1)`` values and a zero-sized S;
- per layer (``load_arch_tensors``' order, the file's): ``ffn_norm``, ``ffn_gate``, ``ffn_down``,
  ``ffn_up``, ``attn_norm``, then ``attn_q_norm``, ``attn_k_norm``, Q/K/V, ``attn_output`` (attention) or
  ``shortconv.conv``, ``shortconv.in_proj``, ``shortconv.out_proj``; the final norm is
  ``token_embd_norm`` (``LLM_TENSOR_OUTPUT_NORM_LFM2``), written after ``token_embd``; the output is tied
  unless the file has ``output``;
- RoPE NEOX; the default ``graph_max_nodes``. Experts (LFM2-MoE) and a sliding window are refused.

The graph: per layer ``operator_norm``, the short-conv block (``in_proj`` split in three chunks b, c,
x; ``build_rs`` reads the state and expands at once; CONCAT, the last ``l_cache - 1`` columns written
back, ``SSM_CONV``, ``c * conv``, ``out_proj``) or QK-norm attention, the residual, ``ffn_norm``, the
dense SwiGLU and ``l_out``. The names are llama.cpp's own ``"model.layers.{}.…-<il>"`` (the braces are
printed as they are), and ``cb(ffn_norm_out, "…ffn_out")`` renames the norm, not the FFN's output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, final

from toolkit.errors import GGUFError, ToolkitError, UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.models.archs.base import ROPE_TYPE_NEOX, Architecture, TensorSpec, ffn_tensors
from toolkit.models.gguf_file import get_key_or_arr
from toolkit.models.graph import GraphResult
from toolkit.models.hparams import HParams, WeightInfo
from toolkit.models.hybrid import HybridGraphBuilder
from toolkit.models.inputs import InputAttnKV, InputRS
from toolkit.models.memory import MEMORY_HYBRID
from toolkit.models.ssm import RecurrentParams

if TYPE_CHECKING:
    from toolkit.models.gguf_file import GGUFFile

OUTPUT_NORM = "token_embd_norm.weight"   # LLM_TENSOR_OUTPUT_NORM_LFM2


def _n(name: str) -> str:
    return f"model.layers.{{}}.{name}"


class Lfm2GraphBuilder(HybridGraphBuilder):
    """``llama_model_lfm2::graph<false>`` (no sliding window)."""

    def build_layers(self, res: GraphResult) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        cur = cb(res, self.build_inp_embd(res), "model.embed_tokens", -1)
        res.graph.build_forward_expand(cur)
        inp = self.build_inp_mem_hybrid(res)
        inp_pos = self.build_inp_pos(res)
        out_ids = self.build_inp_out_ids(res)
        for il in range(hp.n_layer):
            p = f"blk.{il}."
            prev = cur
            cur = cb(res, self.build_norm(res, cur, m.w(p + "attn_norm.weight"), il), _n("operator_norm"), il)
            if hp.is_recr(il):
                cur = self.build_shortconv_block(res, inp.rs, cur, il)
            else:
                cur = self.build_attn_block(res, inp.attn, cur, inp_pos, il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                prev = ops.get_rows(prev, out_ids)
            cur = ops.add(prev, cur)
            ffn_norm_out = cb(res, self.build_norm(res, cur, m.w(p + "ffn_norm.weight"), il), _n("ffn_norm"), il)
            ffn_out = self.build_dense_ffn(res, il, ffn_norm_out)
            cb(res, ffn_norm_out, _n("ffn_out"), il)
            cur = cb(res, ops.add(cur, ffn_out), "l_out", il)
        return cur

    def build_output_norm(self, res: GraphResult, cur: Tensor) -> Tensor:
        cur = self.build_norm(res, cur, self.model.w(OUTPUT_NORM), -1)
        return self.cb(res, cur, "result_norm", -1)

    def build_dense_ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """``build_ffn(up, gate, down, LLM_FFN_SILU, LLM_FFN_PAR)``; the down projection keeps no name."""
        p = f"blk.{il}."
        m, cb = self.model, self.cb
        up = cb(res, ops.mul_mat(m.w(p + "ffn_up.weight"), cur), "ffn_up", il)
        gate = cb(res, ops.mul_mat(m.w(p + "ffn_gate.weight"), cur), "ffn_gate", il)
        act = cb(res, ops.swiglu_split(gate, up), "ffn_swiglu", il)
        return ops.mul_mat(m.w(p + "ffn_down.weight"), act)

    def build_attn_block(self, res: GraphResult, inp: InputAttnKV, cur: Tensor, inp_pos: Tensor, il: int) -> Tensor:
        m, cb = self.model, self.cb
        p = f"blk.{il}."
        q, k, v = self.qkv(res, il, cur)
        q = cb(res, self.build_norm(res, q, m.w(p + "attn_q_norm.weight"), il), _n("self_attn.q_layernorm"), il)
        k = cb(res, self.build_norm(res, k, m.w(p + "attn_k_norm.weight"), il), _n("self_attn.k_layernorm"), il)
        q = self.rope(q, inp_pos, il)
        k = self.rope(k, inp_pos, il)
        cur = self.build_attn(res, inp, m.w(p + "attn_output.weight"), None, q, k, v, None, None, None,
                              1.0 / math.sqrt(self.hp.n_embd_head_v), il)
        return cb(res, cur, _n("self_attn.out_proj"), il)

    def build_shortconv_block(self, res: GraphResult, inp: InputRS, cur: Tensor, il: int) -> Tensor:
        hp, m, cb = self.hp, self.model, self.cb
        rp = hp.recurrent
        assert rp is not None
        p = f"blk.{il}."
        rs, n_seqs = inp.rs, res.n_seqs
        n_seq_tokens = res.n_tokens // n_seqs
        d_conv = rp.shortconv_l_cache - 1
        cur = ops.reshape_3d(cur, cur.ne[0], n_seq_tokens, n_seqs)
        bcx = cb(res, ops.mul_mat(m.w(p + "shortconv.in_proj.weight"), cur), _n("conv.in_proj"), il)
        chunk = bcx.ne[0] // 3
        es = bcx.type.row_size(1)
        b, c, x = (ops.view_3d(bcx, chunk, bcx.ne[1], bcx.ne[2], bcx.nb[1], bcx.nb[2], i * chunk * es)
                   for i in range(3))
        bx = ops.transpose(ops.mul(b, x))
        conv_state = rs.r_of(il)
        conv_rs = self.build_rs(res, inp, conv_state, hp.n_embd_r(), n_seqs)
        conv = ops.reshape_3d(conv_rs, d_conv, hp.n_embd, n_seqs)
        bx = ops.concat(conv, bx, 0)
        row_size = conv_state.type.row_size(d_conv * hp.n_embd)
        snap = ops.view_3d(bx, d_conv, bx.ne[1], bx.ne[2], bx.nb[1], bx.nb[2],
                           (bx.ne[0] - d_conv) * bx.type.row_size(1))
        res.graph.build_forward_expand(ops.cpy(snap, ops.view_2d(conv_state, d_conv * hp.n_embd, n_seqs,
                                                                 conv_state.nb[1], rs.head * row_size)))
        conv_out = cb(res, ops.ssm_conv(bx, m.w(p + "shortconv.conv.weight")), _n("conv.conv"), il)
        y = ops.mul(c, conv_out)
        y = cb(res, ops.mul_mat(m.w(p + "shortconv.out_proj.weight"), y), _n("conv.out_proj"), il)
        return ops.reshape_2d(y, y.ne[0], n_seq_tokens * n_seqs)


@final
@dataclass(frozen=True)
class Lfm2(Architecture):
    """``LLM_ARCH_LFM2``."""

    def layer_tensors(self, hp: HParams, il: int) -> list[TensorSpec]:
        E = hp.n_embd
        out = [TensorSpec("ffn_norm", (E,)), *ffn_tensors(hp, il, ("ffn_gate", "ffn_down", "ffn_up")),
               TensorSpec("attn_norm", (E,))]
        if not hp.is_recr(il):
            hd = hp.n_embd_head_k
            return out + [TensorSpec("attn_q_norm", (hd,)), TensorSpec("attn_k_norm", (hd,)),
                          TensorSpec("attn_q", (E, E)), TensorSpec("attn_k", (E, hp.n_embd_k_gqa(il))),
                          TensorSpec("attn_v", (E, hp.n_embd_v_gqa(il))), TensorSpec("attn_output", (E, E))]
        rp = hp.recurrent
        assert rp is not None
        return out + [TensorSpec("shortconv.conv", (rp.shortconv_l_cache, E), "SSM_CONV", keep_f32=True),
                      TensorSpec("shortconv.in_proj", (E, 3 * E)), TensorSpec("shortconv.out_proj", (E, E))]

    def weights(self, hp: HParams) -> list[WeightInfo]:
        """The final norm is ``token_embd_norm``, right after ``token_embd`` (the file's order)."""
        out = super().weights(hp)
        norm = next(w for w in out if w.name == "output_norm.weight")
        rest = [w for w in out if w is not norm]
        return [rest[0], WeightInfo(OUTPUT_NORM, norm.ne, norm.type, norm.layer, norm.op), *rest[1:]]

    def read_hparams(self, f: GGUFFile) -> dict[str, Any]:
        a = self.name
        lc = f.get(f"{a}.shortconv.l_cache")
        if lc is None:
            raise GGUFError(f.path, "required key is missing (lfm2's short convolution)", None,
                            f"{a}.shortconv.l_cache")
        if f.get(f"{a}.expert_count"):
            raise UnsupportedFeature("lfm2 experts", "LFM2-MoE's experts are not built")
        n_layer = f.require_int(f.arch_key("block_count"))
        kv = get_key_or_arr(f, "attention.head_count_kv", n_layer, 0)
        kvs = list(kv) if isinstance(kv, tuple) else [int(kv or 0)] * n_layer
        return {"recurrent": RecurrentParams(tuple(k == 0 for k in kvs), shortconv_l_cache=int(lc))}

    def gguf_keys(self, hp: HParams) -> dict[str, Any]:
        rp = hp.recurrent
        assert rp is not None
        return {"shortconv.l_cache": rp.shortconv_l_cache}

    def check(self, hp: HParams) -> None:
        rp = hp.recurrent
        if rp is None or not rp.shortconv_l_cache:
            raise ToolkitError("lfm2 needs shortconv.l_cache and its convolution layers (head_count_kv 0)")
        for il in range(hp.n_layer):
            if rp.is_recr(il) != (hp.n_head_kv(il) == 0):
                raise ToolkitError(f"lfm2 layer {il}: a layer is recurrent exactly when its head_count_kv is 0")
        if hp.moe is not None:
            raise UnsupportedFeature("lfm2 experts", "LFM2-MoE's experts are not built")
        if hp.swa is not None:
            raise UnsupportedFeature("hybrid iSWA memory", "LFM2 with a sliding window (llama_memory_hybrid_iswa) "
                                     "is not built")


LFM2 = Lfm2("lfm2", Lfm2GraphBuilder, ROPE_TYPE_NEOX, qk_norm=True, memory=MEMORY_HYBRID)
ARCHITECTURES = (LFM2,)

__all__ = ["ARCHITECTURES", "LFM2", "Lfm2", "Lfm2GraphBuilder"]
