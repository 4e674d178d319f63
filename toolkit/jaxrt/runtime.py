"""Run llama ubatches through the scheduled graph: ``decode(ctx, tokens)`` and ``generate``.

A :class:`ContextRuntime` holds what a context needs to really run: the backends bound to
JAX devices, the device-resident weights and KV cache (a :class:`~toolkit.jaxrt.execute.GraphRunner`),
the context's memory (its cells say which positions each sequence holds), and a log of split
compilations. Per ubatch it does what ``llama_context::decode`` does around the scheduler:
find and apply the ubatch's slot in the memory, reset, build the graph (pins applied),
``alloc_graph`` (which rotates the input copies under pipeline parallelism), set the inputs
(each graph input fills itself: ``set_input(ubatch)``), compute the splits. Ubatches are
dispatched without waiting, and logits are read once at the end, so with pipeline parallelism
the devices overlap.

The module-level :func:`decode`, :func:`generate` and :func:`compile_splits` are how a context
runs: they take a :class:`~toolkit.context.Context` (any :class:`~toolkit.context.RunnableContext`);
the runtime keeps each context's :class:`ContextRuntime` itself (a ``WeakKeyDictionary`` keyed by the context,
:func:`runtime_of`), so nothing is parked on the context, and the context never imports the runtime.
"""

from __future__ import annotations

import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from toolkit import validate
from toolkit.backend import Backend
from toolkit.context import RunnableContext
from toolkit.errors import ParameterError, UnsupportedFeature
from toolkit.ggml.tensor import Tensor
from toolkit.jaxrt.compile import CompileCache, enable_persistent_cache
from toolkit.jaxrt.devices import GPU_PLATFORMS, extra_cpu_device, request_cpu_devices
from toolkit.jaxrt.execute import GraphRunner, SplitSpec, scheduler_splits
from toolkit.jaxrt.gguf_io import GGUFModel, decode_values, encode, read_gguf
from toolkit.jaxrt.operands import CPU_NUMERICS, Numerics
from toolkit.models.memory import Memory, UBatch
from toolkit.models.tokenizer import Vocab, load_vocab

# (n_tokens, n_seqs, n_outputs, graph_size, streams) -> GraphResult: Context.build_llama_graph
BuildFn = Callable[..., Any]
LOG_SIZE = 256  # ubatches kept in ContextRuntime.log (a long generation must not grow memory)


def bind_executors(backends: Sequence[Backend]) -> list[Any]:
    """Give every backend without an executor a JAX device: CUDA-like → a JAX GPU, TPU → a TPU
    core, CPU and CPU-sharing accelerators (BLAS) → the CPU device, anything else (simulated,
    RPC-like, Metal-like) → its own extra CPU device (1, 2, …). Returns the devices in order."""
    need_cpu = 1 + sum(1 for b in backends if b.executor is None and b.kind == "gpu"
                       and not b.name.startswith(("CUDA", "TPU")))
    if need_cpu > 1:
        request_cpu_devices(need_cpu)
    cpus = jax.local_devices(backend="cpu")
    gpus = [d for d in jax.devices() if d.platform in GPU_PLATFORMS]
    tpus = [d for d in jax.devices() if d.platform == "tpu"]
    next_cpu, n_gpu, n_tpu = 1, 0, 0
    for b in backends:
        if b.executor is not None:
            continue
        if b.kind != "gpu":  # CPU, and accelerators sharing the CPU buft (BLAS)
            b.executor = cpus[0]
        elif b.name.startswith("CUDA"):
            if n_gpu >= len(gpus):
                raise ValueError(f"backend {b.name} needs a JAX GPU but JAX has {len(gpus)}; "
                                 f"use simulated accelerators (sim) on this machine")
            b.executor, n_gpu = gpus[n_gpu], n_gpu + 1
        elif b.name.startswith("TPU"):
            if n_tpu >= len(tpus):
                raise ValueError(f"backend {b.name} needs a JAX TPU core but JAX has {len(tpus)}")
            b.executor, n_tpu = tpus[n_tpu], n_tpu + 1
        else:
            b.executor, next_cpu = extra_cpu_device(next_cpu - 1), next_cpu + 1
    return [b.executor for b in backends]


def init_random_weights(tensors: dict[str, Tensor], seed: int = 0, scale: float = 0.1, *, tied: bool = False
                        ) -> dict[str, np.ndarray]:
    """Random weights in each tensor's own type (``t.data``); returns the f32 values ggml computes
    with (after quantization). ``tied``: output.weight shares token_embd's data."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, t in tensors.items():
        ne = tuple(int(x) for x in t.ne[: max(t.n_dims, 1)])
        if tied and name == "output.weight" and "token_embd.weight" in tensors:
            continue
        if name != t.name and t.name in tensors:
            continue  # another buffer type's copy of a duplicated weight (rope_freqs): same values
        shape = tuple(reversed(ne))
        vals = 1.0 + scale * rng.standard_normal(shape) if len(ne) == 1 else scale * rng.standard_normal(shape)
        arr, _ = encode(np.asarray(vals, np.float32), t.type)
        t.data = arr
        out[name] = decode_values(arr, t.type, ne)
    if tied and "output.weight" in tensors:
        tensors["output.weight"].data = tensors["token_embd.weight"].data
        out["output.weight"] = out["token_embd.weight"]
    for name, t in tensors.items():
        if name != t.name and t.name in tensors and t.data is None:
            t.data = tensors[t.name].data
    return out


def attach_gguf(tensors: dict[str, Tensor], source: Any, *, tied: bool = False) -> None:
    """Point every weight tensor's ``data`` at its GGUF data (types and shapes checked);
    ``source`` is a path or a :class:`~toolkit.jaxrt.gguf_io.GGUFModel` already read."""
    g = source if isinstance(source, GGUFModel) else read_gguf(source)
    path = g.path
    for name, t in tensors.items():
        # a duplicated weight (the tied output, another device's rope_freqs) carries its file name
        key = t.name if t.name in g.tensors else name
        if name == "output.weight" and key not in g.tensors:
            key = "token_embd.weight"
        gt = g.tensors.get(key)
        if gt is None:
            raise ValueError(f"{path}: tensor {key!r} is missing")
        want = tuple(int(x) for x in t.ne[: len(gt.ne)])
        if gt.type is not t.type or gt.ne != want:
            raise ValueError(f"{path}: {key} is {gt.type.name} {list(gt.ne)}, the model expects "
                             f"{t.type.name} {list(want)}")
        t.data = gt.data


@dataclass
class DecodeLog:
    """One ubatch: its size and, per split, compiled or cache hit and the compile ms."""

    n_tokens: int
    splits: list[dict[str, Any]]
    n_copies: int = 0
    weight_copies: int = 0
    graph_reused: bool = False
    expert_transfers: list[Any] = field(default_factory=list)   # toolkit.models.moe.ExpertTransfer

    @property
    def compiled(self) -> int:
        return sum(1 for s in self.splits if s["status"] != "cache hit")

    @property
    def compile_ms(self) -> float:
        return sum(s["compile_ms"] for s in self.splits if s["status"] != "cache hit")


@dataclass
class ContextRuntime:
    """One context's runtime state: weights and KV cache on the devices, the KV cells, the decode loop
    (see the module docstring)."""

    backends: list[Backend]
    sched_fn: Callable[[], Any]            # the current scheduler (a context may rebuild it)
    build: BuildFn
    memory: Memory                         # the KV caches and their cells (toolkit.models.memory)
    n_ubatch: int
    cache: CompileCache | None = None
    log: deque[DecodeLog] = field(default_factory=lambda: deque(maxlen=LOG_SIZE))
    graph_reuse: bool = True
    # an object that changes (by identity) whenever the scheduler was reserved again
    epoch_fn: Callable[[], object] = lambda: None
    # which way ops that ggml backends compute differently go (ggml-cpu's by default)
    numerics: Numerics = CPU_NUMERICS

    _prev: tuple[Any, Any] | None = None
    notes: list[str] = field(default_factory=list)
    def __post_init__(self) -> None:
        enable_persistent_cache()
        bind_executors(self.backends)
        self.runner = GraphRunner(self.backends, self.cache, self.numerics)

    # sequences and KV streams (llama_kv_cache: one stream per sequence unless the cache is unified)
    @property
    def kv_size(self) -> int:
        return self.memory.kv_size

    @property
    def n_seq_max(self) -> int:
        return self.memory.n_seq_max

    @property
    def n_stream(self) -> int:
        return self.memory.n_stream

    @property
    def seq_past(self) -> list[int]:
        """Tokens in the cache per sequence: the position after each sequence's last (the memory's cells)."""
        return [self.memory.seq_pos_max(s) + 1 for s in range(self.n_seq_max)]

    @property
    def n_past(self) -> int:
        """Tokens in the cache for sequence 0 (:attr:`seq_past` has every sequence's)."""
        return self.seq_past[0]

    def _stream(self, seq_id: int) -> int:
        """The KV stream of a sequence (``llama_kv_cache::seq_to_stream``): its own unless the cache is
        unified, whose single stream holds sequence 0 only here."""
        seq_id = validate.integer("seq_id", seq_id, lo=0, hi=self.n_seq_max - 1)
        if self.n_stream == 1 and seq_id != 0:
            raise UnsupportedFeature(
                "kv_unified", f"decoding sequence {seq_id} in a unified KV cache (kv_unified, one stream shared by "
                f"{self.n_seq_max} sequences) is not run here; a cache with one stream per sequence "
                "(kv_unified=False, llama.cpp's default) runs every sequence")
        return seq_id if self.n_stream > 1 else 0

    # ---- KV cache --------------------------------------------------------------------------
    def clear(self, data: bool = False, seq_id: int | None = None) -> None:
        """Forget the KV cache (``llama_memory_clear``), or one sequence's cells (``llama_memory_seq_rm``
        over all positions): the cells become free; ``data`` (whole cache only) also zeroes them
        (stale cells are never read: the mask hides every free cell)."""
        if seq_id is not None:
            self._stream(seq_id)
            self.memory.seq_rm(seq_id)
            return
        if data:
            self.runner.reset_kv()
        self.memory.clear()

    # ---- decoding --------------------------------------------------------------------------
    def _build(self, n_tokens: int, stream: int) -> Any:
        """The graph of a ubatch of one sequence: with one stream per sequence, the KV views and the
        mask cover that sequence's stream only (as llama.cpp's slot_info s0 = s1)."""
        return self.build(n_tokens, 1, n_tokens, streams=(stream, stream) if self.n_stream > 1 else None)

    def decode(self, tokens: Sequence[int], seq_id: int = 0) -> np.ndarray:
        """Logits [n_tokens, n_vocab] of every token of sequence ``seq_id``, appended to its cells of the
        KV cache."""
        stream = self._stream(seq_id)
        toks = np.asarray(list(tokens), dtype=np.int64)
        if toks.ndim != 1 or len(toks) == 0:
            raise ValueError(f"decode needs a non-empty list of token ids, got {len(toks)} tokens")
        past = self.memory.seq_pos_max(seq_id) + 1
        if past + len(toks) > self.kv_size:
            raise ValueError(f"{len(toks)} tokens after {past} do not fit the KV cache of {self.kv_size} cells"
                             + (f" (sequence {seq_id})" if self.n_seq_max > 1 else ""))
        pending = []
        for start in range(0, len(toks), self.n_ubatch):
            ub = UBatch.of_sequence(toks[start:start + self.n_ubatch], past + start, seq_id)
            # the scheduler first: a context that reserves again builds its graphs over the whole memory
            sched = self.sched_fn()
            self.memory.apply_ubatch(ub)   # find_slot + apply_ubatch, in every cache (and the recurrent states)
            try:
                n = ub.n_tokens
                key = (n, sched, self.epoch_fn(), stream, self.memory.slot_key())
                reused = (self.graph_reuse and self._prev is not None and sched.n_copies == 1
                          and self._prev[0][0] == key[0] and self._prev[0][1] is sched
                          and self._prev[0][2] is key[2] and self._prev[0][3:] == key[3:])
                if reused:
                    # llama.cpp's graph reuse: same ubatch shape (and recurrent slot), same scheduler, no
                    # reserve since
                    lg, pg = self._prev[1]  # type: ignore[index]
                else:
                    self._prev = None
                    sched.reset()
                    lg = self._build(n, stream)
                    if not sched.alloc_graph(lg.graph):
                        raise RuntimeError(f"alloc_graph failed for a ubatch of {n} tokens")
                    pg = self.runner.prepare_graph(sched, lg.graph, [lg.logits])
                    self._prev = (key, (lg, pg))
                inputs = lg.set_inputs(ub)   # llm_graph_result::set_inputs
            finally:
                self.memory.end_ubatch()
            res = self.runner.run_graph(pg, inputs)
            st = self.runner.last_stats
            self.log.append(DecodeLog(n, [ps.summary() for ps in pg.splits], st.n_copies,
                                      st.weight_copies, reused, list(st.expert_transfers)))
            pending.append((res[lg.logits], lg.logits, n))
        rows = [self.runner.read(flat, t).reshape(n, -1) for flat, t, n in pending]
        return np.concatenate(rows, axis=0)

    def generate(self, prompt_ids: Sequence[int], n: int, seq_id: int = 0) -> list[int]:
        """Greedy: decode the prompt, then n tokens one at a time (argmax of the last logits)."""
        if n < 0:
            raise ValueError(f"n={n} must be >= 0")
        logits = self.decode(prompt_ids, seq_id)
        out: list[int] = []
        for _ in range(n):
            nxt = int(np.argmax(logits[-1]))
            out.append(nxt)
            if len(out) == n:
                break
            logits = self.decode([nxt], seq_id)
        return out

    def precompile(self, n_tokens: int) -> DecodeLog:
        """Split a graph of n_tokens and compile its splits without running (for a reserve event)."""
        self._prev = None
        sched = self.sched_fn()
        sched.reset()
        lg = self._build(n_tokens, 0)
        sched.split_graph(lg.graph)
        specs: list[SplitSpec] = scheduler_splits(sched)
        kv = set(self.memory.tensors)
        keep = {lg.logits} | kv
        prepared = self.runner.prepare_splits(specs, keep, donate=kv)
        sched.reset()
        return DecodeLog(n_tokens, [ps.summary() for ps in prepared])


# ---- running a context -------------------------------------------------------------------

# each context's runtime and the setup it was made for (a new setup: new weights and KV cache)
_RUNTIMES: weakref.WeakKeyDictionary[RunnableContext, tuple[Any, ContextRuntime]] = weakref.WeakKeyDictionary()


def load_weights(ctx: RunnableContext, path: Any = None) -> None:
    """Attach a GGUF file's weights to the context's weight tensors (default: the file it was made from);
    ``path`` may also be a GGUFModel from ``read_gguf``, so that the file is parsed once."""
    path = path or ctx.gguf_path
    if path is None:
        raise ParameterError("path", None, "a GGUF file path", "the Context was not made from a .gguf file")
    st = ctx.setup
    attach_gguf(st.model.tensors, path)
    if st.model.output is not None and st.model.output.data is None:
        st.model.output.data = st.model.tensors["token_embd.weight"].data


def runtime_of(ctx: RunnableContext, numerics: Numerics | None = None) -> ContextRuntime:
    """The context's runtime, made on first use and again when the context re-created its model
    and memory (new devices or KV size); weights come from ctx's GGUF file unless already attached.
    ``numerics`` (default: the held runtime's, else ggml-cpu's :data:`CPU_NUMERICS`): a runtime with
    other numerics replaces the held one, with an empty KV cache."""
    st = ctx.setup
    held = _RUNTIMES.get(ctx)
    if held is not None and held[0] is st and (numerics is None or numerics == held[1].numerics):
        return held[1]
    weights = dict(st.model.tensors)
    if st.model.output is not None:
        weights["output.weight"] = st.model.output
    notes: list[str] = []
    if any(t.data is None for t in weights.values()):
        if ctx.gguf_path is not None:
            load_weights(ctx)
        else:
            # a context planned from a preset has shapes but no weights: run it on seeded random ones
            init_random_weights(st.model.tensors, seed=0, tied=st.hparams.tied)
            if st.model.output is not None and st.model.output.data is None:
                st.model.output.data = st.model.tensors["token_embd.weight"].data
            notes.append("random weights (seed 0): no GGUF file was given; load one with load_weights(ctx, path)")
            warnings.warn(notes[-1], stacklevel=2)
    rt = ContextRuntime(list(ctx.backends), lambda: ctx.scheduler, ctx.build_llama_graph, st.memory,
                        st.resolved.n_ubatch, epoch_fn=lambda: ctx.events[-1] if ctx.events else None,
                        numerics=numerics if numerics is not None else CPU_NUMERICS)
    rt.notes = notes
    _RUNTIMES[ctx] = (st, rt)
    return rt


_VOCABS: weakref.WeakKeyDictionary[RunnableContext, tuple[str, Vocab]] = weakref.WeakKeyDictionary()


def vocab_of(ctx: RunnableContext) -> Vocab:
    """The tokenizer of the context's GGUF file (:func:`toolkit.models.tokenizer.load_vocab`, read
    once); ParameterError for a context not made from a .gguf file."""
    path = ctx.gguf_path
    if path is None:
        raise ParameterError("tokens", "a text", "token ids", "the context has no GGUF vocabulary: "
                             "it was not made from a .gguf file")
    held = _VOCABS.get(ctx)
    if held is None or held[0] != path:
        held = _VOCABS[ctx] = (path, load_vocab(path))
    return held[1]


def prompt_ids(ctx: RunnableContext, tokens: str | Sequence[int]) -> list[int]:
    """Token ids as given, or a text tokenized by the context's GGUF tokenizer as llama.cpp's
    completion tool tokenizes a prompt (``common_tokenize(ctx, prompt, add_special=true,
    parse_special=true)``)."""
    if isinstance(tokens, str):
        return vocab_of(ctx).tokenize(tokens, add_special=True, parse_special=True)
    return list(tokens)


def decode(ctx: RunnableContext, tokens: str | Sequence[int], *, last_only: bool = False,
           seq_id: int = 0) -> np.ndarray:
    """Run tokens of sequence ``seq_id`` through the context's scheduled graph on JAX: logits
    ``[n_tokens, n_vocab]``, the tokens appended to the KV cache (``last_only``: just the last token's
    row, ``[n_vocab]``). With ``n_seq_max`` > 1 each sequence has its own KV stream (llama.cpp's
    default, ``kv_unified=False``) and positions. ``tokens`` may be a text (:func:`prompt_ids`)."""
    ids = prompt_ids(ctx, tokens)
    logits = runtime_of(ctx).decode(ids, seq_id)
    return logits[-1] if last_only else logits


def generate(ctx: RunnableContext, prompt: str | Sequence[int], n: int, seq_id: int = 0) -> list[int]:
    """n greedy tokens after the prompt (ids or a text, :func:`prompt_ids`), in sequence ``seq_id``
    of the context's KV cache."""
    ids = prompt_ids(ctx, prompt)
    return runtime_of(ctx).generate(ids, n, seq_id)


def compile_splits(ctx: RunnableContext, n_tokens: int | None = None) -> dict[str, Any]:
    """Compile the splits of the context's current scheduler for a ubatch of n_tokens (default n_ubatch),
    each for its device; a :class:`~toolkit.reuse.CompileEvent` on the context records it. Returns
    ``{"compiled", "cache_hits", "compile_ms", "splits"}``."""
    rt = runtime_of(ctx)
    log = rt.precompile(n_tokens or rt.n_ubatch)
    info = {"compiled": log.compiled, "cache_hits": len(log.splits) - log.compiled,
            "compile_ms": round(log.compile_ms, 3), "splits": log.splits}
    ctx.holder.record_compile(info)
    return info
