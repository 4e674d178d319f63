"""The llama_context analog: ``sched_reserve`` over llama graphs, on top of the reuse layer.

:class:`Context` owns the model placement, the KV cache and (through a
:class:`~toolkit.reuse.SchedulerHolder`) the backend scheduler, and runs ``sched_reserve`` as
``llama_context::sched_reserve`` does: the ``resolve_fused_ops`` probe graphs, pp → tg → pp
reserves, and the retry without pipeline parallelism. ``sched_new`` keeps the current scheduler
when its params can serve the new ones (``sched_params::can_reuse``), which every
:class:`~toolkit.reuse.ReserveEvent` explains.

>>> from toolkit.models import presets, ContextParams
>>> ctx = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=512, flash_attn="on", n_gpu_layers=0))
>>> ev = ctx.events[-1]
>>> ev.decision, ev.graphs["pp"], ctx.compute_buffers_bytes()
('rebuilt', GraphRecord(n_nodes=68, n_splits=1), {'CPU': 33233920})
>>> list(ev.memory)
['model', 'KV', 'output', 'compute']
>>> ctx.update(op_offload=False).decision, ctx.update(max_nodes=512).decision
('rebuilt', 'reused')
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from toolkit import validate
from toolkit.backend import Backend
from toolkit.backend.host import check_host_bytes
from toolkit.errors import AllocationError, ParameterError, ToolkitError
from toolkit.ggml.bulk import with_paused_gc
from toolkit.ggml.graph import Graph, GraphFull
from toolkit.models import ContextParams, HParams
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS, N_CTX_PAD
from toolkit.models.devices import describe_picker
from toolkit.models.graph import GraphResult
from toolkit.models.setup import ContextSetup, apply_pins, setup
from toolkit.reuse import (
    MODEL_GROUP,
    OUTPUT_GROUP,
    CompileEvent,
    ContextView,
    Reason,
    ReserveEvent,
    SchedParams,
    SchedulerHolder,
)
from toolkit.sched import Scheduler
from toolkit.view import ContextSettings, Control, ModelSettings, Runtime, device_controls, scheduler_controls

__all__ = ["Context", "LlamaContextView", "RunnableContext", "memory_groups"]

_SCHED_FIELDS = ("max_nodes", "parallel")
_DEVICE_FIELDS = ("devices", "split_mode", "main_gpu")
# resolve_fused_ops: GDN AR/chunked, Lightning Indexer, DSv4 HC pre/comb/post; graph_reserve rounds
# each up to a multiple of n_seqs (a probe must give every KV stream at least one token)
N_FUSED_OP_PROBES = (1, 16, 1, 1, 1, 1)
AUTO_MAX_NODES_TEXT = "llama_context::graph_max_nodes: max(1024, 8·n_tensors)"
# the sizes the dashboard offers (powers of two): n_ctx from llama_context's padding of 256 up, batches
N_CTX_OFFERED, N_BATCH_OFFERED = (N_CTX_PAD, 1 << 17), (1, 1 << 13)


@runtime_checkable
class LlamaContextView(ContextView, Protocol):
    """A :class:`~toolkit.reuse.ContextView` of a llama model: its params."""

    @property
    def cparams(self) -> ContextParams:
        """The context parameters (``llama_context_params``) of the current setup."""
        ...

    @property
    def hparams(self) -> HParams:
        """The model's hyperparameters."""
        ...


@runtime_checkable
class RunnableContext(LlamaContextView, Protocol):
    """What the JAX runtime (:mod:`toolkit.jaxrt.runtime`) reads of a llama context to run it:
    the model and memory it placed, the graph builder, and the holder its compilations are recorded in."""

    @property
    def setup(self) -> ContextSetup:
        """The model placement, KV cache and resolved params (``llama_context``'s model and memory)."""
        ...

    @property
    def gguf_path(self) -> str | None:
        """The GGUF file the context was made from (its weights), or None for a description only."""
        ...

    @property
    def holder(self) -> SchedulerHolder:
        """The scheduler and its events (``record_compile`` appends a CompileEvent)."""
        ...

    def build_llama_graph(self, n_tokens: int, n_seqs: int = 1, n_outputs: int | None = None,
                          graph_size: int | None = None, streams: tuple[int, int] | None = None) -> GraphResult:
        """Reset the scheduler and build the graph of a ubatch, pins applied (``llama_context::graph_get_cb``)."""
        ...


def _hparams(model: Any) -> HParams:
    if isinstance(model, HParams):
        return model
    if isinstance(model, str):
        if model.endswith(".gguf"):
            # lazy: the GGUF reader imports the gguf package (reads metadata only)
            from toolkit.models.gguf import hparams_from_gguf
            return hparams_from_gguf(model)
        from toolkit.models import presets
        return presets.get(model)
    if isinstance(model, dict):
        return HParams.from_dict(model)
    raise ParameterError("model", model, "HParams, a preset name, a .gguf path or a model dict")


class _CurrentBackends:
    """A context's backends as they are now (its setup may change), for its SchedulerHolder. It holds the
    context weakly: a closure over the context would make context and holder a reference cycle, which
    only CPython's cyclic collector frees (each of memory fitting's probe contexts, with its model and
    graphs, would stay alive until a collection)."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: Context) -> None:
        self._ctx = weakref.ref(ctx)

    def __call__(self) -> list[Backend]:
        ctx = self._ctx()
        if ctx is None:
            raise ToolkitError("the context of this scheduler holder no longer exists")
        return ctx.backends


class Context:
    """llama_context's scheduler side: ``sched_new`` (reuse) and ``sched_reserve``.

    ``max_nodes`` overrides ``graph_max_nodes``; ``parallel`` overrides the pipeline-parallel
    decision (None: llama_context's rule, see :func:`toolkit.models.setup.pipeline_parallel`).
    Every reserve appends a :class:`~toolkit.reuse.ReserveEvent`.
    """

    auto_max_nodes_text = AUTO_MAX_NODES_TEXT

    def __init__(self, model: Any, cparams: ContextParams | None = None, devices: Sequence[Backend] | None = None,
                 planner: str = "ggml", *, max_nodes: int | None = None, parallel: bool | None = None,
                 host_memory: int | None = None, no_alloc: bool = False, reserve: bool = True) -> None:
        # the most host memory a plan may ask for (scheduler metadata, CPU buffers); None: the machine's
        self.host_memory = validate.optional_integer("host_memory", host_memory, lo=0,
                                                     none_means="the machine's physical memory")
        # llama_model_params::no_alloc (memory fitting): the pp graph is only sized
        # (ggml_backend_sched_reserve_size), tg only split, and nothing is allocated
        self.no_alloc = validate.boolean("no_alloc", no_alloc)
        self.hparams = _hparams(model)
        # the runtime loads weights from here (toolkit.jaxrt); planning needs only the metadata
        self.gguf_path: str | None = model if isinstance(model, str) and model.endswith(".gguf") else None
        self.cparams: ContextParams = cparams if cparams is not None else ContextParams()
        self.backends_arg = list(devices) if devices is not None else None
        self.max_nodes_override = _check_max_nodes(max_nodes)
        self.parallel_override = None if parallel is None else validate.boolean("parallel", parallel)
        self.setup: ContextSetup = setup(self.hparams, self.cparams, self.backends_arg)
        self.pipeline_parallel = self.setup.pipeline_parallel if parallel is None else bool(parallel)
        self.holder = SchedulerHolder(_CurrentBackends(self), planner, host_memory=self.host_memory)
        self.fa_resolved = self.cparams.flash_attn != "auto"
        self.last_graph: GraphResult | None = None  # the GraphResult of the last build_graph (inputs, logits, pins)
        if reserve:   # reserve=False: the caller runs reserve_size (memory fitting's probes) instead
            self.sched_reserve(trigger="context created")

    # ---- the reuse layer's state ---------------------------------------------------------------
    @property
    def scheduler(self) -> Scheduler:
        return self.holder.sched

    @property
    def sched_params_cur(self) -> SchedParams | None:
        return self.holder.params_cur

    @property
    def sched_params_req(self) -> SchedParams | None:
        return self.holder.params_req

    @property
    def events(self) -> list[ReserveEvent]:
        return self.holder.events

    @property
    def compile_events(self) -> list[CompileEvent]:
        return self.holder.compile_events

    @property
    def warnings(self) -> list[str]:
        return self.holder.warnings

    @property
    def planner(self) -> str:
        return self.holder.planner

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``ggml_backend_sched_get_buffer_size`` per backend by buft name."""
        return self.holder.compute_buffers_bytes()

    # ---- what llama.cpp prints ---------------------------------------------------------------
    @property
    def backends(self) -> list[Backend]:
        return self.setup.backends

    @property
    def flash_attn(self) -> bool:
        return self.setup.flash_attn

    @property
    def model_buffers_bytes(self) -> dict[str, int]:
        return dict(self.setup.model.buffers_bytes)

    @property
    def model_buffer_lines(self) -> list[tuple[str, int]]:
        """One (buffer type, bytes) per model buffer, as ``load_tensors`` prints them (a split model's
        ``CPU_Mapped`` buffer is one per file with mmap); :attr:`model_buffers_bytes` sums them per type."""
        return list(self.setup.model.buffer_lines)

    @property
    def kv_buffers_bytes(self) -> dict[str, int]:
        return self.setup.memory.buffers_bytes()

    @property
    def kv_bytes(self) -> int:
        return self.setup.memory.total_bytes

    @property
    def output_buffer_bytes(self) -> dict[str, int]:
        return dict(self.setup.output_bytes)

    @property
    def layer_devices(self) -> list[tuple[int, str]]:
        return self.setup.layer_devices()

    @property
    def n_copies(self) -> int:
        return self.scheduler.n_copies

    # ---- what the dashboard reads --------------------------------------------------------------
    def settings(self) -> ContextSettings:
        """The controls a llama context offers (the device picker, the scheduler's params and the
        context params of llama_context_params), its model and the runtime's entry points."""
        cp, hp = self.cparams, self.hparams
        controls = (
            *device_controls(*describe_picker(cp.devices)),
            *scheduler_controls(self.max_nodes_override, self.auto_max_nodes_text, self.pipeline_parallel,
                                cp.op_offload),
            Control("n_ctx", "size", cp.n_ctx, "n_ctx", *N_CTX_OFFERED, carry=True),
            Control("n_batch", "size", cp.n_batch, "n_batch", *N_BATCH_OFFERED, carry=True),
            Control("n_ubatch", "size", cp.n_ubatch, "n_ubatch", *N_BATCH_OFFERED, carry=True),
            Control("flash_attn", "choice", cp.flash_attn, "flash_attn", options=("auto", "on", "off"), carry=True),
            # n_layer_all + 1 offloads every layer and the output layer, as any larger number does
            Control("n_gpu_layers", "count", cp.n_gpu_layers, "n_gpu_layers", 0, hp.n_layer_all + 1,
                    every=DEFAULT_N_GPU_LAYERS, carry=True),
            # --n-cpu-moe N (common_arg's "-ncmoe"): the expert weights of the first N layers stay on the CPU
            *((Control("n_cpu_moe", "count", cp.n_cpu_moe, "n_cpu_moe", 0, hp.n_layer),) if hp.moe is not None
              else ()),
        )
        return ContextSettings(hp.name, controls, ("layer", "split", "none"),
                               ModelSettings(hp.name, hp.n_layer, hp, cp, self.gguf_path),
                               Runtime(jax=True))

    # ---- graphs --------------------------------------------------------------------------------
    def max_nodes(self) -> int:
        """The override, else ``llama_context::graph_max_nodes``."""
        return self.max_nodes_override or self.auto_max_nodes()

    def auto_max_nodes(self) -> int:
        """``llama_context::graph_max_nodes`` for the current model and ubatch."""
        rp = self.setup.resolved
        return self.setup.graph_max_nodes(min(rp.n_ctx, rp.n_ubatch))

    def build_llama_graph(self, n_tokens: int, n_seqs: int = 1, n_outputs: int | None = None,
                          graph_size: int | None = None, streams: tuple[int, int] | None = None) -> GraphResult:
        """Reset the scheduler, build llama's graph and apply the graph callback's pins
        (``llama_context::graph_get_cb``); the GraphResult keeps its inputs, logits and pins.
        ``streams`` (first, last): the KV streams of the ubatch's sequences (default: all)."""
        self.scheduler.reset()
        lg = self.setup.build_graph(graph_size or self.max_nodes(), n_tokens, n_seqs,
                                    n_tokens if n_outputs is None else n_outputs, streams)
        return self._pinned(lg)

    def _pinned(self, lg: GraphResult) -> GraphResult:
        apply_pins(self.scheduler, lg, self.setup)
        self.last_graph = lg
        return lg

    def build_graph(self, n_tokens: int, n_seqs: int = 1, n_outputs: int | None = None,
                    graph_size: int | None = None) -> Graph:
        """:meth:`build_llama_graph`'s ggml graph (what the scheduler splits)."""
        return self.build_llama_graph(n_tokens, n_seqs, n_outputs, graph_size).graph

    def graph_reserve(self, n_tokens: int, n_seqs: int, n_outputs: int, *,
                      split_only: bool = False, sizes: bool = False) -> GraphResult | None:
        """``llama_context::graph_reserve``: the graph (a GraphResult), or None when allocation failed.

        ``sizes`` (no_alloc): ``ggml_backend_sched_reserve_size``, which resets the scheduler before
        splitting and so drops the backends the graph callback pinned while the graph was built."""
        n_tokens, n_outputs = reserve_shape(n_tokens, n_seqs, n_outputs)
        # the graph is split once and dropped: the setup lends its kept build instead of copying it
        self.scheduler.reset()
        lg = self._pinned(self.setup.lent_graph(self.max_nodes(), n_tokens, n_seqs, n_outputs))
        if sizes:
            self.scheduler.reserve_size(lg.graph)
            return lg
        if split_only:
            self.scheduler.split_graph(lg.graph)
            return lg
        return lg if self.scheduler.reserve(lg.graph) else None

    def _precheck(self, params: SchedParams) -> None:
        """Refuse a max_nodes too small for the graph before touching the scheduler (state kept)."""
        rp = self.setup.resolved
        n_tokens, n_outputs = reserve_shape(min(rp.n_ctx, rp.n_ubatch), rp.n_seq_max, min(rp.n_ctx, rp.n_ubatch))
        try:
            n_nodes, n_leafs = self.setup.graph_counts(params.max_nodes, n_tokens, rp.n_seq_max, n_outputs)
        except GraphFull as e:
            raise ParameterError("max_nodes", params.max_nodes, "room for every node of the graph",
                                 f"too small for the graph: {e}") from None
        h = self.holder.hash_capacity_for(params)
        if n_nodes + n_leafs > h:
            raise ParameterError(
                "max_nodes", params.max_nodes, "a hash set that holds every node and leaf",
                f"too small for the graph: n_nodes + n_leafs = {n_nodes} + {n_leafs} = "
                f"{n_nodes + n_leafs} exceeds the scheduler's hash capacity {h}")

    # ---- llama_context::sched_reserve -------------------------------------------------------------
    @with_paused_gc   # ten graph copies, splits and plans: see toolkit.ggml.bulk
    def sched_reserve(self, trigger: str = "sched_reserve", extra_reasons: Sequence[Reason] = ()) -> ReserveEvent:
        rp = self.setup.resolved
        n_seqs = rp.n_seq_max
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        n_outputs_pp = min(n_tokens, rp.n_outputs_max)
        params = SchedParams(self.max_nodes(), self.pipeline_parallel, self.cparams.op_offload)
        self._precheck(params)
        h = self.holder
        r = h.begin_reserve(params, extra_reasons)
        if self.setup.warnings and not self.setup.warned:
            r.warnings += self.setup.warnings   # logged once, when the memory is created
            self.setup.warned = True
        # resolve_fused_ops: split-only probes (flash attention only when auto)
        if not self.fa_resolved:
            self._resolve_flash_attn(n_seqs, r.warnings)
        # once a repeated probe changed nothing (Scheduler.split_state), the next repeats split the same graph
        # on the same state again; they are skipped two at a time, which also leaves ggml's two id arrays
        # (the current and the previous graph's backend ids, swapped at every split) as they would be
        probes, i, settled = N_FUSED_OP_PROBES, 0, False
        while i < len(probes):
            nt = probes[i]
            if settled and i + 1 < len(probes) and probes[i - 1] == nt == probes[i + 1]:
                i += 2
                continue
            before = self.scheduler.split_state()
            self.graph_reserve(nt, n_seqs, nt, split_only=True)
            settled = i > 0 and probes[i - 1] == nt and self.scheduler.split_state() == before
            i += 1
        t_probe = time.perf_counter()
        lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp, sizes=self.no_alloc)
        if lg is None and self.pipeline_parallel:
            self.pipeline_parallel = False
            h.fall_back(r)
            lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp)
        if lg is None:
            raise AllocationError(f"failed to allocate compute pp buffers: {h.alloc_failure()}")
        h.graph_reserved(r, "pp", lg.graph.n_nodes)
        lg_tg = self.graph_reserve(n_seqs, n_seqs, n_seqs, split_only=self.no_alloc)
        if lg_tg is None:
            raise AllocationError(f"failed to allocate compute tg buffers: {h.alloc_failure()}")
        # under no_alloc the tg graph is split only: llama.cpp sizes no tg plan
        h.graph_reserved(r, "tg", lg_tg.graph.n_nodes, sized=not self.no_alloc)
        lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp, sizes=self.no_alloc)
        if lg is None:
            raise AllocationError(f"failed to allocate compute pp buffers: {h.alloc_failure()}")
        h.graph_reserved(r, "pp", lg.graph.n_nodes)
        if not self.no_alloc:   # under no_alloc nothing is allocated on the host
            self._check_host_buffers()
        t_end = time.perf_counter()
        timings = {"sched_new": (r.t_new - r.t0) * 1e3, "probes": (t_probe - r.t_new) * 1e3,
                   "reserve": (t_end - t_probe) * 1e3, "total": (t_end - r.t0) * 1e3}
        return h.record(r, trigger, timings, memory_groups(self.setup), pipeline_parallel=self.pipeline_parallel)

    @with_paused_gc
    def reserve_size(self) -> dict[str, int]:
        """What memory fitting reads of a ``no_alloc`` context's reserve: ``ggml_backend_sched_reserve_size``
        over the pp graph, per compute buffer type (bytes the graph needs alone, 0 for a buft shared
        with an earlier backend), on a scheduler made by ``sched_new``.

        :meth:`sched_reserve` under ``no_alloc`` runs the same steps and more: the fused-op probes and
        the tg graph are split only, and the second pp reserve sizes the same graph again. Every
        ``ggml_backend_sched_reserve_size`` resets the scheduler and plans its graph from empty
        allocators (``ggml_gallocr_reserve_n_size``), so those steps do not change what this one
        returns; only the flash-attention probe of ``-fa auto`` changes the graph, and it runs here
        too. No :class:`~toolkit.reuse.ReserveEvent` is recorded."""
        rp = self.setup.resolved
        n_seqs = rp.n_seq_max
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        params = SchedParams(self.max_nodes(), self.pipeline_parallel, self.cparams.op_offload)
        self._precheck(params)
        self.holder.sched_new(params)
        self.holder.params_req = params
        if not self.fa_resolved:
            self._resolve_flash_attn(n_seqs, [])
        n_tokens, n_outputs = reserve_shape(n_tokens, n_seqs, min(n_tokens, rp.n_outputs_max))
        # graph_reserve's sizes path on a graph used once (ContextSetup.sized_graph); no pins:
        # ggml_backend_sched_reserve_size resets the scheduler before splitting
        s = self.scheduler
        s.reset()
        s.reserve_size(self.setup.sized_graph(self.max_nodes(), n_tokens, n_seqs, n_outputs).graph)
        out: dict[str, int] = {}
        for i, n in enumerate(s.graph_needed_sizes()):
            out[s.bufts[i].name] = out.get(s.bufts[i].name, 0) + n
        return out

    def _check_host_buffers(self) -> None:
        """Refuse a plan whose host buffers (KV cache, outputs, compute, weights not mapped from the
        file) exceed the host memory: llama.cpp would fail to allocate them."""
        s = self.scheduler
        host = {b.name for b in s.bufts if b.is_host}
        host |= {be.buft.name for be in self.backends if be.buft.is_host}
        host |= {be.host_buft.name for be in self.backends if be.host_buft is not None}
        compute = sum(s.buffer_size(i) for i in range(s.n_backends) if s.bufts[i].is_host)
        # every memory group (weights not mapped from the file, the context's memory, outputs)
        total = compute + sum(b for group, d in memory_groups(self.setup).items() for name, b in d.items()
                              if name in host and not (group == MODEL_GROUP and name.endswith("_Mapped")))
        rp = self.setup.resolved
        check_host_bytes(f"host buffers for n_ctx={rp.n_ctx}, n_ubatch={rp.n_ubatch}, n_seq_max={rp.n_seq_max} "
                         f"(KV cache, outputs, compute buffers)", total, limit=self.host_memory)

    def _resolve_flash_attn(self, n_seqs: int, warnings: list[str]) -> None:
        """-fa auto: FA stays on when every FLASH_ATTN_EXT runs on its layer's KV device."""
        st = self.setup
        st.flash_attn = True
        lg = self.graph_reserve(n_seqs, n_seqs, n_seqs, split_only=True)
        assert lg is not None
        s = self.scheduler
        for t, il in lg.fa_nodes:
            b = s.tensor_backend_id(t)
            if b < 0 or s.backends[b] is not st.model.layer_backend(il):
                st.flash_attn = False
                warnings.append(f"layer {il} is assigned to device {st.model.layer_device_name(il)} but the "
                                "Flash Attention tensor is not: Flash Attention disabled")
                break
        self.fa_resolved = True

    # ---- changes -------------------------------------------------------------------------------
    def update(self, **changes: Any) -> ReserveEvent:
        """Change context params and/or the ``max_nodes``/``parallel`` overrides, then sched_reserve.

        Bad input raises a :class:`~toolkit.errors.ToolkitError` naming the value and the limit; the
        context, its scheduler and its buffers stay as they were (an "error" event records the attempt).
        """
        trigger = "; ".join(f"{k} {self._current(k)} -> {self._shown(k, v)}" for k, v in changes.items()) \
            or "sched_reserve"
        return self.holder.update(self, trigger, lambda: self._apply(changes, trigger))

    def _apply(self, changes: Mapping[str, Any], trigger: str) -> ReserveEvent:
        cp_changes = {k: v for k, v in changes.items() if k not in _SCHED_FIELDS}
        new_cp = self.cparams.replace(**cp_changes) if cp_changes else self.cparams
        if "max_nodes" in changes:
            self.max_nodes_override = _check_max_nodes(changes["max_nodes"])
        reasons: list[Reason] = []
        if any(getattr(new_cp, k) != getattr(self.cparams, k) for k in new_cp.__dataclass_fields__
               if k != "op_offload"):
            same_devs = all(getattr(new_cp, k) == getattr(self.cparams, k) for k in _DEVICE_FIELDS)
            new_setup = setup(self.hparams, new_cp, self.backends_arg, self.setup.devices if same_devs else None)
            self.setup = new_setup
            self.fa_resolved = new_cp.flash_attn != "auto"
            self.pipeline_parallel = new_setup.pipeline_parallel
            if not same_devs:
                reasons.append(Reason("devices", ",".join(self.cparams.devices) or "CPU",
                                      ",".join(new_cp.devices) or "CPU"))
                self.holder.drop()  # other backends: no scheduler can be reused
        self.cparams = new_cp
        if "parallel" in changes:
            p = changes["parallel"]
            self.parallel_override = None if p is None else validate.boolean("parallel", p)
        if self.parallel_override is not None:
            self.pipeline_parallel = self.parallel_override
        elif "parallel" in changes:
            self.pipeline_parallel = self.setup.pipeline_parallel
        return self.sched_reserve(trigger, reasons)

    # ---- what SchedulerHolder.update saves and restores ----------------------------------------
    def save_state(self) -> object:
        return (self.cparams, self.setup, self.max_nodes_override, self.parallel_override, self.pipeline_parallel,
                self.fa_resolved)

    def restore_state(self, state: object) -> None:
        (self.cparams, self.setup, self.max_nodes_override, self.parallel_override, self.pipeline_parallel,
         self.fa_resolved) = state  # type: ignore[misc]

    def replan(self) -> None:
        """Reserve pp, tg, pp again on the current (freed) scheduler."""
        rp = self.setup.resolved
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        n_out = min(n_tokens, rp.n_outputs_max)
        self.graph_reserve(n_tokens, rp.n_seq_max, n_out)
        self.graph_reserve(rp.n_seq_max, rp.n_seq_max, rp.n_seq_max)
        self.graph_reserve(n_tokens, rp.n_seq_max, n_out)

    def _shown(self, key: str, value: Any) -> Any:
        """A change as the trigger shows it: max_nodes=None is llama.cpp's graph_max_nodes, "auto (N)"."""
        if key == "max_nodes" and value is None:
            return f"auto ({self.auto_max_nodes()})"
        return value

    def _current(self, key: str) -> Any:
        if key == "max_nodes":
            return self.sched_params_req.max_nodes if self.sched_params_req else None
        if key == "parallel":
            return self.pipeline_parallel
        return getattr(self.cparams, key, None)

    def __repr__(self) -> str:
        p = self.sched_params_cur
        return (f"Context({self.hparams.name}, backends=[{', '.join(b.name for b in self.backends)}], "
                f"sched={p}, events={len(self.events)})")


def memory_groups(st: ContextSetup) -> dict[str, dict[str, int]]:
    """A context's memory by group, as its reserve events record it (buffer name -> bytes per group):
    the weights (``model``), the memory ``llama_model::create_memory`` made, one group per cache
    (``KV``; ``llama_kv_cache_iswa``: ``KV`` for the non-SWA cache and ``KV-SWA``), and the output
    buffer (``output``). The scheduler adds its compute buffers (``compute``)."""
    return {MODEL_GROUP: dict(st.model.buffers_bytes), **st.memory.groups, OUTPUT_GROUP: dict(st.output_bytes)}


def reserve_shape(n_tokens: int, n_seqs: int, n_outputs: int) -> tuple[int, int]:
    """``llama_context::graph_reserve`` makes n_tokens a multiple of n_seqs (rounding up)."""
    if n_tokens % n_seqs:
        n_tokens = -(-n_tokens // n_seqs) * n_seqs
        n_outputs = max(n_outputs, n_tokens)
    return n_tokens, n_outputs


def _check_max_nodes(max_nodes: Any) -> int | None:
    # graph_max_nodes is a uint32_t in llama.cpp; what the hash set for it costs is checked later
    return validate.optional_integer("max_nodes", max_nodes, lo=1, hi=validate.UINT32_MAX,
                                     none_means="llama_context::graph_max_nodes")

