"""The reuse layer of llama.cpp #32009: ``sched_params``, ``can_reuse``, ``sched_new`` and the events.

llama.cpp's change keeps the backend scheduler when the new graph can be served by the one it
has: same ``parallel``, same ``op_offload`` and no more ``max_nodes`` than it was built with.
:class:`SchedParams` is ``llama_context::sched_params`` and :meth:`SchedParams.can_reuse` its
rule; :meth:`SchedulerHolder.sched_new` is ``llama_context::sched_new`` with the early return.

A :class:`SchedulerHolder` is held (not inherited) by both the llama :class:`toolkit.context.Context`
and the traced :class:`toolkit.trace.session.TracedContext`: each brings its graphs and its reserve
sequence, the holder brings the scheduler, the params it was built with, the events and the one
transactional :meth:`SchedulerHolder.update` (save, try, restore on failure).

>>> a = SchedParams(max_nodes=2048, parallel=False, op_offload=True)
>>> SchedParams(1024, False, True).can_reuse(a), SchedParams(4096, False, True).can_reuse(a)
(True, False)
>>> [str(r) for r in reasons_for(a, SchedParams(4096, False, False), reused=False)]
['op_offload on → off', 'max_nodes 4096 > 2048']
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from toolkit.backend import Backend
from toolkit.backend.host import check_host_bytes
from toolkit.errors import AllocationError, ToolkitError
from toolkit.sched import GGML_SCHED_MAX_COPIES, Plan, Scheduler, hash_size, host_metadata_bytes

Decision = Literal["reused", "rebuilt", "fallback", "error"]


# ---- llama_context::sched_params and its rule -------------------------------------------------

@dataclass(frozen=True)
class SchedParams:
    """``llama_context::sched_params``: what a backend scheduler instance is built with."""

    max_nodes: int
    parallel: bool
    op_offload: bool

    def can_reuse(self, other: SchedParams) -> bool:
        """A scheduler built with ``other`` can serve these params: it can serve any graph of up to
        ``other.max_nodes`` nodes, with the same pipeline parallelism and op offload."""
        return (
            self.parallel == other.parallel
            and self.op_offload == other.op_offload
            and self.max_nodes <= other.max_nodes
        )


# ---- what a reserve reports (plain frozen data) -------------------------------------------------

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


# the memory groups every llama context has; any other group is memory of the context
# (``llama_memory_i``: "KV", iSWA's "KV" and "KV-SWA", later "RS" for recurrent state)
MODEL_GROUP = "model"        # the weights (``llama_model::memory_breakdown``)
OUTPUT_GROUP = "output"      # the logits/embeddings output buffer
COMPUTE_GROUP = "compute"    # the scheduler's compute buffers (``ggml_backend_sched_get_buffer_size``)
NOT_CONTEXT_GROUPS = (MODEL_GROUP, OUTPUT_GROUP, COMPUTE_GROUP)
# how many of the latest events a new event's plan is compared with (SchedulerHolder.record)
PLANS_COMPARED = 4


@dataclass(frozen=True)
class GraphRecord:
    """One graph a reserve planned (``llama_context::graph_reserve``): its nodes and splits."""

    n_nodes: int
    n_splits: int


@dataclass(frozen=True)
class BufferSize:
    """One scheduler backend's compute buffer after a reserve."""

    backend: str
    buft: str
    allocated: int                 # what the scheduler holds (buffers only grow)
    needed: Mapping[str, int] = field(default_factory=dict)   # graph label -> what that graph alone needs

    @property
    def needed_max(self) -> int:
        """The most any one graph of the reserve needs alone (0 without graphs)."""
        return max(self.needed.values(), default=0)


@dataclass(frozen=True)
class ReserveEvent:
    """One ``sched_reserve``: the decision, its reasons, timings, the graphs it planned by label,
    the memory by group, buffer sizes and the final plan.

    ``graphs`` holds the graphs by label in the order first reserved (a llama context: ``pp`` and
    ``tg``; a traced context its one ``graph``); ``last_graph`` names the one reserved last, whose
    plan ``plan`` is. ``memory`` maps a group label to its buffers (buffer name -> bytes), in the
    order ``model``, the context's memory (``KV``, ``KV-SWA``, ...), ``output``, ``compute``.
    """

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
    graphs: Mapping[str, GraphRecord] = field(default_factory=dict)
    last_graph: str = ""
    memory: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    n_copies: int = 1
    pipeline_parallel: bool = False
    warnings: tuple[str, ...] = ()
    error: str | None = None
    plan: Plan | None = None                       # the plan of ``last_graph``, for split map and layout
    # what a reused scheduler carried over: buffer sizes held before this reserve (by buft), its hash
    # capacity, and the split input capacities that had grown past GGML_SCHED_MAX_SPLIT_INPUTS
    kept_buffers: dict[str, int] = field(default_factory=dict)
    kept_hash_size: int = 0
    kept_split_capacities: tuple[int, ...] = ()
    n_backends: int = 0

    @property
    def planned(self) -> GraphRecord | None:
        """The graph reserved last (the one ``plan`` is of), or None for an error event."""
        return self.graphs.get(self.last_graph)

    def context_memory(self) -> dict[str, int]:
        """The context's memory per buffer name, summed over its groups (every group but model,
        output and compute): ``llama_context::memory_breakdown``'s context column."""
        out: dict[str, int] = {}
        for group, bufs in self.memory.items():
            if group not in NOT_CONTEXT_GROUPS:
                for name, n in bufs.items():
                    out[name] = out.get(name, 0) + n
        return out

    def to_text(self) -> str:
        why = "; ".join(str(r) for r in self.reasons) or "-"
        bufs = ", ".join(f"{b.buft}={b.allocated}" for b in self.buffers)
        head = f"#{self.index} {self.decision:8s} [{self.trigger}] {why}"
        if self.error:
            return f"{head}\n    error: {self.error}"
        labels = "/".join(self.graphs)
        nodes = "/".join(str(g.n_nodes) for g in self.graphs.values())
        splits = "/".join(str(g.n_splits) for g in self.graphs.values())
        return (f"{head}\n    max_nodes={self.params.max_nodes} parallel={self.params.parallel} "
                f"op_offload={self.params.op_offload} hash={self.hash_size} n_copies={self.n_copies}"
                f"\n    nodes {labels}={nodes} splits {labels}={splits} buffers: {bufs}"
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
            "buffers": [{"backend": b.backend, "buft": b.buft, "allocated": b.allocated, "needed": dict(b.needed)}
                        for b in self.buffers],
            "graphs": {k: vars(g) for k, g in self.graphs.items()}, "last_graph": self.last_graph,
            "memory": {k: dict(v) for k, v in self.memory.items()}, "n_copies": self.n_copies,
            "pipeline_parallel": self.pipeline_parallel, "warnings": list(self.warnings), "error": self.error,
            "kept_buffers": self.kept_buffers, "kept_hash_size": self.kept_hash_size,
            "kept_split_capacities": list(self.kept_split_capacities),
        }


@dataclass(frozen=True)
class CompileEvent:
    """The runtime compiled the splits planned by reserve event ``reserve_index`` (XLA, per device)."""

    index: int
    reserve_index: int
    compiled: int                                  # splits compiled now
    cache_hits: int                                # splits found in the compile cache
    compile_ms: float
    splits: tuple[Mapping[str, object], ...] = ()  # one summary per split

    def to_text(self) -> str:
        return (f"#{self.index} compile (reserve #{self.reserve_index}): {self.compiled} compiled, "
                f"{self.cache_hits} cache hits, {self.compile_ms:.1f} ms")


def reasons_for(prev: SchedParams | None, params: SchedParams, reused: bool) -> list[Reason]:
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


# ---- what the dashboard and the runtime read ---------------------------------------------------

@runtime_checkable
class ContextView(Protocol):
    """What a context shows to the dashboard and the runtime (both :class:`toolkit.context.Context`
    and :class:`toolkit.trace.session.TracedContext` satisfy it).

    Each member states its contract; none of them computes a plan.
    """

    @property
    def backends(self) -> list[Backend]:
        """The scheduler's backends, GPUs first, the CPU last."""
        ...

    @property
    def scheduler(self) -> Scheduler:
        """The current scheduler (a context always holds one once constructed)."""
        ...

    @property
    def sched_params_cur(self) -> SchedParams | None:
        """The params the current scheduler was built with (``llama_context::sched_params_cur``)."""
        ...

    @property
    def sched_params_req(self) -> SchedParams | None:
        """The params the last reserve asked for (at most ``sched_params_cur.max_nodes`` when reused)."""
        ...

    @property
    def events(self) -> list[ReserveEvent]:
        """One :class:`ReserveEvent` per ``sched_reserve`` or failed update, oldest first."""
        ...

    @property
    def compile_events(self) -> list[CompileEvent]:
        """One :class:`CompileEvent` per compilation of the current splits, oldest first."""
        ...

    @property
    def n_copies(self) -> int:
        """The scheduler's n_copies (``GGML_SCHED_MAX_COPIES`` with pipeline parallelism, else 1)."""
        ...

    @property
    def max_nodes_override(self) -> int | None:
        """The user's max_nodes, or None for the context's own rule (shown as auto)."""
        ...

    @property
    def auto_max_nodes_text(self) -> str:
        """How the context picks max_nodes when not overridden (the dashboard's tooltip)."""
        ...

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``ggml_backend_sched_get_buffer_size`` per backend by buft name."""
        ...

    def update(self, **changes: Any) -> ReserveEvent:
        """Change params and reserve again; bad input raises a ToolkitError and keeps the state."""
        ...


class Reservable(Protocol):
    """What :meth:`SchedulerHolder.update` needs from its owner to undo a failed change."""

    def save_state(self) -> object:
        """The owner's own state (params, setup, placement), to hand back to :meth:`restore_state`."""
        ...

    def restore_state(self, state: object) -> None:
        """Put back what :meth:`save_state` returned."""
        ...

    def replan(self) -> None:
        """Reserve the current graphs again on the (freed) current scheduler."""
        ...


# ---- the scheduler holder ----------------------------------------------------------------------

@dataclass
class ReserveInProgress:
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
    # the graphs planned so far by label, each with what every backend needs for it alone
    graphs: dict[str, tuple[GraphRecord, tuple[int, ...]]] = field(default_factory=dict)
    last_graph: str = ""


class SchedulerHolder:
    """The reuse half of ``llama_context``: one scheduler, the params it was built with,
    ``sched_new`` that keeps it when :meth:`SchedParams.can_reuse` holds, and the events.

    ``backends`` is called whenever a new scheduler is made (the owner may change its backends).
    """

    def __init__(self, backends: Callable[[], Sequence[Backend]], planner: str = "ggml", *,
                 host_memory: int | None = None) -> None:
        self.backends = backends
        self.planner = planner
        self.host_memory = host_memory  # the most host memory a new scheduler may take; None: the machine's
        self.scheduler: Scheduler | None = None
        self.params_cur: SchedParams | None = None   # what the scheduler was built with
        self.params_req: SchedParams | None = None   # what the last reserve asked for
        self.events: list[ReserveEvent] = []
        self.compile_events: list[CompileEvent] = []
        self.warnings: list[str] = []

    @property
    def sched(self) -> Scheduler:
        """The current scheduler (there is one after the first reserve)."""
        assert self.scheduler is not None, "no scheduler: sched_reserve has not run"
        return self.scheduler

    # ---- llama_context::sched_new ----------------------------------------------------------------
    def would_reuse(self, params: SchedParams) -> bool:
        return self.scheduler is not None and self.params_cur is not None and params.can_reuse(self.params_cur)

    def sched_new(self, params: SchedParams) -> bool:
        """Keep the current scheduler when it can serve ``params``; else create one. True = reused."""
        if self.would_reuse(params):
            return True
        backends = list(self.backends())
        # ggml_backend_sched_new allocates its hash set, graph copies and context on the host: a
        # max_nodes whose metadata the host cannot hold would fail there
        copies = GGML_SCHED_MAX_COPIES if params.parallel else 1
        check_host_bytes(f"the scheduler's host metadata for max_nodes={params.max_nodes}",
                         host_metadata_bytes(params.max_nodes, len(backends), copies), limit=self.host_memory)
        if self.scheduler is not None:
            self.scheduler.free()  # the old scheduler's compute buffers go with it
        self.scheduler = Scheduler(backends, None, params.max_nodes, params.parallel, params.op_offload,
                                   self.planner)
        self.params_cur = params
        return False

    def drop(self) -> None:
        """Free the scheduler: the backends changed, so none can be reused."""
        if self.scheduler is not None:
            self.scheduler.free()
        self.scheduler = None

    def hash_capacity_for(self, params: SchedParams) -> int:
        """The hash set that will serve ``params``: a reused scheduler keeps its larger one."""
        return self.sched.hash_size if self.would_reuse(params) else hash_size(params.max_nodes)

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``get_buffer_size`` per backend by buft name, zero-sized buffers included."""
        s = self.sched
        out: dict[str, int] = {}
        for i in range(s.n_backends):
            name = s.bufts[i].name
            out[name] = out.get(name, 0) + s.buffer_size(i)
        return out

    def alloc_failure(self) -> str:
        """Why the last reserve failed, with the device budgets."""
        s = self.sched
        w = s.warnings[-1] if s.warnings else "a compute buffer exceeds its device budget"
        limits = [f"{b.name} budget {b.alloc_limit} B" for b in dict.fromkeys(s.bufts) if b.alloc_limit is not None]
        return w + (f" ({', '.join(limits)})" if limits else "")

    # ---- one sched_reserve -------------------------------------------------------------------------
    def begin_reserve(self, params: SchedParams, extra_reasons: Sequence[Reason]) -> ReserveInProgress:
        """``sched_new(params)``, remembering what the old scheduler held."""
        t0 = time.perf_counter()
        prev, old = self.params_cur, self.scheduler
        kept = {old.bufts[i].name: old.buffer_size(i) for i in range(old.n_backends)} if old is not None else {}
        kept_hash, kept_caps = (old.hash_size, old.split_capacities) if old is not None else (0, ())
        reused = self.sched_new(params)
        self.params_req = params
        return ReserveInProgress(
            t0, time.perf_counter(), prev, reused, list(extra_reasons) + reasons_for(prev, params, reused),
            "reused" if reused else "rebuilt", 0 if reused else self.sched.host_metadata_bytes,
            kept, kept_hash, tuple(kept_caps))

    def fall_back(self, r: ReserveInProgress) -> None:
        """``llama_context::sched_reserve``'s retry when allocation failed with pipeline parallelism."""
        assert self.params_req is not None
        r.warnings.append("compute buffer allocation failed, retrying without pipeline parallelism")
        r.decision = "fallback"
        r.reasons.append(Reason("parallel", True, False))
        self.params_req = SchedParams(self.params_req.max_nodes, False, self.params_req.op_offload)
        self.sched_new(self.params_req)
        r.host_bytes += self.sched.host_metadata_bytes

    def graph_reserved(self, r: ReserveInProgress, label: str, n_nodes: int, *, sized: bool = True) -> None:
        """Note the graph the scheduler just planned as graph ``label`` of reserve ``r``: its nodes, its
        splits and what each backend needs for it alone (nothing when it was only split, ``sized=False``).
        A graph reserved again under the same label (llama's pp → tg → pp) replaces it in its place."""
        s = self.sched
        needed = tuple(s.graph_needed_sizes()) if sized else (0,) * s.n_backends
        r.graphs[label] = (GraphRecord(n_nodes, s.n_splits), needed)
        r.last_graph = label

    def record(self, r: ReserveInProgress, trigger: str, timings_ms: dict[str, float],
               memory: Mapping[str, Mapping[str, int]], **fields: Any) -> ReserveEvent:
        """Append the ReserveEvent of a finished reserve (the scheduler holds the plan of ``r.last_graph``).

        ``memory``: the owner's memory groups (``model``, the context's memory, ``output``); the
        scheduler's compute buffers are added as group ``compute``."""
        s = self.sched
        assert self.params_req is not None
        buffers = tuple(BufferSize(be.name, s.bufts[i].name, s.buffer_size(i),
                                   {label: needed[i] for label, (_, needed) in r.graphs.items()})
                        for i, be in enumerate(s.backends))
        self.warnings += r.warnings
        saved = host_metadata_bytes(self.params_req.max_nodes, s.n_backends, s.n_copies) if r.reused else 0
        ev = ReserveEvent(
            index=len(self.events), decision=r.decision, reasons=tuple(r.reasons), params=self.params_req,
            previous=r.prev, trigger=trigger, timings_ms=timings_ms, host_metadata_bytes=r.host_bytes,
            saved_host_metadata_bytes=saved, hash_size=s.hash_size, split_capacities=s.split_capacities,
            buffers=buffers, graphs={label: g for label, (g, _) in r.graphs.items()}, last_graph=r.last_graph,
            memory={**{k: dict(v) for k, v in memory.items()}, COMPUTE_GROUP: self.compute_buffers_bytes()},
            n_copies=s.n_copies, warnings=tuple(r.warnings), plan=self._shared_plan(s.plan()),
            kept_buffers=r.kept if r.reused else {}, kept_hash_size=r.kept_hash if r.reused else 0,
            kept_split_capacities=tuple(c for c in r.kept_caps if c > 30) if r.reused else (),
            n_backends=s.n_backends, **fields,
        )
        self.events.append(ev)
        return ev

    def _shared_plan(self, plan: Plan) -> Plan:
        """The plan of one of the latest events when ``plan`` equals it (the same object then), else ``plan``.
        Each plan holds a placement per node and an allocation per tensor, and the events keep them all;
        a session that changes a setting back and forth (``max_nodes``, a flag toggled) then keeps one plan
        per configuration instead of one per event, and the cyclic collector has that much less to scan."""
        seen: set[int] = set()
        for ev in reversed(self.events[-PLANS_COMPARED:]):
            p = ev.plan
            if p is None or id(p) in seen:
                continue
            seen.add(id(p))
            # the buffer sizes first: a different configuration usually differs there, cheaply
            if p.buffers == plan.buffers and p == plan:
                return p
        return plan

    def record_error(self, trigger: str, error: Exception) -> None:
        cur = self.params_cur or SchedParams(0, False, False)
        req = self.params_req or cur
        self.events.append(ReserveEvent(len(self.events), "error", (), req, cur, trigger, error=str(error)))

    def record_compile(self, info: Mapping[str, Any]) -> CompileEvent:
        """Append a :class:`CompileEvent` for the newest reserve (the runtime's ``compile_splits`` report)."""
        ev = CompileEvent(len(self.compile_events), len(self.events) - 1, int(info.get("compiled", 0)),
                          int(info.get("cache_hits", 0)), float(info.get("compile_ms", 0.0)),
                          tuple(info.get("splits", ())))
        self.compile_events.append(ev)
        return ev

    # ---- the one transactional update ----------------------------------------------------------
    def update(self, owner: Reservable, trigger: str, change: Callable[[], ReserveEvent]) -> ReserveEvent:
        """Run ``change`` (which ends in a sched_reserve); on any exception put the owner, the
        scheduler, its params and its buffers back as they were.

        Expected errors (:class:`toolkit.errors.ToolkitError`) also get an ``error`` event and are
        re-raised as they are; anything else is a bug and propagates unchanged.
        """
        saved_owner = owner.save_state()
        saved = (self.scheduler, self.params_cur, self.params_req)
        old_layout = None if self.scheduler is None else self.scheduler.buffer_layout()
        try:
            return change()
        except Exception as e:
            failed = self.scheduler
            owner.restore_state(saved_owner)
            self.scheduler, self.params_cur, self.params_req = saved
            if failed is not None and failed is not self.scheduler:
                failed.free()
            if self.scheduler is not None and old_layout is not None and self.scheduler.buffer_layout() != old_layout:
                # the attempt freed or grew the kept scheduler's buffers: plan them again from scratch,
                # then give the buffers back the sizes earlier reserves had grown them to
                self.scheduler.free()
                owner.replan()
                restored = self.scheduler.restore_buffer_layout(old_layout)
                assert restored, "the kept scheduler's buffers could not be allocated again"
            if isinstance(e, AllocationError) and trigger:
                # say which change asked for the memory ("n_ctx 4096 -> 1000000000: ...")
                err = AllocationError(f"{trigger}: {e}")
                self.record_error(trigger, err)
                raise err from e
            if isinstance(e, ToolkitError):
                self.record_error(trigger, e)
            raise


__all__ = ["COMPUTE_GROUP", "MODEL_GROUP", "NOT_CONTEXT_GROUPS", "OUTPUT_GROUP", "BufferSize", "CompileEvent",
           "ContextView", "Decision", "GraphRecord", "Reason", "Reservable", "ReserveEvent", "ReserveInProgress",
           "SchedParams", "SchedulerHolder", "reasons_for"]
