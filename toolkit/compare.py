"""Two reserves side by side: what changed between them, and why (plain frozen data).

``compare(a, b)`` reads two :class:`~toolkit.reuse.ReserveEvent` (and their plans) and returns an
:class:`EventDiff`: per buffer type the allocated and needed bytes with their change, every other
memory group's buffers (model, KV, KV-SWA, ..., output), the nodes and splits of each graph label
both reserves planned (and which labels only one of them has), the nodes that changed backend
and the split inputs that appeared or disappeared (each with its placement cause), the host
metadata the newer reserve cost or saved, and its reuse decision with the reasons.
``toolkit.ui.text.diff_text`` prints it and the dashboard's compare view draws it.

>>> d = compare(ctx.events[-2], ctx.events[-1])    # doctest: +SKIP
>>> [(c.name, c.before, c.after) for c in d.backend_changes][:1]   # doctest: +SKIP
[('ffn_out-0', 'CUDA0', 'CPU')]

Nodes are matched by name (the k-th node of a name with the k-th), split inputs by the split's
backend and the input's name: split numbers shift when a split appears, names do not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from toolkit.reuse import COMPUTE_GROUP, ReserveEvent
from toolkit.sched.explain import parse_copy_name
from toolkit.sched.plan import NodePlacement, Plan


@dataclass(frozen=True)
class BufferDelta:
    """One buffer type's compute buffer in both reserves (summed over the backends that use it)."""

    buft: str
    allocated_a: int
    allocated_b: int
    needed_a: int           # the most any one graph of the reserve needs alone
    needed_b: int

    @property
    def allocated_change(self) -> int:
        return self.allocated_b - self.allocated_a

    @property
    def needed_change(self) -> int:
        return self.needed_b - self.needed_a


@dataclass(frozen=True)
class MemoryDelta:
    """One buffer of a memory group (other than compute) in both reserves (0 where a reserve lacks it)."""

    group: str              # "model", "KV", "KV-SWA", "output", ...
    buffer: str
    a: int
    b: int

    @property
    def change(self) -> int:
        return self.b - self.a


@dataclass(frozen=True)
class CountDelta:
    name: str               # "nodes pp", "splits tg" (a graph label both reserves have), "n_copies"
    a: int
    b: int

    @property
    def change(self) -> int:
        return self.b - self.a


@dataclass(frozen=True)
class BackendChange:
    """A node placed on another backend in the newer plan, with both placement causes."""

    name: str
    op: str
    before: str
    after: str
    cause_before: str
    cause_after: str


@dataclass(frozen=True)
class InputChange:
    """A split input (a copy between backends) present in only one of the two plans."""

    name: str
    to_backend: str         # the split's backend: where the copy goes
    from_backend: str       # where the source lives
    nbytes: int
    is_weight: bool
    reader: str             # the first node of the split that reads the copy
    reader_cause: str       # why that node sits on ``to_backend``


@dataclass(frozen=True)
class EventDiff:
    a: int                  # event indices
    b: int
    decision_a: str
    decision_b: str
    params: tuple[tuple[str, object, object], ...]   # (field, a, b) for every scheduler param that differs
    reasons_b: tuple[str, ...]                       # why b reused or rebuilt, as the event recorded it
    trigger_b: str
    buffers: tuple[BufferDelta, ...]
    counts: tuple[CountDelta, ...]
    backend_changes: tuple[BackendChange, ...]
    inputs_added: tuple[InputChange, ...]
    inputs_removed: tuple[InputChange, ...]
    host_metadata_cost_b: int        # what b's sched_new allocated (0 when reused)
    host_metadata_saved_b: int       # what b's reuse avoided allocating
    host_metadata_held_a: int        # host metadata of the scheduler live after a / after b
    host_metadata_held_b: int
    has_plans: bool = True           # False when either event has no plan (an error event)
    memory: tuple[MemoryDelta, ...] = ()
    graphs: tuple[str, ...] = ()         # graph labels both reserves planned (compared in ``counts``)
    graphs_only_a: tuple[str, ...] = ()  # graph labels only one of them planned
    graphs_only_b: tuple[str, ...] = ()

    def count(self, name: str) -> CountDelta:
        for c in self.counts:
            if c.name == name:
                return c
        raise KeyError(f"no count {name!r}: expected one of {', '.join(c.name for c in self.counts)}")

    def buffer(self, buft: str) -> BufferDelta:
        for b in self.buffers:
            if b.buft == buft:
                return b
        raise KeyError(f"no buffer type {buft!r}: expected one of {', '.join(b.buft for b in self.buffers)}")

    @property
    def weights_added(self) -> tuple[InputChange, ...]:
        return tuple(i for i in self.inputs_added if i.is_weight)

    @property
    def weights_removed(self) -> tuple[InputChange, ...]:
        return tuple(i for i in self.inputs_removed if i.is_weight)


def _buffers(ev: ReserveEvent) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for b in ev.buffers:
        a, n = out.get(b.buft, (0, 0))
        out[b.buft] = (a + b.allocated, max(n, b.needed_max))
    return out


def _memory(a: ReserveEvent, b: ReserveEvent) -> tuple[MemoryDelta, ...]:
    """Each buffer of each memory group either reserve has, compute left out (the buffer deltas)."""
    groups = [g for g in dict.fromkeys([*a.memory, *b.memory]) if g != COMPUTE_GROUP]
    out = []
    for g in groups:
        ma, mb = a.memory.get(g, {}), b.memory.get(g, {})
        out += [MemoryDelta(g, n, ma.get(n, 0), mb.get(n, 0)) for n in dict.fromkeys([*ma, *mb])]
    return tuple(out)


def _keyed(nodes: Sequence[NodePlacement]) -> dict[tuple[str, int], NodePlacement]:
    seen: Counter[str] = Counter()
    out: dict[tuple[str, int], NodePlacement] = {}
    for n in sorted(nodes, key=lambda x: x.index):
        out[(n.name, seen[n.name])] = n
        seen[n.name] += 1
    return out


def _inputs(plan: Plan) -> dict[tuple[str, str], InputChange]:
    out: dict[tuple[str, str], InputChange] = {}
    for s in plan.splits:
        readers = [n for n in plan.nodes if n.split == s.index]
        for i in s.inputs:
            if (s.backend, i.name) in out:
                continue
            reader = next((n for n in readers for src in n.srcs
                           if (c := parse_copy_name(src)) is not None and c.src == i.name and c.backend == s.backend),
                          None)
            out[(s.backend, i.name)] = InputChange(
                i.name, s.backend, i.src_backend, i.nbytes, i.is_weight,
                reader.name if reader else "", reader.cause.value if reader else "")
    return out


def held_host_metadata(events: Sequence[ReserveEvent], upto: int) -> int:
    """Host metadata of the scheduler live after event ``upto``: the newest rebuild's (reuse keeps it)."""
    for ev in reversed([e for e in events if e.index <= upto]):
        if ev.decision in ("rebuilt", "fallback") and ev.host_metadata_bytes:
            return ev.host_metadata_bytes
    return 0


def compare(a: ReserveEvent, b: ReserveEvent, events: Sequence[ReserveEvent] = ()) -> EventDiff:
    """What changed from reserve ``a`` to reserve ``b``; ``events`` (the log) gives the host metadata held."""
    ba, bb = _buffers(a), _buffers(b)
    order = list(dict.fromkeys([*ba, *bb]))
    buffers = tuple(BufferDelta(k, ba.get(k, (0, 0))[0], bb.get(k, (0, 0))[0], ba.get(k, (0, 0))[1],
                                bb.get(k, (0, 0))[1]) for k in order)
    both = tuple(g for g in a.graphs if g in b.graphs)
    counts = tuple(CountDelta(f"nodes {g}", a.graphs[g].n_nodes, b.graphs[g].n_nodes) for g in both) + tuple(
        CountDelta(f"splits {g}", a.graphs[g].n_splits, b.graphs[g].n_splits) for g in both) + (
        CountDelta("n_copies", a.n_copies, b.n_copies),)
    params = tuple((f, getattr(a.params, f), getattr(b.params, f)) for f in ("max_nodes", "parallel", "op_offload")
                   if getattr(a.params, f) != getattr(b.params, f))
    changes: list[BackendChange] = []
    added: tuple[InputChange, ...] = ()
    removed: tuple[InputChange, ...] = ()
    has_plans = a.plan is not None and b.plan is not None
    if a.plan is not None and b.plan is not None:
        na, nb = _keyed(a.plan.nodes), _keyed(b.plan.nodes)
        for key, y in nb.items():
            x = na.get(key)
            if x is not None and x.backend != y.backend:
                changes.append(BackendChange(y.name, y.op, x.backend, y.backend, x.cause.value, y.cause.value))
        ia, ib = _inputs(a.plan), _inputs(b.plan)
        added = tuple(v for k, v in ib.items() if k not in ia)
        removed = tuple(v for k, v in ia.items() if k not in ib)
    log = list(events) or [a, b]
    return EventDiff(
        a.index, b.index, a.decision, b.decision, params, tuple(str(r) for r in b.reasons), b.trigger, buffers,
        counts, tuple(changes), added, removed, b.host_metadata_bytes, b.saved_host_metadata_bytes,
        held_host_metadata(log, a.index), held_host_metadata(log, b.index), has_plans, _memory(a, b), both,
        tuple(g for g in a.graphs if g not in b.graphs), tuple(g for g in b.graphs if g not in a.graphs))


def default_pair(events: Sequence[ReserveEvent]) -> tuple[int, int] | None:
    """The dashboard's default: the previous successful reserve and the newest one (list positions)."""
    ok = [i for i, e in enumerate(events) if e.decision != "error"]
    if len(ok) < 2:
        return None
    return ok[-2], ok[-1]


__all__ = ["BackendChange", "BufferDelta", "CountDelta", "EventDiff", "InputChange", "MemoryDelta", "compare",
           "default_pair"]
