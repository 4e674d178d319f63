"""The graph blocks of hybrid models (``llm_graph_context::build_inp_mem_hybrid`` / ``build_rs`` and
``llm_build_delta_net_base``), node for node.

- :meth:`HybridGraphBuilder.build_inp_mem_hybrid`: ``s_copy`` (``n_rs`` I32) with its views
  ``s_copy_main`` / ``s_copy_extra``, then the attention layers' KV inputs;
- :meth:`HybridGraphBuilder.build_rs`: read a layer's states: the SCALE by 0 of cell ``rs_z`` (a view,
  zero-sized when no cell is cleared), GET_ROWS of the ubatch's states, GET_ROWS + CPY of the others;
- :meth:`HybridGraphBuilder.build_conv_state`: the convolution state prepended to the projected
  input (CONCAT) and its last ``d_conv - 1`` columns written back (CPY), ``n_rs_seq`` 0;
- :meth:`HybridGraphBuilder.build_recurrent_attn`: the fused ``GATED_DELTA_NET`` (llama.cpp keeps the
  fused path where ``resolve_fused_ops`` finds the op supported, which the measured CPU and RPC
  devices all do) and the new state written back.
"""

from __future__ import annotations

from toolkit.ggml import ops
from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import I32
from toolkit.models.graph import GraphBuilder, GraphResult
from toolkit.models.inputs import InputMemHybrid, InputRS
from toolkit.models.memory_recurrent import RecurrentMemory


class HybridGraphBuilder(GraphBuilder):
    """A :class:`GraphBuilder` over ``llama_memory_hybrid`` (its memory has :attr:`recurrent` states)."""

    @property
    def rs_mem(self) -> RecurrentMemory:
        rs = self.memory.recurrent
        if rs is None:
            raise ValueError(f"a hybrid graph needs llama_memory_hybrid's memory, this one is {self.memory.kind!r}")
        return rs

    def build_inp_mem_hybrid(self, res: GraphResult) -> InputMemHybrid:
        """``build_inp_mem_hybrid``: ``build_rs_inp_impl`` then ``build_attn_inp_kv_impl``."""
        rs = self.rs_mem
        n_rs, n_seqs = rs.n_rs, res.n_seqs
        s_copy = ops.new_tensor_1d(I32, n_rs).set_input()
        main = ops.view_1d(s_copy, n_seqs, 0)
        extra = ops.view_1d(s_copy, n_rs - n_seqs, n_seqs * s_copy.nb[0])
        inp = InputMemHybrid(self._attn_inp(res, self.memory.caches[0]), InputRS(rs, s_copy, main, extra))
        res.inputs.append(inp)
        return inp

    def build_rs(self, res: GraphResult, inp: InputRS, s: Tensor, state_size: int, n_seqs: int) -> Tensor:
        """``llm_graph_context::build_rs`` with ``ggml_get_rows`` as ``get_state_rows``."""
        gf, rs = res.graph, inp.rs
        states = ops.reshape_2d(s, state_size, s.ne[1])
        z = rs.rs_z >= 0
        state_zero = ops.view_1d(states, state_size * z, rs.rs_z * states.nb[1] * z)
        gf.build_forward_expand(ops.scale_inplace(state_zero, 0.0))
        output_states = ops.get_rows(states, inp.s_copy_main)
        gf.build_forward_expand(output_states)
        states_extra = ops.get_rows(states, inp.s_copy_extra)
        gf.build_forward_expand(ops.cpy(states_extra, ops.view_2d(s, state_size, rs.n_rs - n_seqs, s.nb[1],
                                                                  (rs.head + n_seqs) * s.nb[1])))
        return output_states

    def build_conv_state(self, res: GraphResult, inp: InputRS, conv_states_all: Tensor, qkv_mixed: Tensor,
                         conv_kernel_size: int, conv_channels: int, il: int) -> Tensor:
        """``llm_build_delta_net_base::build_conv_state`` (``n_rs_seq == 0``): returns ``conv_input``."""
        cb, rs, n_seqs = self.cb, inp.rs, res.n_seqs
        conv_states = cb(res, self.build_rs(res, inp, conv_states_all, self.hp.n_embd_r(), n_seqs), "conv_states", il)
        conv_states = cb(res, ops.reshape_3d(conv_states, conv_kernel_size - 1, conv_channels, n_seqs),
                         "conv_states_reshaped", il)
        qkv_mixed = cb(res, ops.transpose(qkv_mixed), "qkv_mixed_transposed", il)
        conv_input = cb(res, ops.concat(conv_states, qkv_mixed, 0), "conv_input", il)
        row_count = (conv_kernel_size - 1) * conv_channels
        row_size = conv_states_all.type.row_size(row_count)
        s_idx = conv_input.ne[0] - conv_states.ne[0]
        last = cb(res, ops.view_3d(conv_input, conv_kernel_size - 1, conv_channels, n_seqs, conv_input.nb[1],
                                   conv_input.nb[2], conv_input.type.row_size(s_idx)), "conv_state_last", il)
        update = cb(res, ops.view_2d(conv_states_all, row_count, n_seqs, conv_states_all.nb[1], rs.head * row_size),
                    "conv_state_update", il)
        res.graph.build_forward_expand(ops.cpy(last, update))
        return conv_input

    def build_recurrent_attn(self, res: GraphResult, inp: InputRS, ssm_states_all: Tensor, q: Tensor, k: Tensor,
                             v: Tensor, g: Tensor, b: Tensor, s: Tensor, il: int) -> Tensor:
        """``build_recurrent_attn`` without rollback slots: ``build_delta_net_fused`` (one GATED_DELTA_NET,
        K = 1, its output and new-state views), the new state copied into the cache's rows."""
        S_v, H_v, n_tokens, n_seqs = v.ne
        result = ops.gated_delta_net(q, k, v, g, b, s, 1)
        t = result.type
        output = ops.view_4d(result, S_v, H_v, n_tokens, n_seqs, t.row_size(S_v), t.row_size(S_v * H_v),
                             t.row_size(S_v * H_v * n_tokens), 0)
        new_state = ops.view_4d(result, S_v, S_v, H_v, n_seqs, t.row_size(S_v), t.row_size(S_v * S_v),
                                t.row_size(S_v * S_v * H_v), t.row_size(S_v * H_v * n_tokens * n_seqs))
        self.cb(res, output, "attn_output", il)
        self.cb(res, new_state, "new_state", il)
        n_embd_s = self.hp.n_embd_s()
        dst = ops.view_2d(ssm_states_all, n_embd_s, n_seqs, ssm_states_all.nb[1],
                          inp.rs.head * n_embd_s * ssm_states_all.type.row_size(1))
        res.graph.build_forward_expand(ops.cpy(new_state, dst))
        return output
