"""The :class:`~toolkit.sched.plan.Plan` and the ``GGML_SCHED_DEBUG=2`` text, as pure functions of
an :class:`~toolkit.sched.split.Assignment` (and, for the plan, the graph allocator's last plan)."""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.backend.device import Backend
from toolkit.ggml.tensor import VIEW_OPS, Tensor
from toolkit.sched.gallocr import GraphAllocator, merged_intervals, peak_live_bytes
from toolkit.sched.plan import BufferPlan, Cause, NodePlacement, Plan, SplitInfo, SplitInput, TensorAlloc
from toolkit.sched.split import Assignment

# the SET_CAUSE codes of ggml debug builds
CAUSE_CODES = {
    Cause.BUFFER: "1.dst", Cause.INPUT: "1.inp", Cause.WEIGHT: "1.wgt", Cause.OP_OFFLOAD: "1.off",
    Cause.EXPAND_UP: "2.sup", Cause.EXPAND_DOWN: "2.sup", Cause.FIRST_SUPPORTED: "2.sup",
    Cause.UPGRADE: "3.upg", Cause.BEST_INPUTS: "3.best", Cause.VIEW_SOURCE: "4.vsrc",
    Cause.NODE_SOURCE: "4.cur", Cause.USER_PIN: "usr",
}


def fmt_size(n: int) -> str:
    """ggml-backend's ``fmt_size``: whole MiB at or above 1 MiB, else whole KiB."""
    return f"{n // 1024 // 1024}M" if n >= 1024 * 1024 else f"{n // 1024}K"


def dump(a: Assignment, backends: Sequence[Backend], causes: bool = False) -> str:
    """``ggml_backend_sched_print_assignments`` at debug level 2 for a split graph."""
    g = a.graph
    ids = a.backend_ids
    cz = a.causes
    splits = a.splits

    def bname(t: Tensor) -> str:
        b = ids.get(id(t), -1)
        return "NULL" if b == -1 else backends[b].name

    def cause(t: Tensor) -> str:
        if not causes:
            return ""
        c = cz.get(id(t))
        return CAUSE_CODES.get(c, "") if c is not None else ""

    out: list[str] = []
    cur = 0
    for i, node in enumerate(g.nodes):
        if cur < len(splits) and i == splits[cur].i_start:
            sp = splits[cur]
            out.append(f"\n## SPLIT #{cur}: {backends[sp.backend_id].name} # {sp.n_inputs} inputs")
            for j, inp in enumerate(sp.inputs):
                if j == 0:
                    out.append(": ")
                out.append(f"[{inp.name} ({fmt_size(inp.nbytes):>5.5})] ")
            out.append("\n")
            cur += 1
        if node.op in VIEW_OPS:
            continue
        out.append(
            f"node #{i:3d} ({node.op_desc():>10.10}): {node.name:>20.20} ({fmt_size(node.nbytes):>5.5}) "
            f"[{bname(node):>5.5} {cause(node):>8.8}] use={g.use_count(node)},c=1:"
        )
        for src in node.src:
            if src is None:
                continue
            out.append(f" {src.name:>20.20} ({fmt_size(src.nbytes):>5.5}) [{bname(src):>5.5} {cause(src):>8.8}]")
        out.append("\n")
    return "".join(out)


def make_plan(a: Assignment | None, backends: Sequence[Backend], galloc: GraphAllocator, allocated: Sequence[int],
              n_copies: int, notes: Sequence[str] = ()) -> Plan:
    """Placements, splits, allocations and buffer sizes of a split graph and its allocation.

    ``allocated`` is ``get_buffer_size`` per backend (what the scheduler holds); ``notes`` the
    scheduler's warnings."""
    if a is None:
        return Plan(0, 0, n_copies, (), (), (), ())
    g = a.graph
    ids = a.backend_ids
    cz = a.causes
    split_of: dict[int, int] = {}
    splits: list[SplitInfo] = []
    for k, sp in enumerate(a.splits):
        for t in sp.nodes:
            if t.op not in VIEW_OPS:
                split_of[id(t)] = k
        splits.append(SplitInfo(
            k, backends[sp.backend_id].name, sp.backend_id, sp.i_start, sp.i_end,
            tuple(SplitInput(t.name, backends[ids.get(id(t), -1)].name if ids.get(id(t), -1) >= 0 else "NULL",
                             t.nbytes, t.is_weight) for t in sp.inputs),
            sp.inputs_capacity,
        ))
    nodes = []
    for i, t in enumerate(g.nodes):
        b = ids.get(id(t), -1)
        nodes.append(NodePlacement(
            i, t.name, t.op_desc(), backends[b].name if b >= 0 else "NULL", b,
            cz.get(id(t), Cause.FIRST_SUPPORTED), split_of.get(id(t), -1), t.op in VIEW_OPS, t.nbytes,
            tuple(src.name for src in t.src if src is not None), t.ne, t.type.name.lower(),
        ))
    allocs = []
    for life in galloc.lifetimes:
        allocs.append(TensorAlloc(
            life.tensor.name, galloc.bufts[life.buffer_id].name, life.chunk, life.offset, life.size, life.first,
            life.last, life.inplace_of.name if life.inplace_of is not None else None,
        ))
    intervals, _ = merged_intervals(galloc.lifetimes)
    needed = galloc.needed_sizes()
    buffers = []
    n_backends = len(backends)
    for i in range(n_backends):
        if galloc.shares_allocator(i) != i:
            continue
        sharing = [j for j in range(n_backends) if galloc.shares_allocator(j) == i]
        buffers.append(BufferPlan(
            galloc.bufts[i].name, tuple(backends[j].name for j in sharing), allocated[i], needed[i],
            galloc.chunk_sizes(i), peak_live_bytes(intervals, set(sharing)),
        ))
    return Plan(
        g.n_nodes, g.n_leafs, n_copies, tuple(nodes), tuple(splits), tuple(allocs), tuple(buffers),
        graph_copy_nodes=len(a.graph_copy_nodes), notes=tuple(notes),
    )
