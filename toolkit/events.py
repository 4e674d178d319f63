"""What a reserve reports: the decision, its reasons, buffer sizes, the plan (plain frozen data).

``toolkit.context.Context`` and ``toolkit.trace.TracedContext`` append one :class:`ReserveEvent`
per ``sched_reserve``; the dashboard's figures and the CLI only read these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from toolkit.sched.plan import Plan

if TYPE_CHECKING:
    from toolkit.context import SchedParams

Decision = Literal["reused", "rebuilt", "fallback", "error"]


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
