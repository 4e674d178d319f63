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
from typing import Any, Literal

from toolkit.ggml.graph import GraphFull
from toolkit.models import ContextParams, LlamaHParams, presets
from toolkit.models.setup import LlamaSetup, apply_pins, graph_max_nodes, setup
from toolkit.sched import Scheduler, hash_size, host_metadata_bytes
from toolkit.sched.plan import Plan

Decision = Literal["reused", "rebuilt", "fallback", "error"]


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


@dataclass(frozen=True)
class Reason:
    """One (field, before, after) explaining a rebuild (or what reuse relied on)."""

    field: str
    before: object
    after: object

    def __str__(self) -> str:
        if self.field == "max_nodes":
            rel = ">" if (self.after or 0) > (self.before or 0) else "<="  # type: ignore[operator]
            return f"max_nodes {self.after} {rel} {self.before}"
        fmt = {True: "on", False: "off"}
        b = fmt.get(self.before, self.before) if isinstance(self.before, bool) else self.before  # type: ignore[call-overload]
        a = fmt.get(self.after, self.after) if isinstance(self.after, bool) else self.after  # type: ignore[call-overload]
        return f"{self.field} {b} \u2192 {a}"


@dataclass(frozen=True)
class BufferSize:
    """One scheduler backend's compute buffer after a reserve."""

    backend: str
    buft: str
    allocated: int       # what the scheduler holds (buffers only grow)
    needed_pp: int       # what the pp graph alone needs
    needed_tg: int       # what the tg graph alone needs


@dataclass(frozen=True)
class ReserveEvent:
    index: int
    decision: Decision
    reasons: tuple[Reason, ...]
    params: SchedParams
    previous: SchedParams | None
    trigger: str                                   # what the user changed, e.g. "n_ctx 256 -> 1024"
    timings_ms: dict[str, float] = field(default_factory=dict)
    host_metadata_bytes: int = 0                   # allocated by sched_new (0 when reused)
    saved_host_metadata_bytes: int = 0             # what reuse avoided allocating
    hash_size: int = 0
    split_capacities: tuple[int, ...] = ()
    buffers: tuple[BufferSize, ...] = ()
    kv_bytes: dict[str, int] = field(default_factory=dict)
    model_bytes: dict[str, int] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)
    n_nodes_pp: int = 0
    n_nodes_tg: int = 0
    n_splits_pp: int = 0
    n_splits_tg: int = 0
    n_copies: int = 1
    pipeline_parallel: bool = False
    warnings: tuple[str, ...] = ()
    error: str | None = None
    plan: Plan | None = None                       # the final (pp) plan, for split map and layout
    compile: dict[str, object] = field(default_factory=dict)  # runtime: compiled / cache hit, ms
    # what a reused scheduler carried over: buffer sizes held before this reserve (by buft), its hash
    # capacity, and the split input capacities that had grown past GGML_SCHED_MAX_SPLIT_INPUTS
    kept_buffers: dict[str, int] = field(default_factory=dict)
    kept_hash_size: int = 0
    kept_split_capacities: tuple[int, ...] = ()
    n_backends: int = 0

    def to_text(self) -> str:
        why = "; ".join(str(r) for r in self.reasons) or "-"
        bufs = ", ".join(f"{b.buft}={b.allocated}" for b in self.buffers)
        head = f"#{self.index} {self.decision:8s} [{self.trigger}] {why}"
        if self.error:
            return f"{head}\n    error: {self.error}"
        return (f"{head}\n    max_nodes={self.params.max_nodes} parallel={self.params.parallel} "
                f"op_offload={self.params.op_offload} hash={self.hash_size} n_copies={self.n_copies}"
                f"\n    nodes pp/tg={self.n_nodes_pp}/{self.n_nodes_tg} splits pp/tg={self.n_splits_pp}/"
                f"{self.n_splits_tg} buffers: {bufs}"
                f"\n    host metadata {self.host_metadata_bytes} B, saved {self.saved_host_metadata_bytes} B, "
                f"planning {self.timings_ms.get('reserve', 0.0):.2f} ms")

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index, "decision": self.decision, "trigger": self.trigger,
            "reasons": [[r.field, r.before, r.after] for r in self.reasons],
            "params": vars(self.params), "previous": vars(self.previous) if self.previous else None,
            "timings_ms": self.timings_ms, "host_metadata_bytes": self.host_metadata_bytes,
            "saved_host_metadata_bytes": self.saved_host_metadata_bytes, "hash_size": self.hash_size,
            "split_capacities": list(self.split_capacities),
            "buffers": [vars(b) for b in self.buffers], "kv_bytes": self.kv_bytes, "model_bytes": self.model_bytes,
            "output_bytes": self.output_bytes, "n_nodes_pp": self.n_nodes_pp, "n_nodes_tg": self.n_nodes_tg,
            "n_splits_pp": self.n_splits_pp, "n_splits_tg": self.n_splits_tg, "n_copies": self.n_copies,
            "pipeline_parallel": self.pipeline_parallel, "warnings": list(self.warnings), "error": self.error,
            "kept_buffers": self.kept_buffers, "kept_hash_size": self.kept_hash_size,
            "kept_split_capacities": list(self.kept_split_capacities),
        }



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


class Context:
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
        self.planner = planner
        self._backends_arg = list(devices) if devices is not None else None
        self.max_nodes_override = self._check_max_nodes(max_nodes)
        self.parallel_override = parallel
        self.setup: LlamaSetup = setup(self.hparams, self.cparams, self._backends_arg)
        self.pipeline_parallel = self.setup.pipeline_parallel if parallel is None else bool(parallel)
        self.scheduler: Any = None
        self.sched_params_cur: SchedParams | None = None   # what the scheduler was built with
        self.sched_params_req: SchedParams | None = None   # what the last reserve asked for
        self.events: list[ReserveEvent] = []
        self.warnings: list[str] = []
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
        return dict(self.setup.kv.buffers_bytes)

    @property
    def kv_bytes(self) -> int:
        return self.setup.kv.total_bytes

    @property
    def output_buffer_bytes(self) -> dict[str, int]:
        return dict(self.setup.output_bytes)

    @property
    def layer_devices(self) -> list[tuple[int, str]]:
        return self.setup.layer_devices()

    @property
    def n_copies(self) -> int:
        return self.scheduler.n_copies

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``get_buffer_size`` per backend by buft name, zero-sized buffers included."""
        out: dict[str, int] = {}
        for i in range(self.scheduler.n_backends):
            name = self.scheduler.bufts[i].name
            out[name] = out.get(name, 0) + self.scheduler.buffer_size(i)
        return out

    # ---- the seed (#32009) -------------------------------------------------------------------
    def sched_new(self, params: SchedParams) -> bool:
        """Keep the current scheduler when it can serve ``params``; else create one. True = reused."""
        if self.scheduler is not None and self.sched_params_cur is not None \
                and params.can_reuse(self.sched_params_cur):
            return True
        if self.scheduler is not None:
            self.scheduler.free()  # the old scheduler's compute buffers go with it
        self.scheduler = Scheduler(self.backends, None, params.max_nodes, params.parallel, params.op_offload,
                                   self.planner)
        self.sched_params_cur = params
        return False

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
        reuse = self.scheduler is not None and self.sched_params_cur is not None \
            and params.can_reuse(self.sched_params_cur)
        h = self.scheduler.hash_size if reuse else hash_size(params.max_nodes)
        if g.n_nodes + g.n_leafs > h:
            raise ValueError(
                f"max_nodes={params.max_nodes} is too small for the graph: n_nodes + n_leafs = "
                f"{g.n_nodes} + {g.n_leafs} = {g.n_nodes + g.n_leafs} exceeds the scheduler's hash capacity {h}")

    # ---- sched_reserve (§7.5) -------------------------------------------------------------------
    def sched_reserve(self, trigger: str = "sched_reserve", extra_reasons: Sequence[Reason] = ()) -> ReserveEvent:
        t0 = time.perf_counter()
        rp = self.setup.resolved
        n_seqs = rp.n_seq_max
        n_tokens = min(rp.n_ctx, rp.n_ubatch)
        n_outputs_pp = min(n_tokens, rp.n_outputs_max)
        params = SchedParams(self._max_nodes(), self.pipeline_parallel, self.cparams.op_offload)
        self._precheck(params)
        prev, old = self.sched_params_cur, self.scheduler
        kept: dict[str, int] = {}
        if old is not None:
            kept = {old.bufts[i].name: old.buffer_size(i) for i in range(old.n_backends)}
        kept_hash, kept_caps = (old.hash_size, old.split_capacities) if old is not None else (0, ())
        reused = self.sched_new(params)
        self.sched_params_req = params
        t_new = time.perf_counter()
        reasons = list(extra_reasons) + _reasons(prev, params, reused)
        decision: Decision = "reused" if reused else "rebuilt"
        warnings: list[str] = []
        host_bytes = 0 if reused else self.scheduler.host_metadata_bytes
        # resolve_fused_ops: split-only probes (flash attention only when auto)
        if not self._fa_resolved:
            self._resolve_flash_attn(n_seqs, warnings)
        for nt in N_FUSED_OP_PROBES:
            self.graph_reserve(nt, n_seqs, nt, split_only=True)
        t_probe = time.perf_counter()
        lg = self.graph_reserve(n_tokens, n_seqs, n_outputs_pp)
        if lg is None and self.pipeline_parallel:
            warnings.append("compute buffer allocation failed, retrying without pipeline parallelism")
            self.pipeline_parallel = False
            decision = "fallback"
            reasons.append(Reason("parallel", True, False))
            self.sched_params_req = SchedParams(params.max_nodes, False, params.op_offload)
            self.sched_new(self.sched_params_req)
            host_bytes += self.scheduler.host_metadata_bytes
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
        s = self.scheduler
        needed_pp = s.graph_needed_sizes()
        buffers = tuple(BufferSize(be.name, s.bufts[i].name, s.buffer_size(i), needed_pp[i], needed_tg[i])
                        for i, be in enumerate(s.backends))
        self.warnings += warnings
        ev = ReserveEvent(
            index=len(self.events), decision=decision, reasons=tuple(reasons), params=self.sched_params_req,
            previous=prev, trigger=trigger,
            timings_ms={"sched_new": (t_new - t0) * 1e3, "probes": (t_probe - t_new) * 1e3,
                        "reserve": (t_end - t_probe) * 1e3, "total": (t_end - t0) * 1e3},
            host_metadata_bytes=host_bytes,
            saved_host_metadata_bytes=host_metadata_bytes(params.max_nodes, s.n_backends, s.n_copies) if reused else 0,
            hash_size=s.hash_size, split_capacities=s.split_capacities, buffers=buffers,
            kv_bytes=self.kv_buffers_bytes, model_bytes=self.model_buffers_bytes, output_bytes=self.output_buffer_bytes,
            n_nodes_pp=n_nodes_pp, n_nodes_tg=n_nodes_tg, n_splits_pp=n_splits_pp, n_splits_tg=n_splits_tg,
            n_copies=s.n_copies, pipeline_parallel=self.pipeline_parallel, warnings=tuple(warnings), plan=s.plan(),
            kept_buffers=kept if reused else {}, kept_hash_size=kept_hash if reused else 0,
            kept_split_capacities=tuple(c for c in kept_caps if c > 30) if reused else (),
            n_backends=s.n_backends,
        )
        self.events.append(ev)
        return ev

    def _alloc_failure(self) -> str:
        s = self.scheduler
        w = s.warnings[-1] if s.warnings else "a compute buffer exceeds its device budget"
        limits = [f"{b.name} budget {b.alloc_limit} B" for b in dict.fromkeys(s.bufts) if b.alloc_limit is not None]
        return w + (f" ({', '.join(limits)})" if limits else "")

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
        trigger = "; ".join(f"{k} {self._current(k)} -> {v}" for k, v in changes.items()) or "sched_reserve"
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
            cur = self.sched_params_cur or SchedParams(0, False, False)
            req = self.sched_params_req or cur
            self.events.append(ReserveEvent(len(self.events), "error", (), req, cur, trigger, error=str(e)))
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


def _reasons(prev: SchedParams | None, params: SchedParams, reused: bool) -> list[Reason]:
    """Why the scheduler was rebuilt (the fields can_reuse rejected), or what reuse relied on."""
    if prev is None:
        return [Reason("scheduler", None, "new")]
    out: list[Reason] = []
    if params.parallel != prev.parallel:
        out.append(Reason("parallel", prev.parallel, params.parallel))
    if params.op_offload != prev.op_offload:
        out.append(Reason("op_offload", prev.op_offload, params.op_offload))
    if params.max_nodes > prev.max_nodes or (reused and params.max_nodes != prev.max_nodes):
        out.append(Reason("max_nodes", prev.max_nodes, params.max_nodes))
    return out
