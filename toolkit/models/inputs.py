"""Graph inputs that fill themselves (``llm_graph_input_*`` of llama-graph.h), in numpy.

The builder creates one object per input (``build_inp_embd``, ``build_inp_pos``,
``build_inp_out_ids``, ``build_attn_inp_kv``, ``build_attn_inp_k``, ``build_attn_inp_kv_iswa``) and keeps them in the
graph's :attr:`~toolkit.models.graph.GraphResult.inputs`, in creation order. A runtime computes
every input's values by looping over them: ``set_input(ubatch)`` returns ``{tensor: values}``,
as ``llm_graph_input_i::set_input`` writes into the tensors' host buffers. The attention inputs
read the cache's cells and the slot :meth:`toolkit.models.memory.Memory.apply_ubatch` found.

>>> import numpy as np
>>> from toolkit.ggml import ops, I32
>>> from toolkit.models.memory import UBatch
>>> inp = InputPos(ops.new_tensor_1d(I32, 3))
>>> inp.set_input(UBatch.of_sequence([7, 8, 9], pos0=4))[inp.pos].tolist()
[4, 5, 6]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from toolkit.ggml.tensor import Tensor
from toolkit.models.memory import KVCache, UBatch
from toolkit.models.memory_recurrent import RecurrentMemory

if TYPE_CHECKING:
    import numpy as np


@dataclass(eq=False)
class GraphInput:
    """``llm_graph_input_i``: an input's tensors (the dataclass fields that are tensors) and their values."""

    def tensors(self) -> list[Tensor]:
        """This input's tensors, in field order."""
        out: list[Tensor] = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                out.append(v)
            elif isinstance(v, GraphInput):
                out += v.tensors()
        return out

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        raise NotImplementedError

    def copy(self, cp: Callable[[Tensor], Tensor], memory: Mapping[int, object] | None = None) -> GraphInput:
        """The same input over a graph copy's tensors (``cp`` maps a tensor to its copy); caches are shared,
        or with ``memory`` (id of a cache or recurrent state -> another setup's) replaced: KeyError for a
        field that holds an object ``memory`` does not map."""
        changes: dict[str, object] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Tensor):
                changes[f.name] = cp(v)
            elif isinstance(v, GraphInput):
                changes[f.name] = v.copy(cp, memory)
            elif memory is not None and not isinstance(v, (int, float, str, type(None))):
                changes[f.name] = memory[id(v)]
        return dataclasses.replace(self, **changes)


@dataclass(eq=False)
class InputEmbd(GraphInput):
    """``llm_graph_input_embd``: the token ids (the token path); the vector-embedding input is in the
    graph too but a ubatch of tokens leaves it unset."""

    tokens: Tensor
    embd: Tensor

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        import numpy as np
        return {self.tokens: ub.tokens.astype(np.int32)}


@dataclass(eq=False)
class InputPos(GraphInput):
    """``llm_graph_input_pos``: one position per token, or ``n_pos`` (M-RoPE's 4, ``n_pos_per_embd``): for
    text the token's position three times, then 0 (each a run of n_tokens values)."""

    pos: Tensor
    n_pos: int = 1

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        import numpy as np
        p = ub.pos.astype(np.int32)
        if self.n_pos == 1:
            return {self.pos: p}
        return {self.pos: np.concatenate([p] * (self.n_pos - 1) + [np.zeros_like(p)] * (self.n_pos >= 4))}


@dataclass(eq=False)
class InputOutIds(GraphInput):
    """``llm_graph_input_out_ids``: the rows that output (all of them when every token outputs)."""

    out_ids: Tensor

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        import numpy as np
        n_outputs = self.out_ids.ne[0]
        if n_outputs == ub.n_tokens:
            return {self.out_ids: np.arange(n_outputs, dtype=np.int32)}
        rows = np.flatnonzero(ub.output).astype(np.int32)
        if len(rows) != n_outputs:
            raise ValueError(f"the ubatch marks {len(rows)} output rows, the graph was built for {n_outputs}")
        return {self.out_ids: rows}


@dataclass(eq=False)
class InputAttnKV(GraphInput):
    """``llm_graph_input_attn_kv``: one cache's write indices and mask (``self_k_idxs``,
    ``self_v_idxs``, ``self_kq_mask``)."""

    cache: KVCache
    k_idxs: Tensor
    v_idxs: Tensor
    kq_mask: Tensor
    causal: bool = True

    def layer_input(self, il: int) -> InputAttnKV:
        """The inputs layer il attends through (this one)."""
        return self

    def expand_order(self, k_cur: Tensor, v_cur: Tensor) -> tuple[Tensor, Tensor]:
        """What ``build_attn`` expands after Q: V, then K (K later, for the RoPE fusion into the cache)."""
        return v_cur, k_cur

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        c = self.cache
        return {self.k_idxs: c.set_input_k_idxs(ub), self.v_idxs: c.set_input_v_idxs(ub),
                self.kq_mask: c.set_input_kq_mask(self.kq_mask, ub, self.causal)}


@dataclass(eq=False)
class InputAttnK(GraphInput):
    """``llm_graph_input_attn_k``: the write indices and mask of a K-only cache (MLA: no V, so no
    ``self_v_idxs``)."""

    cache: KVCache
    k_idxs: Tensor
    kq_mask: Tensor
    causal: bool = True

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        c = self.cache
        return {self.k_idxs: c.set_input_k_idxs(ub), self.kq_mask: c.set_input_kq_mask(self.kq_mask, ub, self.causal)}


@dataclass(eq=False)
class InputAttnKVISWA(GraphInput):
    """``llm_graph_input_attn_kv_iswa``: the non-SWA cache's inputs and the SWA cache's (``*_swa``)."""

    base: InputAttnKV
    swa: InputAttnKV

    def layer_input(self, il: int) -> InputAttnKV:
        """The inputs of the cache that holds layer il (``build_attn`` picks them by ``is_swa(il)``)."""
        return self.swa if self.swa.cache.holds(il) else self.base

    def expand_order(self, k_cur: Tensor, v_cur: Tensor) -> tuple[Tensor, Tensor]:
        """What the iSWA ``build_attn`` expands after Q: K, then V."""
        return k_cur, v_cur

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        return {**self.base.set_input(ub), **self.swa.set_input(ub)}


@dataclass(eq=False)
class InputRS(GraphInput):
    """``llm_graph_input_rs``: ``s_copy`` (``n_rs`` I32, which cell each state is read from) and its two
    views, ``s_copy_main`` (the ubatch's ``n_seqs`` states) and ``s_copy_extra`` (the rest)."""

    rs: RecurrentMemory
    s_copy: Tensor
    s_copy_main: Tensor
    s_copy_extra: Tensor

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        """The cell each state is read from (``llama_memory_recurrent_context::s_copy``): a sequence's own,
        or the cleared cell ``rs_z`` for a sequence that starts."""
        import numpy as np
        del ub
        return {self.s_copy: np.asarray(self.rs.s_copy()[:self.s_copy.ne[0]], dtype=np.int32)}


@dataclass(eq=False)
class InputMemHybrid(GraphInput):
    """``llm_graph_input_mem_hybrid``: the attention layers' KV inputs and the recurrent layers' ``s_copy``."""

    attn: InputAttnKV
    rs: InputRS

    def layer_input(self, il: int) -> InputAttnKV:
        return self.attn

    def expand_order(self, k_cur: Tensor, v_cur: Tensor) -> tuple[Tensor, Tensor]:
        return self.attn.expand_order(k_cur, v_cur)

    def set_input(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        return {**self.rs.set_input(ub), **self.attn.set_input(ub)}
