"""The llama_context analog: scheduler params, the reuse rule (seed #32009), sched_reserve, events.

SKELETON: the data types below are the contract that the dashboard and the runtime read.
The Context class is to be written (see issue 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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
