"""The shared blocks of llama.cpp's graph builders (``llm_graph_context``), node for node.

Each architecture is a small subclass of :class:`GraphBuilder` that writes its layer loop
with these blocks, as llama.cpp's ``src/models/*.cpp`` do:

- inputs: ``build_inp_embd`` (token path selected, the vector-embedding input expanded beside
  it), ``build_inp_pos``, ``build_inp_out_ids``, the KV inputs (``build_attn_inp_kv``, or
  ``build_attn_inp_kv_iswa`` with a second set of indices and a second mask for the SWA cache;
  ``build_inp_attn`` picks the one the memory needs). Each is an object of
  :mod:`toolkit.models.inputs` kept in :attr:`GraphResult.inputs` that fills itself per ubatch;
- ``build_norm`` (RMS norm named ``norm``, times the weight);
- ``build_attn`` (llama.cpp's argument list; the input's type picks the layer's cache): the
  KV-cache writes (``cpy_k``/``cpy_v``, SET_ROWS into views of the cache), the KV views, flash
  attention (one FLASH_ATTN_EXT) or KQ → softmax → KQV (attention sinks: one more source of
  either), and the output projection; Q, V, K
  (iSWA: Q, K, V) are expanded first so they are not reordered;
- ``build_ffn``: the gated FFN (``LLM_FFN_PAR``) with SILU (SWIGLU) or GELU (GEGLU);
- :meth:`GraphBuilder.ffn` is the per-layer FFN slot an architecture calls; another FFN
  (a mixture of experts) plugs in by overriding it.

The graph callback's naming (``"<name>-<il>"``) and the tensors it records for the
scheduler pins live in :meth:`GraphBuilder.cb`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from toolkit.errors import UnsupportedFeature
from toolkit.ggml import ops
from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import Tensor, TensorFlag
from toolkit.ggml.types import F16, F32, I32
from toolkit.models.inputs import GraphInput, InputAttnK, InputAttnKV, InputAttnKVISWA, InputEmbd, InputOutIds, InputPos
from toolkit.models.loader import LoadedModel
from toolkit.models.memory import KVCache, Memory, UBatch
from toolkit.models.moe import build_moe_ffn

if TYPE_CHECKING:
    import numpy as np

In = TypeVar("In", bound=GraphInput)


@dataclass
class GraphResult:
    """A built graph and what llama.cpp's callback and probes need to know about it."""

    graph: Graph
    n_tokens: int
    n_seqs: int
    n_outputs: int
    flash_attn: bool
    # the KV streams the ubatch's sequences use, first and last (llama_kv_cache's slot_info s0..s1);
    # None: every stream (what a reserve builds)
    streams: tuple[int, int] | None = None
    norms: list[tuple[Tensor, int]] = field(default_factory=list)      # ("norm", il) tensors for the norm pin
    named: list[tuple[Tensor, str, int]] = field(default_factory=list)  # every (tensor, name, il) the callback saw
    fa_nodes: list[tuple[Tensor, int]] = field(default_factory=list)   # FLASH_ATTN_EXT per layer (FA auto probe)
    inputs: list[GraphInput] = field(default_factory=list)   # llm_graph_result::inputs, in creation order
    logits: Tensor | None = None
    embd: Tensor | None = None
    # llm_graph_result::t_h_nextn: the last layer's output before the output rows are picked (gpt-oss
    # and the MTP architectures set it); set_outputs makes it a graph output, so it is never freed
    h_nextn: Tensor | None = None
    # set by the first lend(): every node's sources and every graph input's flags as built
    _as_built: tuple[list[list[Tensor | None]], list[tuple[Tensor, TensorFlag]]] | None = field(
        default=None, repr=False, compare=False)

    def lend(self, graph_size: int) -> GraphResult:
        """This graph itself, as built and with capacity ``graph_size``, for one caller that splits it in
        place (``ggml_backend_sched_split_graph`` points sources at the split inputs' copies and flags the
        graph inputs it replicates). The split graph stays as the split left it, so the scheduler's last
        assignment (its plan, its debug dump) keeps reading it, until the next :meth:`lend` or
        :meth:`restore` puts back what the split changed; :meth:`copy` copies the graph as built and
        leaves it alone. A graph that is never lent keeps no record of itself."""
        if self._as_built is None:
            g = self.graph
            self._as_built = ([t.src.copy() for t in g.nodes],
                              [(t, t.flags) for t in (*g.leafs, *g.nodes) if t.flags & TensorFlag.INPUT])
        else:
            self.restore()
        self.graph.size = graph_size
        return self

    def restore(self) -> None:
        """Put back the sources and flags a split in place changed since the last :meth:`lend`."""
        kept = self._as_built
        if kept is None:
            return
        for t, src in zip(self.graph.nodes, kept[0]):
            if t.src != src:
                t.src = src.copy()
        for t, f in kept[1]:
            t.flags = f

    def copy(self, graph_size: int, rebind: Callable[[Tensor], Tensor] | None = None,
             memory: Mapping[int, object] | None = None) -> GraphResult:
        """The same graph over new tensors (the weights and the KV cache shared, or each replaced by
        ``rebind(t)`` and the inputs' caches by ``memory``, see :meth:`GraphInput.copy`), with capacity
        ``graph_size``: what building it again would give (:meth:`toolkit.ggml.Graph.copy`); a lent graph
        is copied as built (its recorded sources and flags), and left as its split left it."""
        kept = self._as_built
        g, cp = self.graph.copy(graph_size, _allocated, rebind, None if kept is None else kept[0])
        if kept is not None:
            for t, f in kept[1]:
                if not _allocated(t):
                    cp(t).flags = f
        return GraphResult(
            g, self.n_tokens, self.n_seqs, self.n_outputs, self.flash_attn, self.streams,
            [(cp(t), il) for t, il in self.norms], [(cp(t), name, il) for t, name, il in self.named],
            [(cp(t), il) for t, il in self.fa_nodes], [inp.copy(cp, memory) for inp in self.inputs],
            None if self.logits is None else cp(self.logits), None if self.embd is None else cp(self.embd),
            None if self.h_nextn is None else cp(self.h_nextn))

    def input(self, kind: type[In]) -> In:
        """The graph's first input of this kind (e.g. ``lg.input(InputOutIds).out_ids``)."""
        for inp in self.inputs:
            if isinstance(inp, kind):
                return inp
        raise KeyError(f"the graph has no {kind.__name__} input (it has {[type(i).__name__ for i in self.inputs]})")

    def set_inputs(self, ub: UBatch) -> dict[Tensor, np.ndarray]:
        """Every input's values for ubatch ``ub`` (``llm_graph_result::set_inputs``)."""
        out: dict[Tensor, np.ndarray] = {}
        for inp in self.inputs:
            out.update(inp.set_input(ub))
        return out


def _stream_range(res: GraphResult, kv: KVCache) -> tuple[int, int]:
    """(first stream, number of streams) the ubatch's KV views and mask cover."""
    if res.streams is None:
        return 0, kv.n_stream
    return res.streams[0], res.streams[1] - res.streams[0] + 1


def _allocated(t: Tensor) -> bool:
    """Tensors a graph build does not create: they have a buffer (weights, KV cache)."""
    return t.buffer is not None


class GraphBuilder:
    """Builds the graph for one ubatch shape over a loaded model and its memory.

    Subclasses implement :meth:`build_layers` (everything between the input embedding and the
    output norm) and may override :meth:`ffn`.
    """

    def __init__(self, model: LoadedModel, memory: Memory, *, flash_attn: bool, graph_size: int,
                 rope_type: int) -> None:
        """``rope_type``: ``llama_model_rope_type`` of the architecture (its record says which)."""
        self.model = model
        self.rope_type = rope_type
        self.hp = model.hparams
        self.memory = memory
        self.flash_attn = flash_attn
        self.graph_size = graph_size

    # ---- the graph callback (llama_context::graph_get_cb); pins are applied by the context -------
    def cb(self, res: GraphResult, t: Tensor, name: str, il: int) -> Tensor:
        t.name = f"{name}-{il}" if il >= 0 else name
        res.named.append((t, name, il))
        if name == "norm" and il >= 0:
            res.norms.append((t, il))
        return t

    # ---- the frame every architecture shares -------------------------------------------------
    def build(self, n_tokens: int, n_seqs: int, n_outputs: int,
              streams: tuple[int, int] | None = None) -> GraphResult:
        """The graph of one ubatch. ``streams`` (first, last) narrows the KV views and the mask to the
        streams of the ubatch's sequences, as a decode of some sequences of a multi-stream cache does;
        the default is every stream (a reserve)."""
        if n_tokens <= 0 or n_seqs <= 0:
            raise ValueError(f"a ubatch needs n_tokens >= 1 and n_seqs >= 1, got {n_tokens} and {n_seqs}")
        if streams is not None and not 0 <= streams[0] <= streams[1] < self.memory.n_stream:
            raise ValueError(f"streams {streams} are not within the cache's {self.memory.n_stream} stream(s)")
        res = GraphResult(Graph(self.graph_size), n_tokens, n_seqs, n_outputs, self.flash_attn, streams)
        self.build_output(res, self.build_layers(res))
        assert res.logits is not None and res.embd is not None
        res.graph.build_forward_expand(res.logits)
        # llm_graph_result::set_outputs: logits, embeddings and t_h_nextn are graph outputs
        res.logits.set_output()
        res.embd.set_output()
        if res.h_nextn is not None:
            res.h_nextn.set_output()
        return res

    def build_layers(self, res: GraphResult) -> Tensor:
        raise NotImplementedError

    def build_output(self, res: GraphResult, cur: Tensor) -> None:
        """After the layers: :meth:`build_output_norm` (``res.embd``) and the output head ``result_output``
        (``res.logits``)."""
        m = self.model
        res.embd = cur = self.build_output_norm(res, cur)
        assert m.output is not None
        res.logits = self.cb(res, self.build_lora_mm(m.output, cur, "output.scale"), "result_output", -1)

    def build_lora_mm(self, w: Tensor, cur: Tensor, scale: str) -> Tensor:
        """``llm_graph_context::build_lora_mm`` without adapters: MUL_MAT(w, cur), then a MUL by the weight's
        per-tensor scale (``w_s``, F32 [1]) when the model has the tensor named ``scale``."""
        out = ops.mul_mat(w, cur)
        s = self.model.tensors.get(scale)
        return out if s is None else ops.mul(out, s)

    def build_output_norm(self, res: GraphResult, cur: Tensor) -> Tensor:
        """The output norm after the layers, named ``result_norm`` (an architecture that picks the output
        rows after the norm, as qwen35's ``h_nextn``, overrides it)."""
        cur = self.build_norm(res, cur, self.model.w("output_norm.weight"), -1)
        return self.cb(res, cur, "result_norm", -1)

    # ---- inputs ---------------------------------------------------------------------------------
    def build_inp_embd(self, res: GraphResult) -> Tensor:
        """The token path is selected; the vector-embedding input is still added to the graph."""
        gf, n_tokens = res.graph, res.n_tokens
        tokens = ops.new_tensor_1d(I32, n_tokens, "inp_tokens").set_input()
        inp_embd = ops.new_tensor_2d(F32, self.hp.n_embd, n_tokens, "inp_embd").set_input()
        cur = ops.get_rows(self.model.w("token_embd.weight"), tokens)
        gf.build_forward_expand(cur)
        gf.build_forward_expand(inp_embd)
        self.cb(res, cur, "embd", -1)
        res.inputs.append(InputEmbd(tokens, inp_embd))
        return cur

    def build_inp_pos(self, res: GraphResult) -> Tensor:
        t = ops.new_tensor_1d(I32, res.n_tokens).set_input()
        res.inputs.append(InputPos(t))
        return t

    def _attn_inp(self, res: GraphResult, kv: KVCache) -> InputAttnKV:
        """``build_attn_inp_kv_impl``: the cache's write indices, then the mask (``build_attn_inp_kq_mask``)."""
        n_tokens = res.n_tokens
        k_idxs = kv.build_input_k_idxs(n_tokens)
        v_idxs = kv.build_input_v_idxs(n_tokens)
        mask_type = F16 if self.flash_attn else F32
        _, ns = _stream_range(res, kv)
        kq_mask = ops.new_tensor_4d(mask_type, kv.kv_size, n_tokens // ns, 1, ns, "attn_inp_kq_mask")
        kq_mask.set_input()
        return InputAttnKV(kv, k_idxs, v_idxs, kq_mask)

    def build_attn_inp_kv(self, res: GraphResult) -> InputAttnKV:
        """``build_attn_inp_kv``: the write indices and the mask of the (single) KV cache."""
        if self.memory.kind != "kv":
            raise ValueError(f"build_attn_inp_kv needs a memory of one KV cache, this one is {self.memory.kind!r}")
        inp = self._attn_inp(res, self.memory.caches[0])
        res.inputs.append(inp)
        return inp

    def build_attn_inp_k(self, res: GraphResult) -> InputAttnK:
        """``build_attn_inp_k``: the write indices and the mask of a K-only cache (MLA)."""
        if self.memory.kind != "kv" or self.memory.caches[0].has_v:
            raise ValueError("build_attn_inp_k needs one K-only KV cache (an MLA model's)")
        kv = self.memory.caches[0]
        n_tokens = res.n_tokens
        k_idxs = kv.build_input_k_idxs(n_tokens)
        _, ns = _stream_range(res, kv)
        kq_mask = ops.new_tensor_4d(F16 if self.flash_attn else F32, kv.kv_size, n_tokens // ns, 1, ns,
                                    "attn_inp_kq_mask")
        kq_mask.set_input()
        inp = InputAttnK(kv, k_idxs, kq_mask)
        res.inputs.append(inp)
        return inp

    def build_attn_inp_kv_iswa(self, res: GraphResult) -> InputAttnKVISWA:
        """``build_attn_inp_kv_iswa``: the non-SWA cache's inputs, then the SWA cache's."""
        if self.memory.kind != "kv-iswa":
            raise ValueError(f"build_attn_inp_kv_iswa needs llama_kv_cache_iswa's memory, this one is "
                             f"{self.memory.kind!r}")
        base, swa = self.memory.caches
        inp = InputAttnKVISWA(self._attn_inp(res, base), self._attn_inp(res, swa))
        res.inputs.append(inp)
        return inp

    def build_inp_attn(self, res: GraphResult) -> InputAttnKV | InputAttnKVISWA:
        """The attention input the memory needs: ``build_attn_inp_kv_iswa`` for llama_kv_cache_iswa,
        else ``build_attn_inp_kv`` (an architecture with an optional window, as gemma3 builds it)."""
        if self.memory.kind == "kv-iswa":
            return self.build_attn_inp_kv_iswa(res)
        return self.build_attn_inp_kv(res)

    def build_inp_out_ids(self, res: GraphResult) -> Tensor:
        t = ops.new_tensor_1d(I32, res.n_outputs).set_input()
        res.inputs.append(InputOutIds(t))
        return t

    # ---- blocks ---------------------------------------------------------------------------------
    def build_norm(self, res: GraphResult, x: Tensor, w: Tensor, il: int) -> Tensor:
        """``build_norm(LLM_NORM_RMS)``: ``norm`` (RMS_NORM) times the weight."""
        cur = self.cb(res, ops.rms_norm(x, self.hp.eps), "norm", il)
        return ops.mul(cur, w)

    def rope(self, x: Tensor, pos: Tensor, il: int) -> Tensor:
        """``ggml_rope_ext`` with the architecture's RoPE type, the layer's base, ``rope_freqs`` (the
        freq-factors source) if any, and the YaRN values of ``hp.rope_scaling`` if any."""
        hp = self.hp
        factors = self.model.rope_freqs.get(il)
        ys = hp.rope_scaling
        if ys is None:
            return ops.rope_ext(x, pos, factors, hp.n_rot_at(il), self.rope_type, hp.n_ctx_train, hp.rope_base(il))
        # YaRN: cparams.n_ctx_orig_yarn, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_*
        return ops.rope_ext(x, pos, factors, hp.n_rot_at(il), self.rope_type, ys.orig_ctx or hp.n_ctx_train,
                            hp.rope_base(il), ys.freq_scale, ys.ext_factor, ys.attn_factor, ys.beta_fast,
                            ys.beta_slow)

    def build_attn(self, res: GraphResult, inp: InputAttnKV | InputAttnKVISWA, wo: Tensor | None,
                   wo_b: Tensor | None, q_cur: Tensor, k_cur: Tensor | None, v_cur: Tensor | None,
                   kq_b: Tensor | None,
                   sinks: Tensor | None, v_mla: Tensor | None, kq_scale: float, il: int, *,
                   wo_s: Tensor | None = None) -> Tensor:
        """``llm_graph_context::build_attn``: store K and V, attend, project (kqv_out, wo, wo_s, wo_b).

        ``inp`` is a KV input (``llm_graph_input_attn_kv``) or an iSWA input, which gives the inputs
        of the cache that holds layer il. Q, then V and K (iSWA: K and V) are expanded together so
        they are not reordered (fewer splits). ``wo`` None: no output projection; ``wo_s`` multiplies
        and ``wo_b`` adds after it (``build_lora_mm``, the output bias). ``sinks`` (gpt-oss's attention
        sinks, F32 ``[n_head]``) become one more source of the attention: FLASH_ATTN_EXT's src[4]
        (``ggml_flash_attn_ext_add_sinks``) or the SOFT_MAX's src[2] (``ggml_soft_max_add_sinks``).
        ``v_mla`` (MLA's ``wv_b``) decompresses the attention's output per head (``build_attn_mha``).
        Not built yet, raising UnsupportedFeature when given: ``kq_b`` (a KQ bias, T5's relative positions).
        """
        if kq_b is not None:
            raise UnsupportedFeature("kq_b", f"build_attn's kq_b argument is not built yet (layer {il})")
        gf = res.graph
        kv = inp.layer_input(il)
        gf.build_forward_expand(q_cur)
        if k_cur is not None and v_cur is not None:
            for t in inp.expand_order(k_cur, v_cur):
                gf.build_forward_expand(t)
        # K and V None: a layer that reads an earlier layer's cache (layer_reuse_cb) stores nothing
        if k_cur is not None:
            gf.build_forward_expand(self._cpy_k(kv.cache, k_cur, kv.k_idxs, il))
        if v_cur is not None:
            gf.build_forward_expand(self._cpy_v(kv.cache, v_cur, kv.v_idxs, il))
        k = self._get_k(res, kv.cache, il)
        v = self._get_v(res, kv.cache, il)
        cur = self._attn_mha(res, il, q_cur, k, v, kv.kq_mask, kq_scale, sinks, v_mla)
        return self._attn_out(res, cur, wo, wo_b, wo_s, il)

    def build_attn_k(self, res: GraphResult, inp: InputAttnK, wo: Tensor | None, wo_b: Tensor | None,
                     q_cur: Tensor, k_cur: Tensor, v_cur: Tensor, v_mla: Tensor | None, kq_scale: float,
                     il: int, *, wo_s: Tensor | None = None) -> Tensor:
        """``build_attn(llm_graph_input_attn_k *, ...)``: MLA's attention over a K-only cache. Q, V, then K
        are expanded; K is stored; V is a view of the cached K's first ``v_cur.ne[0]`` values (the
        compressed ``kv_cmpr``), with K's strides; ``v_mla`` decompresses after the attention."""
        gf = res.graph
        for t in (q_cur, v_cur, k_cur):
            gf.build_forward_expand(t)
        gf.build_forward_expand(self._cpy_k(inp.cache, k_cur, inp.k_idxs, il))
        k = self._get_k(res, inp.cache, il)
        v = ops.view_4d(k, v_cur.ne[0], k.ne[1], k.ne[2], k.ne[3], k.nb[1], k.nb[2], k.nb[3], 0)
        cur = self._attn_mha(res, il, q_cur, k, v, inp.kq_mask, kq_scale, None, v_mla)
        return self._attn_out(res, cur, wo, wo_b, wo_s, il)

    def _attn_out(self, res: GraphResult, cur: Tensor, wo: Tensor | None, wo_b: Tensor | None,
                  wo_s: Tensor | None, il: int) -> Tensor:
        """``kqv_out``, then the output projection (``build_lora_mm(wo, cur, wo_s)``) and its bias."""
        self.cb(res, cur, "kqv_out", il)
        if wo is not None:
            cur = ops.mul_mat(wo, cur)
            if wo_s is not None:
                cur = ops.mul(cur, wo_s)
        if wo_b is not None:
            cur = ops.add(cur, wo_b)
        return cur

    def ffn(self, res: GraphResult, il: int, cur: Tensor) -> Tensor:
        """The layer's FFN slot: build_moe_ffn for a model with experts, else the dense gated FFN."""
        if self.hp.moe is not None:
            p = f"blk.{il}."
            m = self.model
            scale = {r: m.tensors.get(f"{p}ffn_{r}_exps.scale") for r in ("up", "gate", "down")}
            return build_moe_ffn(res.graph, lambda t, name, i: self.cb(res, t, name, i), cur,
                                 m.w(p + "ffn_gate_inp.weight"), m.w(p + "ffn_up_exps.weight"),
                                 m.w(p + "ffn_gate_exps.weight"), m.w(p + "ffn_down_exps.weight"), self.hp.moe, il,
                                 up_exps_s=scale["up"], gate_exps_s=scale["gate"], down_exps_s=scale["down"])
        return self.build_ffn(res, il, cur, "silu")

    def build_ffn(self, res: GraphResult, il: int, cur: Tensor, act: str, suffix: str = "") -> Tensor:
        """``build_ffn(LLM_FFN_SILU | LLM_FFN_GELU, LLM_FFN_PAR)``: up, gate, swiglu/geglu(gate, up), down.
        ``suffix`` picks other weights of the same shape of FFN (``_shexp``: a shared expert's
        ``ffn_up_shexp`` & co.); the nodes keep their names."""
        p = f"blk.{il}."
        m, cb = self.model, self.cb
        up, gate, down = (f"{p}ffn_{r}{suffix}" for r in ("up", "gate", "down"))
        tmp = cb(res, self.build_lora_mm(m.w(up + ".weight"), cur, up + ".scale"), "ffn_up", il)
        cur = cb(res, self.build_lora_mm(m.w(gate + ".weight"), cur, gate + ".scale"), "ffn_gate", il)
        if act == "silu":
            cur = cb(res, ops.swiglu_split(cur, tmp), "ffn_swiglu", il)
        elif act == "gelu":
            cur = cb(res, ops.geglu_split(cur, tmp), "ffn_geglu", il)
        else:
            raise ValueError(f"FFN activation {act!r} is not built; known: silu, gelu")
        # llama.cpp names the product "ffn_down" only with a down bias; the caller names what it returns
        return self.build_lora_mm(m.w(down + ".weight"), cur, down + ".scale")

    # ---- the KV cache (llama_kv_cache::cpy_k / cpy_v / get_k / get_v) ----------------------------
    def _cpy_k(self, kv: KVCache, k_cur: Tensor, k_idxs: Tensor, il: int) -> Tensor:
        k = kv.k_of(il)
        n_embd_gqa = k_cur.ne[0] * k_cur.ne[1]
        k_view = ops.view_2d(k_cur, n_embd_gqa, k_cur.ne[2], k_cur.nb[2], 0)
        if k.ne[2] > 1:  # merge the streams: the idxs are global
            k = ops.reshape_2d(k, n_embd_gqa, k.ne[1] * k.ne[2])
        return ops.set_rows(k, k_view, k_idxs)

    def _cpy_v(self, kv: KVCache, v_cur: Tensor, v_idxs: Tensor, il: int) -> Tensor:
        v = kv.v_of(il)
        n_embd_gqa = v_cur.ne[0] * v_cur.ne[1]
        n_tokens = v_cur.ne[2]
        if not kv.v_trans:
            v_view = ops.view_2d(v_cur, n_embd_gqa, n_tokens, v_cur.nb[2], 0)
            if v.ne[2] > 1:
                v = ops.reshape_2d(v, v.ne[0], v.ne[1] * v.ne[2])
            return ops.set_rows(v, v_view, v_idxs)
        if v_cur.type.row_size(n_embd_gqa) == v_cur.nb[2]:  # dims 0, 1 and 2 merge
            v_cur2 = ops.reshape_2d(v_cur, n_embd_gqa, n_tokens)
        else:
            v_cur2 = ops.cont_2d(v_cur, n_embd_gqa, n_tokens)
        if n_embd_gqa < v.ne[0]:
            # TAG_V_CACHE_VARIABLE: the cache is n_embd_v_gqa_max wide; a narrower layer's rows are padded
            v_cur2 = ops.pad(v_cur2, v.ne[0] - n_embd_gqa)
        # transposed V: every element is its own row
        v_rows = ops.reshape_2d(v, 1, v.ne[0] * v.ne[1] * v.ne[2])
        v_cur2 = ops.reshape_2d(v_cur2, 1, v_cur2.nelements)
        return ops.set_rows(v_rows, v_cur2, v_idxs)

    def _get_k(self, res: GraphResult, kv: KVCache, il: int) -> Tensor:
        k = kv.k_of(il)
        hp = self.hp
        t = k.type
        H, n_kv = hp.n_embd_head_k_at(il), kv.kv_size
        s0, ns = _stream_range(res, kv)
        stream = t.row_size(k.ne[0] * n_kv)
        return ops.view_4d(k, H, hp.n_head_kv(il), n_kv, ns, t.row_size(H), t.row_size(k.ne[0]), stream, stream * s0)

    def _get_v(self, res: GraphResult, kv: KVCache, il: int) -> Tensor:
        v = kv.v_of(il)
        hp = self.hp
        t = v.type
        H, n_kv = hp.n_embd_head_v_at(il), kv.kv_size
        s0, ns = _stream_range(res, kv)
        stream = t.row_size(n_kv * v.ne[0])
        if not kv.v_trans:
            return ops.view_4d(v, H, hp.n_head_kv(il), n_kv, ns, t.row_size(H), t.row_size(v.ne[0]), stream,
                               stream * s0)
        return ops.view_4d(v, n_kv, hp.n_head_kv(il), H, ns, t.row_size(n_kv * H), t.row_size(n_kv), stream,
                           stream * s0)

    def _attn_mha(self, res: GraphResult, il: int, q: Tensor, k: Tensor, v: Tensor, kq_mask: Tensor,
                  kq_scale: float, sinks: Tensor | None = None, v_mla: Tensor | None = None) -> Tensor:
        cb = self.cb
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
            ops.flash_attn_ext_add_sinks(cur, sinks)
            if v_mla is not None:
                # a matrix-matrix product with the tokens in dimension 1 (the permutes only relabel)
                cur = ops.permute(cur, 0, 2, 1, 3)
                cur = cb(res, ops.mul_mat(v_mla, cur), "fattn_mla", il)
                cur = ops.cont(ops.permute(cur, 0, 2, 1, 3))
            cur = ops.reshape_2d(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
        else:
            kq = cb(res, ops.mul_mat(k, q), "kq", il)
            kq = ops.soft_max_ext(kq, kq_mask, kq_scale, 0.0)
            ops.soft_max_add_sinks(kq, sinks)
            kq = cb(res, kq, "kq_soft_max", il)
            if not v_trans:
                v = cb(res, ops.cont(ops.transpose(v)), "v_cont", il)
            kqv = cb(res, ops.mul_mat(v, kq), "kqv", il)
            if v_mla is not None:   # MLA: decompress from MQA back to one head per query head
                kqv = cb(res, ops.mul_mat(v_mla, kqv), "kqv_mla", il)
            cur = ops.permute(kqv, 0, 2, 1, 3)
            cur = ops.cont_2d(cur, cur.ne[0] * cur.ne[1], cur.ne[2] * cur.ne[3])
            # the callback sees the merged heads first: with -nkvo it pins this node to the CPU
            cb(res, cur, "kqv_merged_cont", il)
        res.graph.build_forward_expand(cur)
        return cur

    # ---- pieces the architectures share ---------------------------------------------------------
    def qkv(self, res: GraphResult, il: int, cur: Tensor, *, bias: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """Q, K, V projections reshaped to heads (``Qcur``/``Kcur``/``Vcur``): ``build_qkv``'s separate
        path; ``bias``: each projection plus its ``attn_q/k/v.bias`` (``layer.wq_b`` & co.)."""
        hp, m, cb = self.hp, self.model, self.cb
        p = f"blk.{il}."
        Hk, Hv, n_tokens = hp.n_embd_head_k, hp.n_embd_head_v, cur.ne[1]
        proj = []
        for role, name in (("q", "Qcur"), ("k", "Kcur"), ("v", "Vcur")):
            t = cb(res, self.build_lora_mm(m.w(f"{p}attn_{role}.weight"), cur, f"{p}attn_{role}.scale"), name, il)
            if bias:
                t = cb(res, ops.add(t, m.w(f"{p}attn_{role}.bias")), name, il)
            proj.append(t)
        q, k, v = proj
        q = cb(res, ops.reshape_3d(q, Hk, hp.n_head(il), n_tokens), "Qcur", il)
        k = cb(res, ops.reshape_3d(k, Hk, hp.n_head_kv(il), n_tokens), "Kcur", il)
        v = cb(res, ops.reshape_3d(v, Hv, hp.n_head_kv(il), n_tokens), "Vcur", il)
        return q, k, v

    def kq_scale(self) -> float:
        return 1.0 / math.sqrt(float(self.hp.n_embd_head_k))
