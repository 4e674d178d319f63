"""Aggregate a plan's nodes for display: by layer (llama names end in ``-<il>``) or by split.

A 1,000-node graph is unreadable node by node, so the split map opens with runs of
consecutive nodes that share a layer (or split) and a backend; per-node detail is on demand.
This only regroups data already in the Plan; it computes no placement.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from toolkit.sched.plan import NodePlacement, Plan
from toolkit.view import Collapse

# llama.cpp's graph callback names per-layer tensors "<name>-<il>" (Qcur-3, ffn_swiglu-1, l_out-31);
# ggml_format_name appends " (view)", " (permuted)", " (reshaped)" … to derived tensors.
_LAYER_SUFFIX = re.compile(r"-(\d+)(?=$|\s|\))")
# KV cache tensors are "cache_k_l<il>" / "cache_v_l<il>", their views keep that prefix.
_CACHE_LAYER = re.compile(r"_l(\d+)(?=$|\s|\))")


def layer_of(name: str) -> int | None:
    """The layer number encoded in a tensor name, or None (``Qcur-3`` -> 3, ``inp_embd`` -> None)."""
    m = _LAYER_SUFFIX.search(name) or _CACHE_LAYER.search(name)
    return int(m.group(1)) if m else None


def layer_labels(nodes: Sequence[NodePlacement]) -> list[str]:
    """A group label per node: ``L<il>``; unnamed nodes before the first layer are ``input``,
    after the last layer ``output``, and in between they join the layer before them."""
    ids = [layer_of(n.name) for n in nodes]
    known = [i for i, v in enumerate(ids) if v is not None]
    if not known:
        return ["graph"] * len(nodes)
    first, last = known[0], known[-1]
    labels: list[str] = []
    current = "input"
    for i, v in enumerate(ids):
        if v is not None:
            current = f"L{v}"
        elif i < first:
            current = "input"
        elif i > last:
            current = "output"
        labels.append(current)
    return labels


@dataclass
class NodeRun:
    """Consecutive nodes [start, end) with one group label and one backend."""

    group: str
    backend: str
    backend_id: int
    start: int
    end: int
    ops: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)
    splits: set[int] = field(default_factory=set)
    nbytes: int = 0
    names: list[str] = field(default_factory=list)
    first_node: int = -1      # the first non-view node (what a click on the run explains)

    @property
    def count(self) -> int:
        return self.end - self.start

    def summary(self, top: int = 3) -> str:
        ops = ", ".join(f"{k}×{v}" for k, v in self.ops.most_common(top))
        causes = ", ".join(f"{k}×{v}" for k, v in self.causes.most_common(top))
        return f"ops: {ops}; causes: {causes}"


def node_runs(plan: Plan, collapse: Collapse = "layer") -> list[NodeRun]:
    """Group the plan's nodes (in order) into runs; ``collapse="none"`` gives one run per node."""
    nodes = sorted(plan.nodes, key=lambda n: n.index)
    if collapse == "layer":
        groups = layer_labels(nodes)
    elif collapse == "split":
        groups = [f"split {n.split}" if n.split >= 0 else "view" for n in nodes]
    else:
        groups = [n.name for n in nodes]
    runs: list[NodeRun] = []
    for n, g in zip(nodes, groups):
        last = runs[-1] if runs else None
        # Views (split -1) take no backend slot of their own in pass 5; keep them inside a run.
        if collapse != "none" and last is not None and last.group == g and (
                last.backend_id == n.backend_id or n.is_view):
            run = last
            run.end = n.index + 1
        else:
            run = NodeRun(g, n.backend, n.backend_id, n.index, n.index + 1)
            runs.append(run)
        run.ops[n.op] += 1
        run.causes[n.cause.value] += 1
        if n.split >= 0:
            run.splits.add(n.split)
        run.nbytes += n.nbytes
        run.names.append(n.name)
        if run.first_node < 0 and not n.is_view:
            run.first_node = n.index
    for run in runs:
        if run.first_node < 0:
            run.first_node = run.start
    return runs


def group_starts(plan: Plan) -> list[tuple[str, int]]:
    """(label, first node index) for each layer group, in order: axis ticks of the split map."""
    nodes = sorted(plan.nodes, key=lambda n: n.index)
    out: list[tuple[str, int]] = []
    for n, g in zip(nodes, layer_labels(nodes)):
        if not out or out[-1][0] != g:
            out.append((g, n.index))
    return out
