"""llama.cpp's llama graph (``llm_build_llama`` + ``llm_graph_context`` helpers), node for node.

The builder reproduces the tensors llama.cpp creates, their names (the graph callback's
``"<name>-<il>"``), their sources and the explicit ``ggml_build_forward_expand`` calls that
fix the node order: Q, V, K are expanded before the KV-cache writes so they are not
reordered (``build_attn``); the input embedding is materialised first, with the unused
vector-embedding input expanded beside it (``ggml_build_forward_select``).

Per layer: ``norm``/``attn_norm``, Q/K/V matmuls, reshapes and RoPE, ``cpy_k``/``cpy_v``
(SET_ROWS into views of the cache), the KV views and permutes, then flash attention
(one FLASH_ATTN_EXT and a reshape) or KQ → softmax → KQV → permute → cont, the output
projection, the residual, ``ffn_norm``, the SWIGLU FFN and ``l_out``. The last layer keeps
only the output rows (GET_ROWS with ``inp_out_ids``) before its FFN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from toolkit.ggml import ops
from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import F16, F32, I32, GGMLType
from toolkit.models.loader import KVCache, LoadedModel
from toolkit.models.moe import build_moe_ffn

I64 = GGMLType.I64
ROPE_TYPE_NORM = 0


@dataclass
class LlamaGraph:
    """A built graph and what llama.cpp's callback and probes need to know about it."""

    graph: Graph
    n_tokens: int
    n_seqs: int
    n_outputs: int
    flash_attn: bool
    norms: list[tuple[Tensor, int]] = field(default_factory=list)      # ("norm", il) tensors for the norm pin
    named: list[tuple[Tensor, str, int]] = field(default_factory=list)  # every (tensor, name, il) the callback saw
    fa_nodes: list[tuple[Tensor, int]] = field(default_factory=list)   # FLASH_ATTN_EXT per layer (FA auto probe)
    inputs: dict[str, Tensor] = field(default_factory=dict)
    logits: Tensor | None = None
    embd: Tensor | None = None


class LlamaGraphBuilder:
    """Builds the graph for one ubatch shape over a loaded model and its KV cache."""

    def __init__(self, model: LoadedModel, kv: KVCache, *, flash_attn: bool, graph_size: int) -> None:
        self.model = model
        self.hp = model.hparams
        self.kv = kv
        self.flash_attn = flash_attn
        self.graph_size = graph_size

    # the graph callback's naming (llama_context::graph_get_cb); pins are applied by the context
    def _cb(self, res: LlamaGraph, t: Tensor, name: str, il: int) -> Tensor:
        t.name = f"{name}-{il}" if il >= 0 else name
        res.named.append((t, name, il))
        if name == "norm" and il >= 0:
            res.norms.append((t, il))
        return t

    def build(self, n_tokens: int, n_seqs: int, n_outputs: int) -> LlamaGraph:
        if n_tokens <= 0 or n_seqs <= 0:
            raise ValueError(f"a ubatch needs n_tokens >= 1 and n_seqs >= 1, got {n_tokens} and {n_seqs}")
        hp, kv, m = self.hp, self.kv, self.model
        gf = Graph(self.graph_size)
        res = LlamaGraph(gf, n_tokens, n_seqs, n_outputs, self.flash_attn)
        cb = self._cb
        E, H = hp.n_embd, hp.n_embd_head
        n_kv = kv.kv_size           # a reserve uses the full cache (memory->init_full)
        n_stream = kv.n_stream

        # build_inp_embd: the token path is selected; the vector-embedding input is still added
        tokens = ops.new_tensor_1d(I32, n_tokens, "inp_tokens").set_input()
        inp_embd = ops.new_tensor_2d(F32, E, n_tokens, "inp_embd").set_input()
        cur = ops.get_rows(m.w("token_embd.weight"), tokens)
        gf.build_forward_expand(cur)
        gf.build_forward_expand(inp_embd)
        cb(res, cur, "embd", -1)
        inpL = cur
        res.inputs.update(inp_tokens=tokens, inp_embd=inp_embd)

        inp_pos = ops.new_tensor_1d(I32, n_tokens).set_input()
        # build_attn_inp_kv
        k_idxs = ops.new_tensor_1d(I64, n_tokens).set_input()
        v_idxs = ops.new_tensor_1d(I64, n_tokens * (hp.n_embd_v_gqa if kv.v_trans else 1)).set_input()
        mask_type = F16 if self.flash_attn else F32
        kq_mask = ops.new_tensor_4d(mask_type, n_kv, n_tokens // n_stream, 1, n_stream, "attn_inp_kq_mask")
        kq_mask.set_input()
        out_ids = ops.new_tensor_1d(I32, n_outputs).set_input()
        res.inputs.update(inp_pos=inp_pos, k_idxs=k_idxs, v_idxs=v_idxs, kq_mask=kq_mask, inp_out_ids=out_ids)
        kq_scale = 1.0 / math.sqrt(float(H))

        for il in range(hp.n_layer):
            p = f"blk.{il}."
            inpSA = inpL
            cur = self._norm(res, inpL, m.w(p + "attn_norm.weight"), il)
            cb(res, cur, "attn_norm", il)
            q = cb(res, ops.mul_mat(m.w(p + "attn_q.weight"), cur), "Qcur", il)
            k = cb(res, ops.mul_mat(m.w(p + "attn_k.weight"), cur), "Kcur", il)
            v = cb(res, ops.mul_mat(m.w(p + "attn_v.weight"), cur), "Vcur", il)
            q = cb(res, ops.reshape_3d(q, H, hp.n_head, n_tokens), "Qcur", il)
            k = cb(res, ops.reshape_3d(k, H, hp.n_head_kv, n_tokens), "Kcur", il)
            v = cb(res, ops.reshape_3d(v, H, hp.n_head_kv, n_tokens), "Vcur", il)
            q = self._rope(q, inp_pos)
            k = self._rope(k, inp_pos)
            cb(res, q, "Qcur", il)
            cb(res, k, "Kcur", il)
            cb(res, v, "Vcur", il)
            cur = self._attn(res, il, q, k, v, k_idxs, v_idxs, kq_mask, kq_scale)
            cur = ops.mul_mat(m.w(p + "attn_output.weight"), cur)
            cb(res, cur, "attn_out", il)
            if il == hp.n_layer - 1:
                cur = ops.get_rows(cur, out_ids)
                inpSA = ops.get_rows(inpSA, out_ids)
            ffn_inp = cb(res, ops.add(cur, inpSA), "ffn_inp", il)
            cur = self._norm(res, ffn_inp, m.w(p + "ffn_norm.weight"), il)
            cb(res, cur, "ffn_norm", il)
            if hp.moe is not None:
                cur = build_moe_ffn(gf, lambda t, name, i: cb(res, t, name, i), cur, m.w(p + "ffn_gate_inp.weight"),
                                    m.w(p + "ffn_up_exps.weight"), m.w(p + "ffn_gate_exps.weight"),
                                    m.w(p + "ffn_down_exps.weight"), hp.moe, il)
            else:
                # build_ffn(LLM_FFN_SILU, LLM_FFN_PAR): up, gate, swiglu(gate, up), down
                tmp = cb(res, ops.mul_mat(m.w(p + "ffn_up.weight"), cur), "ffn_up", il)
                cur = cb(res, ops.mul_mat(m.w(p + "ffn_gate.weight"), cur), "ffn_gate", il)
                cur = cb(res, ops.swiglu_split(cur, tmp), "ffn_swiglu", il)
                cur = cb(res, ops.mul_mat(m.w(p + "ffn_down.weight"), cur), "ffn_down", il)
                cb(res, cur, "ffn_out", il)
            cur = cb(res, ops.add(cur, ffn_inp), "l_out", il)
            inpL = cur

        cur = self._norm(res, inpL, m.w("output_norm.weight"), -1)
        cb(res, cur, "result_norm", -1)
        res.embd = cur
        assert m.output is not None
        cur = cb(res, ops.mul_mat(m.output, cur), "result_output", -1)
        res.logits = cur
        gf.build_forward_expand(cur)
        # llm_graph_result::set_outputs: logits and embeddings are graph outputs
        res.logits.set_output()
        res.embd.set_output()
        return res

    # ---- helpers (llm_graph_context) --------------------------------------------------------
    def _norm(self, res: LlamaGraph, x: Tensor, w: Tensor, il: int) -> Tensor:
        cur = self._cb(res, ops.rms_norm(x, self.hp.eps), "norm", il)
        return ops.mul(cur, w)

    def _rope(self, x: Tensor, pos: Tensor) -> Tensor:
        hp = self.hp
        return ops.rope_ext(x, pos, None, hp.n_rot, ROPE_TYPE_NORM, hp.n_ctx_train, hp.rope_freq_base)

    def _attn(self, res: LlamaGraph, il: int, q: Tensor, k_cur: Tensor, v_cur: Tensor, k_idxs: Tensor,
              v_idxs: Tensor, kq_mask: Tensor, kq_scale: float) -> Tensor:
        gf = res.graph
        # build_attn: expand Q, V, K together so they are not reordered (fewer splits)
        gf.build_forward_expand(q)
        gf.build_forward_expand(v_cur)
        gf.build_forward_expand(k_cur)
        gf.build_forward_expand(self._cpy_k(k_cur, k_idxs, il))
        gf.build_forward_expand(self._cpy_v(v_cur, v_idxs, il))
        k = self._get_k(il)
        v = self._get_v(il)
        cur = self._attn_mha(res, il, q, k, v, kq_mask, kq_scale)
        self._cb(res, cur, "kqv_out", il)
        return cur

    def _cpy_k(self, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        k = self.kv.k[il]
        n_embd_gqa = k_cur.ne[0] * k_cur.ne[1]
        k_view = ops.view_2d(k_cur, n_embd_gqa, k_cur.ne[2], k_cur.nb[2], 0)
        if k.ne[2] > 1:  # merge the streams: the idxs are global
            k = ops.reshape_2d(k, n_embd_gqa, k.ne[1] * k.ne[2])
        return ops.set_rows(k, k_view, k_idxs)

    def _cpy_v(self, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        v = self.kv.v[il]
        n_embd_gqa = v_cur.ne[0] * v_cur.ne[1]
        n_tokens = v_cur.ne[2]
        if not self.kv.v_trans:
            v_view = ops.view_2d(v_cur, n_embd_gqa, n_tokens, v_cur.nb[2], 0)
            if v.ne[2] > 1:
                v = ops.reshape_2d(v, v.ne[0], v.ne[1] * v.ne[2])
            return ops.set_rows(v, v_view, v_idxs)
        # transposed V: every element is its own row
        v_cur2 = ops.reshape_2d(v_cur, n_embd_gqa, n_tokens)
        v_rows = ops.reshape_2d(v, 1, v.ne[0] * v.ne[1] * v.ne[2])
        v_cur2 = ops.reshape_2d(v_cur2, 1, v_cur2.nelements)
        return ops.set_rows(v_rows, v_cur2, v_idxs)

    def _get_k(self, il: int) -> Tensor:
        k = self.kv.k[il]
        hp = self.hp
        t = k.type
        H, n_kv, ns = hp.n_embd_head, self.kv.kv_size, self.kv.n_stream
        return ops.view_4d(k, H, hp.n_head_kv, n_kv, ns, t.row_size(H), t.row_size(k.ne[0]),
                           t.row_size(k.ne[0] * n_kv), 0)

    def _get_v(self, il: int) -> Tensor:
        v = self.kv.v[il]
        hp = self.hp
        t = v.type
        H, n_kv, ns = hp.n_embd_head, self.kv.kv_size, self.kv.n_stream
        if not self.kv.v_trans:
            return ops.view_4d(v, H, hp.n_head_kv, n_kv, ns, t.row_size(H), t.row_size(v.ne[0]),
                               t.row_size(v.ne[0] * n_kv), 0)
        return ops.view_4d(v, n_kv, hp.n_head_kv, H, ns, t.row_size(n_kv * H), t.row_size(n_kv),
                           t.row_size(n_kv * v.ne[0]), 0)

    def _attn_mha(self, res: LlamaGraph, il: int, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor,
                  kq_scale: float) -> Tensor:
        cb = self._cb
        v_trans = v.nb[1] > v.nb[2]
        n_stream = k.ne[3]
        q = ops.view_4d(q, q.ne[0], q.ne[1], q.ne[2] // n_stream, n_stream, q.nb[1], q.nb[2],
                        q.nb[3] // n_stream, 0)
        q = ops.permute(q, 0, 2, 1, 3)
        k = ops.permute(k, 0, 2, 1, 3)
        v = ops.permute(v, 0, 2, 1, 3)
        if self.flash_attn:
            if v_trans:
                v = ops.transpose(v)
            cur = ops.flash_attn_ext(q, k, v, kq_mask, kq_scale, 0.0, 0.0)
            res.fa_nodes.append((cur, il))
            cur = ops.reshape_2d(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = cb(res, ops.mul_mat(k, q), "kq", il)
            kq = cb(res, ops.soft_max_ext(kq, kq_mask, kq_scale, 0.0), "kq_soft_max", il)
            if not v_trans:
                v = cb(res, ops.cont(ops.transpose(v)), "v_cont", il)
            kqv = cb(res, ops.mul_mat(v, kq), "kqv", il)
            cur = ops.permute(kqv, 0, 2, 1, 3)
            cur = ops.cont_2d(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            # the callback (llama_context::graph_get_cb) sees the merged heads first: with -nkvo it pins this
            # node to the CPU
            cb(res, cur, "kqv_merged_cont", il)
        res.graph.build_forward_expand(cur)
        return cur
