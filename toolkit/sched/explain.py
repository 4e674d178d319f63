"""Why a node sits where it sits: one node of a :class:`~toolkit.sched.plan.Plan` explained.

``explain(plan, node)`` gathers, from the plan's public fields only,
what a reader asks about one node: what it is (op, name, shape, bytes, backend), which pass of
``ggml_backend_sched_split_graph`` placed it and what it followed there (a weight, an input, the
neighbour an expansion sweep copied, the sources that won the best-inputs vote), its sources and
the copies the scheduler made for it, and where the graph allocator put it (offset, lifetime).

>>> e = explain(ctx.events[-1].plan, "ffn_out-0")   # doctest: +SKIP
>>> print(e.to_text())                              # doctest: +SKIP

Nothing here recomputes a placement: every answer is read from the plan, so it is what the
scheduler did. Two answers are inferred from the graph's shape, and say so: the weight a node
followed is its first source that is neither a node nor planned by the allocator (a tensor in a
pre-allocated buffer, as ggml's weight rule scans ``src[]`` in order), and an expansion sweep's
neighbour is the nearest non-view node before (down) or after (up) it in graph order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolkit.errors import ParameterError
from toolkit.sched.plan import Cause, NodePlacement, Plan, TensorAlloc

# the pass of ggml_backend_sched_split_graph that sets each cause, and what the rule says
PASS_OF: dict[Cause, str] = {
    Cause.BUFFER: "pass 1", Cause.INPUT: "pass 1", Cause.WEIGHT: "pass 1", Cause.OP_OFFLOAD: "pass 1",
    Cause.EXPAND_DOWN: "pass 2", Cause.EXPAND_UP: "pass 2",
    Cause.UPGRADE: "pass 3", Cause.BEST_INPUTS: "pass 3",
    Cause.VIEW_SOURCE: "pass 4", Cause.NODE_SOURCE: "pass 4", Cause.FIRST_SUPPORTED: "pass 4",
    Cause.USER_PIN: "before pass 1 (ggml_backend_sched_set_tensor_backend)",
}
RULE_OF: dict[Cause, str] = {
    Cause.BUFFER: "the tensor (or the tensor it views) already lives in a backend buffer",
    Cause.INPUT: "a graph input goes to the last backend (the CPU)",
    Cause.WEIGHT: "the first source in a weights buffer decides",
    Cause.OP_OFFLOAD: "its weight is in host memory and the batch is large enough: offloaded to a device "
                      "(ggml_backend_offload_op)",
    Cause.EXPAND_DOWN: "expansion down: takes the backend of the node before it",
    Cause.EXPAND_UP: "expansion up: takes the backend of the node after it",
    Cause.UPGRADE: "upgraded to a higher-priority backend of the same buffer type",
    Cause.BEST_INPUTS: "unassigned after expansion: the backend supporting most of its inputs' buffers",
    Cause.VIEW_SOURCE: "a view takes the backend of the tensor it views",
    Cause.NODE_SOURCE: "an unassigned source takes the backend of the node that uses it",
    Cause.FIRST_SUPPORTED: "fallback: the first backend that supports the op",
    Cause.USER_PIN: "pinned by the graph callback (llama.cpp's graph_get_cb)",
}

# split input copies are named "<backend>#<source>#<copy>" (ggml_backend_sched_split_graph)
_COPY_NAME = re.compile(r"^(?P<backend>[^#]+)#(?P<src>.+)#(?P<copy>\d+)$")


@dataclass(frozen=True)
class CopyName:
    """A split input copy: ``backend`` holds copy number ``copy`` of tensor ``src``."""

    backend: str
    src: str
    copy: int


def parse_copy_name(name: str) -> CopyName | None:
    """``"CUDA0#x#1"`` -> CopyName("CUDA0", "x", 1); None for a tensor that is not a split input copy."""
    m = _COPY_NAME.match(name)
    return CopyName(m["backend"], m["src"], int(m["copy"])) if m else None


@dataclass(frozen=True)
class Source:
    """One source of a node: what it is, where it lives, and whether the scheduler copied it."""

    name: str                 # the source tensor (the original, not the copy)
    kind: str                 # "node", "leaf" (weight, KV cache, graph input) or "view"
    backend: str              # where the original lives ("" for a leaf the plan does not place)
    copy: str | None = None   # the copy this node reads instead ("CUDA0#x#0"), if any


@dataclass(frozen=True)
class OutputCopy:
    """A later split that copies this node's output to its own backend."""

    split: int
    backend: str
    nbytes: int


@dataclass(frozen=True)
class NodeExplanation:
    node: NodePlacement
    pass_name: str                       # "pass 1" ... "pass 4"
    rule: str                            # the placement rule, in words
    followed: tuple[str, ...]            # the weight / input / neighbour / sources it followed
    sources: tuple[Source, ...]
    copies_in: tuple[str, ...]           # copies made for it: its split inputs that it reads
    copies_out: tuple[OutputCopy, ...]   # splits that copy its output
    alloc: TensorAlloc | None            # its place in the compute buffer (None: not planned here)
    n_copies: int = 1

    @property
    def cause(self) -> Cause:
        return self.node.cause

    def to_text(self) -> str:
        n = self.node
        shape = "x".join(str(d) for d in n.ne) if n.ne else "?"
        lines = [f"node #{n.index} {n.name} ({n.op}{', view' if n.is_view else ''}) {n.type or ''}[{shape}] "
                 f"{n.nbytes:,} B",
                 f"  backend {n.backend}, split {n.split if n.split >= 0 else '-'}",
                 f"  cause: {n.cause.value} ({self.pass_name}): {self.rule}"]
        if self.followed:
            lines.append(f"  followed: {', '.join(self.followed)}")
        for s in self.sources:
            where = f" on {s.backend}" if s.backend else ""
            lines.append(f"  src {s.name} ({s.kind}{where})" + (f" read through copy {s.copy}" if s.copy else ""))
        if self.copies_in:
            lines.append(f"  copies made for it: {', '.join(self.copies_in)}")
        for c in self.copies_out:
            lines.append(f"  output copied to split {c.split} ({c.backend}, {c.nbytes:,} B)")
        a = self.alloc
        if a is None:
            lines.append("  not planned by the graph allocator (a view, or a tensor in a pre-allocated buffer)")
        else:
            where = "leaf phase" if a.first < 0 else f"node {a.first}"
            lines.append(f"  {a.buft} chunk {a.chunk} offset {a.offset:,} size {a.size:,} B, "
                         f"live from {where} to {a.last} (graph_copy positions)"
                         + (f", in place of {a.inplace_of}" if a.inplace_of else ""))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


def find_node(plan: Plan, node: int | str | NodePlacement) -> NodePlacement:
    """A node by graph index, name or placement; a ParameterError names what was asked and what exists."""
    if isinstance(node, NodePlacement):
        return node
    if isinstance(node, int) and not isinstance(node, bool):
        for n in plan.nodes:
            if n.index == node:
                return n
        raise ParameterError("node", node, f"a node index in 0..{plan.n_nodes - 1}")
    if isinstance(node, str):
        for n in plan.nodes:
            if n.name == node:
                return n
        some = ", ".join(n.name for n in plan.nodes[:3])
        raise ParameterError("node", node, f"a node name of this plan, e.g. {some}")
    raise ParameterError("node", node, "a node index, a node name or a NodePlacement")


def explain(plan: Plan, node: int | str | NodePlacement) -> NodeExplanation:
    """Everything the plan knows about one node (see the module docstring for the two inferences)."""
    n = find_node(plan, node)
    by_name = {x.name: x for x in plan.nodes}
    allocated = {a.name: a for a in plan.allocs}
    compute = [x for x in sorted(plan.nodes, key=lambda x: x.index) if not x.is_view]

    sources: list[Source] = []
    for name in n.srcs:
        cp = parse_copy_name(name)
        orig = cp.src if cp is not None else name
        src_node = by_name.get(orig)
        if src_node is not None:
            kind, backend = ("view" if src_node.is_view else "node"), src_node.backend
        else:
            kind, backend = "leaf", ""
        if cp is not None and not backend:
            backend = next((i.src_backend for s in plan.splits for i in s.inputs if i.name == orig), "")
        sources.append(Source(orig, kind, backend, name if cp is not None else None))

    followed: tuple[str, ...] = ()
    cause = n.cause
    if cause in (Cause.WEIGHT, Cause.OP_OFFLOAD):
        w = next((s.name for s in sources if s.kind == "leaf" and s.name not in allocated), None)
        followed = (w,) if w else ()
    elif cause is Cause.BUFFER:
        followed = (sources[0].name,) if n.is_view and sources else (n.name,)
    elif cause in (Cause.EXPAND_DOWN, Cause.EXPAND_UP):
        pos = next((i for i, x in enumerate(compute) if x.index == n.index), None)
        if pos is not None:
            k = pos - 1 if cause is Cause.EXPAND_DOWN else pos + 1
            if 0 <= k < len(compute):
                followed = (f"{compute[k].name} (node #{compute[k].index}, {compute[k].backend})",)
    elif cause is Cause.BEST_INPUTS:
        followed = tuple(s.name for s in sources if s.backend == n.backend)
    elif cause is Cause.VIEW_SOURCE:
        followed = (sources[0].name,) if sources else ()
    elif cause is Cause.NODE_SOURCE:
        user = next((x for x in plan.nodes if n.name in x.srcs), None)
        followed = (user.name,) if user is not None else ()

    split = next((s for s in plan.splits if s.index == n.split), None)
    copies_in = tuple(s.copy for s in sources if s.copy is not None
                      and split is not None and any(i.name == s.name for i in split.inputs))
    copies_out = tuple(OutputCopy(s.index, s.backend, i.nbytes) for s in plan.splits for i in s.inputs
                       if i.name == n.name)
    return NodeExplanation(n, PASS_OF.get(cause, "?"), RULE_OF.get(cause, cause.value), followed,
                           tuple(sources), copies_in, copies_out, allocated.get(n.name), plan.n_copies)


__all__ = ["CopyName", "NodeExplanation", "OutputCopy", "Source", "explain", "find_node", "parse_copy_name"]
