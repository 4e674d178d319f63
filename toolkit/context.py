"""The llama_context analog: scheduler params, the reuse rule (seed #32009), sched_reserve, events.

:class:`Context` owns the model placement, the KV cache and the backend scheduler, and runs
``sched_reserve`` as llama.cpp does (spec §7.5): fused-op probe graphs, pp → tg → pp
reserves, and the fallback without pipeline parallelism. ``sched_new`` keeps the current
scheduler when its params can serve the new ones (§8), which every :class:`ReserveEvent`
explains.

>>> from toolkit.models import presets, ContextParams
>>> ctx = Context(presets.tiny(), ContextParams(n_ctx=256, n_ubatch=512, flash_attn="on", n_gpu_layers=0))
>>> ev = ctx.events[-1]
>>> ev.decision, ev.n_nodes_pp, ev.n_splits_pp, ctx.compute_buffers_bytes()
('rebuilt', 68, 1, {'CPU': 33233920})
>>> ctx.update(op_offload=False).decision, ctx.update(max_nodes=512).decision
('rebuilt', 'reused')
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from toolkit.events import BufferSize, Decision, Reason, ReserveEvent, reasons_for
from toolkit.ggml.graph import GraphFull
from toolkit.models import ContextParams, LlamaHParams, presets
from toolkit.models.setup import LlamaSetup, apply_pins, graph_max_nodes, setup
from toolkit.sched import Scheduler, hash_size, host_metadata_bytes

__all__ = ["BufferSize", "Context", "Decision", "Reason", "ReserveEvent", "SchedParams", "SchedulerOwner"]

@dataclass(frozen=True)
class SchedParams:
    """``llama_context::sched_params`` from the seed diff."""

    max_nodes: int
    parallel: bool
    op_offload: bool

    def can_reuse(self, other: SchedParams) -> bool:
        """A scheduler built with ``other`` can serve these params (the seed's rule)."""
        return (
            self.parallel == other.parallel
            and self.op_offload == other.op_offload
            and self.max_nodes <= other.max_nodes
        )


@dataclass
class _Reserve:
    """One sched_reserve in progress: what sched_new decided, and what the old scheduler held."""

    t0: float
    t_new: float
    prev: SchedParams | None
    reused: bool
    reasons: list[Reason]
    decision: Decision
    host_bytes: int
    kept: dict[str, int]
    kept_hash: int
    kept_caps: tuple[int, ...]
    warnings: list[str] = field(default_factory=list)


class SchedulerOwner:
    """The seed's half of ``llama_context`` (#32009): one scheduler, the params it was built with,
    ``sched_new`` that keeps it when :meth:`SchedParams.can_reuse` holds, and the ReserveEvents.

    :class:`Context` (llama graphs) and ``toolkit.trace.TracedContext`` (traced JAX functions)
    share it; each brings its graphs, its backends and its ``sched_reserve`` sequence.
    """

    planner: str = "ggml"
    scheduler: Any = None
    sched_params_cur: SchedParams | None = None   # what the scheduler was built with
    sched_params_req: SchedParams | None = None   # what the last reserve asked for

    def _init_owner(self, planner: str) -> None:
        self.planner = planner
        self.scheduler = None
        self.sched_params_cur = None
        self.sched_params_req = None
        self.events: list[ReserveEvent] = []
        self.warnings: list[str] = []

    @property
    def backends(self) -> list[Any]:
        raise NotImplementedError

    def would_reuse(self, params: SchedParams) -> bool:
        return self.scheduler is not None and self.sched_params_cur is not None \
            and params.can_reuse(self.sched_params_cur)

    def sched_new(self, params: SchedParams) -> bool:
        """Keep the current scheduler when it can serve ``params``; else create one. True = reused."""
        if self.would_reuse(params):
            return True
        if self.scheduler is not None:
            self.scheduler.free()  # the old scheduler's compute buffers go with it
        self.scheduler = Scheduler(self.backends, None, params.max_nodes, params.parallel, params.op_offload,
                                   self.planner)
        self.sched_params_cur = params
        return False

    def hash_capacity_for(self, params: SchedParams) -> int:
        """The hash set that will serve ``params``: a reused scheduler keeps its larger one (§8)."""
        return self.scheduler.hash_size if self.would_reuse(params) else hash_size(params.max_nodes)

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``get_buffer_size`` per backend by buft name, zero-sized buffers included."""
        out: dict[str, int] = {}
        for i in range(self.scheduler.n_backends):
            name = self.scheduler.bufts[i].name
            out[name] = out.get(name, 0) + self.scheduler.buffer_size(i)
        return out

    def _alloc_failure(self) -> str:
        s = self.scheduler
        w = s.warnings[-1] if s.warnings else "a compute buffer exceeds its device budget"
        limits = [f"{b.name} budget {b.alloc_limit} B" for b in dict.fromkeys(s.bufts) if b.alloc_limit is not None]
        return w + (f" ({', '.join(limits)})" if limits else "")

    def _begin_reserve(self, params: SchedParams, extra_reasons: Sequence[Reason]) -> _Reserve:
        t0 = time.perf_counter()
        prev, old = self.sched_params_cur, self.scheduler
        kept = {old.bufts[i].name: old.buffer_size(i) for i in range(old.n_backends)} if old is not None else {}
        kept_hash, kept_caps = (old.hash_size, old.split_capacities) if old is not None else (0, ())
        reused = self.sched_new(params)
        self.sched_params_req = params
        return _Reserve(t0, time.perf_counter(), prev, reused, list(extra_reasons) + reasons_for(prev, params, reused),
                        "reused" if reused else "rebuilt", 0 if reused else self.scheduler.host_metadata_bytes,
                        kept, kept_hash, tuple(kept_caps))

    def _fall_back(self, r: _Reserve) -> None:
        """llama.cpp's retry when allocation failed with pipeline parallelism (§7.5 step 7)."""
        assert self.sched_params_req is not None
        r.warnings.append("compute buffer allocation failed, retrying without pipeline parallelism")
        r.decision = "fallback"
        r.reasons.append(Reason("parallel", True, False))
        self.sched_params_req = SchedParams(self.sched_params_req.max_nodes, False, self.sched_params_req.op_offload)
        self.sched_new(self.sched_params_req)
        r.host_bytes += self.scheduler.host_metadata_bytes

    def _record(self, r: _Reserve, trigger: str, needed_tg: Sequence[int], timings_ms: dict[str, float],
                **fields: Any) -> ReserveEvent:
        """Append the ReserveEvent of a finished reserve (the scheduler holds the final plan)."""
        s = self.scheduler
        assert self.sched_params_req is not None
        needed = s.graph_needed_sizes()
        buffers = tuple(BufferSize(be.name, s.bufts[i].name, s.buffer_size(i), needed[i], needed_tg[i])
                        for i, be in enumerate(s.backends))
        self.warnings += r.warnings
        saved = host_metadata_bytes(self.sched_params_req.max_nodes, s.n_backends, s.n_copies) if r.reused else 0
        ev = ReserveEvent(
            index=len(self.events), decision=r.decision, reasons=tuple(r.reasons), params=self.sched_params_req,
            previous=r.prev, trigger=trigger, timings_ms=timings_ms, host_metadata_bytes=r.host_bytes,
            saved_host_metadata_bytes=saved, hash_size=s.hash_size, split_capacities=s.split_capacities,
            buffers=buffers, n_copies=s.n_copies, warnings=tuple(r.warnings), plan=s.plan(),
            kept_buffers=r.kept if r.reused else {}, kept_hash_size=r.kept_hash if r.reused else 0,
            kept_split_capacities=tuple(c for c in r.kept_caps if c > 30) if r.reused else (),
            n_backends=s.n_backends, **fields,
        )
        self.events.append(ev)
        return ev

    def _record_error(self, trigger: str, error: Exception) -> None:
        cur = self.sched_params_cur or SchedParams(0, False, False)
        req = self.sched_params_req or cur
        self.events.append(ReserveEvent(len(self.events), "error", (), req, cur, trigger, error=str(error)))


# ---- the context ------------------------------------------------------------------------------

_SCHED_FIELDS = ("max_nodes", "parallel")
_DEVICE_FIELDS = ("devices", "split_mode", "main_gpu")
# resolve_fused_ops: GDN AR/chunked, Lightning Indexer, DSv4 HC pre/comb/post; graph_reserve rounds
# each up to a multiple of n_seqs (a probe must give every KV stream at least one token)
N_FUSED_OP_PROBES = (1, 16, 1, 1, 1, 1)


def _hparams(model: Any) -> LlamaHParams:
    if isinstance(model, LlamaHParams):
        return model
    if isinstance(model, str):
        if model.endswith(".gguf"):
            from toolkit.models.gguf import hparams_from_gguf  # reads metadata only
            return hparams_from_gguf(model)
        return presets.get(model)
    if isinstance(model, dict):
        return LlamaHParams.from_dict(model)
    raise ValueError(f"model {model!r} is not LlamaHParams, a preset name, a .gguf path or a model dict")


class Context(SchedulerOwner):
    """llama_context's scheduler side: ``sched_new`` (reuse, §8) and ``sched_reserve`` (§7.5).

    ``max_nodes`` overrides ``graph_max_nodes``; ``parallel`` overrides the pipeline-parallel
    decision (None: llama.cpp's §7.3 rule). Every reserve appends a :class:`ReserveEvent`.
    """

    def __init__(self, model: Any, cparams: Any = None, devices: Sequence[Any] | None = None,
                 planner: str = "ggml", *, max_nodes: int | None = None, parallel: bool | None = None) -> None:
        self.hparams = _hparams(model)
        # the runtime loads weights from here (toolkit.jaxrt); planning needs only the metadata
        self.gguf_path: str | None = model if isinstance(model, str) and model.endswith(".gguf") else None
        self.cparams: ContextParams = cparams if cparams is not None else ContextParams()
        self._backends_arg = list(devices) if devices is not None else None
        self.max_nodes_override = self._check_max_nodes(max_nodes)
        self.parallel_override = parallel
        self.setup: LlamaSetup = setup(self.hparams, self.cparams, self._backends_arg)
        self.pipeline_parallel = self.setup.pipeline_parallel if parallel is None else bool(parallel)
        self._init_owner(planner)
        self._fa_resolved = self.cparams.flash_attn != "auto"
        self.sched_reserve(trigger="context created")

    # ---- what llama.cpp prints ---------------------------------------------------------------
    @property
    def backends(self) -> list[Any]:
        return self.setup.backends

    @property
    def flash_attn(self) -> bool:
        return self.setup.flash_attn

    @property
    def model_buffers_bytes(self) -> dict[str, int]:
        return dict(self.setup.model.buffers_bytes)

    @property
    def kv_buffers_bytes(self) -> dict[str, int]:
        return self.setup.kv_buffers_bytes()

    @property
    def kv_bytes(self) -> int:
        return sum(c.total_bytes for c in self.setup.kv_caches)

    @property
    def output_buffer_bytes(self) -> dict[str, int]:
        return dict(self.setup.output_bytes)

    @property
    def layer_devices(self) -> list[tuple[int, str]]:
        return self.setup.layer_devices()

    @property
    def n_copies(self) -> int:
        return self.scheduler.n_copies

    # ---- graphs --------------------------------------------------------------------------------
    def _max_nodes(self) -> int:
        rp = self.setup.resolved
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        return self.max_nodes_override or graph_max_nodes(self.setup.model.n_tensors, n_tokens)

    def build_graph(self, n_tokens: int, n_seqs: int = 1, n_outputs: int | None = None,
                    graph_size: int | None = None) -> Any:
        """Reset the scheduler, build llama's graph and apply the graph callback's pins (§7.4)."""
        self.scheduler.reset()
        lg = self.setup.builder(graph_size or self._max_nodes()).build(
            n_tokens, n_seqs, n_tokens if n_outputs is None else n_outputs)
        apply_pins(self.scheduler, lg, self.setup)
        self._last_graph = lg
        return lg.graph

    def graph_reserve(self, n_tokens: int, n_seqs: int, n_outputs: int, *, split_only: bool = False) -> Any:
        """llama_context::graph_reserve: the graph (a LlamaGraph), or None when allocation failed."""
        if n_tokens % n_seqs:
            n_tokens = -(-n_tokens // n_seqs) * n_seqs
            n_outputs = max(n_outputs, n_tokens)
        self.build_graph(n_tokens, n_seqs, n_outputs)
        lg = self._last_graph
        if split_only:
            self.scheduler.split_graph(lg.graph)
            return lg
        return lg if self.scheduler.reserve(lg.graph) else None

    def _check_max_nodes(self, max_nodes: int | None) -> int | None:
        if max_nodes is not None and (not isinstance(max_nodes, int) or max_nodes <= 0):
            raise ValueError(f"max_nodes={max_nodes!r} must be a positive integer")
        return max_nodes

    def _precheck(self, params: SchedParams) -> None:
        """Refuse a max_nodes too small for the graph before touching the scheduler (state kept)."""
        rp = self.setup.resolved
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        try:
            g = self.setup.builder(params.max_nodes).build(n_tokens, rp.n_seq_max, n_tokens).graph
        except GraphFull as e:
            raise ValueError(f"max_nodes={params.max_nodes} is too small for the graph: {e}") from None
        h = self.hash_capacity_for(params)
        if g.n_nodes + g.n_leafs > h:
            raise ValueError(
                f"max_nodes={params.max_nodes} is too small for the graph: n_nodes + n_leafs = "
                f"{g.n_nodes} + {g.n_leafs} = {g.n_nodes + g.n_leafs} exceeds the scheduler's hash capacity {h}")

    # ---- sched_reserve (§7.5) -------------------------------------------------------------------
    def sched_reserve(self, trigger: str = "sched_reserve", extra_reasons: Sequence[Reason] = ()) -> ReserveEvent:
        rp = self.setup.resolved
        n_seqs = rp.n_seq_max
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        n_outputs_pp = min(n_tokens, rp.n_outputs_max)
        params = SchedParams(self._max_nodes(), self.pipeline_parallel, self.cparams.op_offload)
        self._precheck(params)
        r = self._begin_reserve(params, extra_reasons)
        if self.setup.warnings and not self.setup.warned:
            r.warnings += self.setup.warnings   # logged once, when the memory is created
            self.setup.warned = True
        # resolve_fused_ops: split-only probes (flash attention only when auto)
        if not self._fa_resolved:
            self._resolve_flash_attn(n_seqs, r.warnings)
        for nt in N_FUSED_OP_PROBES:
            self.graph_reserve(nt, n_seqs, nt, split_only=True)
        t_probe = time.perf_counter()
        lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp)
        if lg is None and self.pipeline_parallel:
            self.pipeline_parallel = False
            self._fall_back(r)
            lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp)
        if lg is None:
            raise _AllocFailed(f"failed to allocate compute pp buffers: {self._alloc_failure()}")
        n_splits_pp, n_nodes_pp = self.scheduler.n_splits, lg.graph.n_nodes
        lg_tg = self.graph_reserve(n_seqs, n_seqs, n_seqs)
        if lg_tg is None:
            raise _AllocFailed(f"failed to allocate compute tg buffers: {self._alloc_failure()}")
        n_splits_tg, n_nodes_tg = self.scheduler.n_splits, lg_tg.graph.n_nodes
        needed_tg = self.scheduler.graph_needed_sizes()
        lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp)
        if lg is None:
            raise _AllocFailed(f"failed to allocate compute pp buffers: {self._alloc_failure()}")
        t_end = time.perf_counter()
        timings = {"sched_new": (r.t_new - r.t0) * 1e3, "probes": (t_probe - r.t_new) * 1e3,
                   "reserve": (t_end - t_probe) * 1e3, "total": (t_end - r.t0) * 1e3}
        return self._record(
            r, trigger, needed_tg, timings,
            kv_bytes=self.setup.kv_buffers_by_cache(),
            model_bytes=self.model_buffers_bytes, output_bytes=self.output_buffer_bytes,
            n_nodes_pp=n_nodes_pp, n_nodes_tg=n_nodes_tg, n_splits_pp=n_splits_pp, n_splits_tg=n_splits_tg,
            pipeline_parallel=self.pipeline_parallel)

    def _resolve_flash_attn(self, n_seqs: int, warnings: list[str]) -> None:
        """-fa auto: FA stays on when every FLASH_ATTN_EXT runs on its layer's KV device."""
        st = self.setup
        st.flash_attn = True
        lg = self.graph_reserve(n_seqs, n_seqs, n_seqs, split_only=True)
        s = self.scheduler
        for t, il in lg.fa_nodes:
            b = s.tensor_backend_id(t)
            if b < 0 or s.backends[b] is not st.model.layer_backend(il):
                st.flash_attn = False
                warnings.append(f"layer {il} is assigned to device {st.model.layer_device_name(il)} but the "
                                "Flash Attention tensor is not: Flash Attention disabled")
                break
        self._fa_resolved = True

    # ---- changes -------------------------------------------------------------------------------
    def update(self, **changes: Any) -> ReserveEvent:
        """Change context params and/or the ``max_nodes``/``parallel`` overrides, then sched_reserve.

        Bad input raises ValueError naming the value and the limit; the context, its scheduler and
        its buffers stay as they were (an "error" event records the attempt).
        """
        saved = (self.cparams, self.setup, self.max_nodes_override, self.parallel_override, self.pipeline_parallel,
                 self.scheduler, self.sched_params_cur, self.sched_params_req, self._fa_resolved)
        old_sizes = None if self.scheduler is None else self.scheduler.buffer_sizes()
        trigger = "; ".join(f"{k} {self._current(k)} -> {self._shown(k, v)}" for k, v in changes.items()) \
            or "sched_reserve"
        try:
            cp_changes = {k: v for k, v in changes.items() if k not in _SCHED_FIELDS}
            new_cp = self.cparams.replace(**cp_changes) if cp_changes else self.cparams
            if "max_nodes" in changes:
                self.max_nodes_override = self._check_max_nodes(changes["max_nodes"])
            reasons: list[Reason] = []
            if any(getattr(new_cp, k) != getattr(self.cparams, k) for k in new_cp.__dataclass_fields__
                   if k != "op_offload"):
                same_devs = all(getattr(new_cp, k) == getattr(self.cparams, k) for k in _DEVICE_FIELDS)
                new_setup = setup(self.hparams, new_cp, self._backends_arg, self.setup.devices if same_devs else None)
                self.setup = new_setup
                self._fa_resolved = new_cp.flash_attn != "auto"
                self.pipeline_parallel = new_setup.pipeline_parallel
                if not same_devs:
                    reasons.append(Reason("devices", ",".join(self.cparams.devices) or "CPU",
                                          ",".join(new_cp.devices) or "CPU"))
                    if self.scheduler is not None:
                        self.scheduler.free()
                    self.scheduler = None  # other backends: no scheduler can be reused
            self.cparams = new_cp
            if "parallel" in changes:
                p = changes["parallel"]
                self.parallel_override = None if p is None else bool(p)
            if self.parallel_override is not None:
                self.pipeline_parallel = self.parallel_override
            elif "parallel" in changes:
                self.pipeline_parallel = self.setup.pipeline_parallel
            return self.sched_reserve(trigger, reasons)
        except Exception as e:
            failed = self.scheduler
            (self.cparams, self.setup, self.max_nodes_override, self.parallel_override, self.pipeline_parallel,
             self.scheduler, self.sched_params_cur, self.sched_params_req, self._fa_resolved) = saved
            if failed is not None and failed is not self.scheduler:
                failed.free()
            if self.scheduler is not None and old_sizes is not None and self.scheduler.buffer_sizes() != old_sizes:
                self._restore_buffers()
            self._record_error(trigger, e)
            if isinstance(e, ValueError):
                raise
            raise ValueError(str(e)) from e

    def _restore_buffers(self) -> None:
        # the failed attempt freed or grew the previous scheduler's buffers: plan them again from scratch
        self.scheduler.free()
        rp = self.setup.resolved
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        n_out = min(n_tokens, rp.n_outputs_max)
        self.graph_reserve(n_tokens, rp.n_seq_max, n_out)
        self.graph_reserve(rp.n_seq_max, rp.n_seq_max, rp.n_seq_max)
        self.graph_reserve(n_tokens, rp.n_seq_max, n_out)

    def _shown(self, key: str, value: Any) -> Any:
        """A change as the trigger shows it: max_nodes=None is llama.cpp's graph_max_nodes, "auto (N)"."""
        if key == "max_nodes" and value is None:
            rp = self.setup.resolved
            return f"auto ({graph_max_nodes(self.setup.model.n_tensors, min(rp.n_ctx, rp.n_ubatch))})"
        return value

    def _current(self, key: str) -> Any:
        if key == "max_nodes":
            return self.sched_params_req.max_nodes if self.sched_params_req else None
        if key == "parallel":
            return self.pipeline_parallel
        return getattr(self.cparams, key, None)

    # ---- execution (the JAX runtime, loaded on demand) ------------------------------------------
    def decode(self, tokens: Any, **kwargs: Any) -> Any:
        """Run a ubatch through the scheduled graph on JAX (``toolkit.jaxrt``; imported only here)."""
        import importlib
        jaxrt = importlib.import_module("toolkit.jaxrt")
        fn = getattr(jaxrt, "decode", None)
        if fn is None:
            raise RuntimeError("toolkit.jaxrt provides no decode(ctx, tokens)")
        return fn(self, tokens, **kwargs)

    def compile(self, n_tokens: int | None = None) -> dict[str, Any]:
        """Compile every split for its device (``toolkit.jaxrt.compile_splits``); the report is also
        attached to the newest ReserveEvent's ``compile`` field."""
        import dataclasses
        import importlib
        info: dict[str, Any] = importlib.import_module("toolkit.jaxrt").compile_splits(self, n_tokens)
        if self.events:
            self.events[-1] = dataclasses.replace(self.events[-1], compile=dict(info))
        return info

    def generate(self, prompt_ids: Any, n: int) -> Any:
        """Greedy generation on JAX (``toolkit.jaxrt.generate``)."""
        import importlib
        return importlib.import_module("toolkit.jaxrt").generate(self, prompt_ids, n)

    @property
    def last_graph(self) -> Any:
        """The LlamaGraph of the last build_graph / graph_reserve (inputs, logits, pins)."""
        return getattr(self, "_last_graph", None)

    def __repr__(self) -> str:
        p = self.sched_params_cur
        return (f"Context({self.hparams.name}, backends=[{', '.join(b.name for b in self.backends)}], "
                f"sched={p}, events={len(self.events)})")


class _AllocFailed(ValueError):
    """A reserve could not allocate its compute buffers (llama.cpp throws from the constructor)."""
