"""Invariants of a scheduled graph, as plain text problems (an empty list means valid).

- splits are consecutive and cover every node: ``[0, n_nodes)`` in order (``ggml_backend_sched_split_graph`` pass 5);
- every non-view node sits in the split of its backend, and that backend supports it
  (views are placed by their base in split_graph pass 4, and run nowhere);
- no two tensors of one buffer (buft, chunk) overlap in bytes while both are live, except a
  tensor computed in place of its parent (``ggml_gallocr_allocate_node``), and every tensor fits in its chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolkit.ggml.graph import Graph


def _inplace_roots(allocs: Sequence[Any]) -> dict[str, str]:
    parent = {a.name: a.inplace_of for a in allocs if a.inplace_of}

    def root(n: str) -> str:
        seen = set()
        while n in parent and n not in seen:
            seen.add(n)
            n = parent[n]
        return n

    return {a.name: root(a.name) for a in allocs}


def check_plan(plan: Any, graph: Graph | None = None, backends: Sequence[Any] | None = None) -> list[str]:
    """Problems of ``plan`` (a :class:`toolkit.sched.plan.Plan`); ``graph``/``backends`` enable the
    supports_op check (the graph must be the one the plan was made from)."""
    problems: list[str] = []
    splits = sorted(plan.splits, key=lambda s: s.index)
    pos = 0
    for s in splits:
        if s.i_start != pos:
            problems.append(f"split {s.index} starts at node {s.i_start}, expected {pos} (splits must be consecutive)")
        if s.i_end <= s.i_start and plan.n_nodes > 0:
            problems.append(f"split {s.index} is empty: [{s.i_start}, {s.i_end})")
        pos = s.i_end
    if pos != plan.n_nodes:
        problems.append(f"splits end at node {pos}, the graph has {plan.n_nodes}")

    for p in plan.nodes:
        if p.backend_id < 0:
            problems.append(f"node {p.index} {p.name!r} has no backend")
            continue
        if p.is_view:
            continue
        sp = next((s for s in splits if s.i_start <= p.index < s.i_end), None)
        if sp is None or sp.backend_id != p.backend_id:
            where = "no split" if sp is None else f"split {sp.index} on {sp.backend}"
            problems.append(f"node {p.index} {p.name!r} on {p.backend} lies in {where}")
        if graph is not None and backends is not None:
            t = graph.nodes[p.index]
            if not backends[p.backend_id].supports_op(t):
                problems.append(f"node {p.index} {p.name!r} ({t.op_desc()}) on {p.backend}, which does not support it")

    roots = _inplace_roots(plan.allocs)
    chunk_size = {(b.buft, i): c for b in plan.buffers for i, c in enumerate(b.chunks)}
    by_buf: dict[tuple[str, int], list[Any]] = {}
    for a in plan.allocs:
        if a.size > 0:
            by_buf.setdefault((a.buft, a.chunk), []).append(a)
    for key, items in by_buf.items():
        limit = chunk_size.get(key)
        items.sort(key=lambda a: a.offset)
        for i, a in enumerate(items):
            if limit is not None and a.offset + a.size > limit:
                problems.append(f"{a.name!r} at {a.offset}+{a.size} exceeds {key[0]} chunk {key[1]} of {limit} B")
            for b in items[i + 1:]:
                if b.offset >= a.offset + a.size:
                    break
                live_together = a.first <= b.last and b.first <= a.last
                if live_together and roots[a.name] != roots[b.name]:
                    problems.append(
                        f"{a.name!r} [{a.offset}, {a.offset + a.size}) live {a.first}..{a.last} overlaps "
                        f"{b.name!r} [{b.offset}, {b.offset + b.size}) live {b.first}..{b.last} in {key[0]}"
                    )
    return problems
