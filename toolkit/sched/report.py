"""Plain snapshots (:mod:`toolkit.sched.plan`) and the ``GGML_SCHED_DEBUG=2`` text of a scheduler."""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.ggml.tensor import VIEW_OPS, Tensor
from toolkit.sched.plan import BufferPlan, Cause, NodePlacement, Plan, SplitInfo, SplitInput, TensorAlloc

if TYPE_CHECKING:
    from toolkit.sched.gallocr import Lifetime
    from toolkit.sched.scheduler import Scheduler

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


def dump(s: Scheduler, causes: bool = False) -> str:
    """``ggml_backend_sched_print_assignments`` at debug level 2 for the last split graph."""
    g = s._graph
    if g is None:
        return ""
    ids = s._snap_ids
    cz = s._snap_causes
    backends = s.backends
    splits = s.splits

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


def merged_intervals(lifetimes: list[Lifetime]) -> tuple[list[list[int]], dict[int, int]]:
    """In-place chains merged into one [size, first, last] per chain; tensor id -> interval index."""
    intervals: list[list[int]] = []
    index: dict[int, int] = {}
    for life in lifetimes:
        parent = life.inplace_of
        k = index.get(id(parent)) if parent is not None else None
        if k is None:
            index[id(life.tensor)] = len(intervals)
            intervals.append([life.size, life.first, life.last, life.buffer_id])
        else:
            iv = intervals[k]
            iv[0] = max(iv[0], life.size)
            iv[2] = max(iv[2], life.last)
            index[id(life.tensor)] = k
    return intervals, index


def peak_live_bytes(intervals: list[list[int]], buffer_ids: set[int]) -> int:
    """The lower bound: the largest sum of sizes of intervals live at one position (inclusive ends)."""
    delta: dict[int, int] = {}
    for size, first, last, bid in intervals:
        if bid in buffer_ids:
            delta[first] = delta.get(first, 0) + size
            delta[last + 1] = delta.get(last + 1, 0) - size
    peak = cur = 0
    for pos in sorted(delta):
        cur += delta[pos]
        peak = max(peak, cur)
    return peak


def make_plan(s: Scheduler) -> Plan:
    g = s._graph
    if g is None:
        return Plan(0, 0, s.n_copies, (), (), (), ())
    ids = s._snap_ids
    cz = s._snap_causes
    backends = s.backends
    split_of: dict[int, int] = {}
    splits: list[SplitInfo] = []
    for k, sp in enumerate(s.splits):
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
    galloc = s.galloc
    offl = s._offline_allocs
    allocs = []
    for life in galloc.lifetimes:
        chunk, offset = offl[id(life.tensor)] if offl is not None else (life.chunk, life.offset)
        allocs.append(TensorAlloc(
            life.tensor.name, galloc.bufts[life.buffer_id].name, chunk, offset, life.size, life.first, life.last,
            life.inplace_of.name if life.inplace_of is not None else None,
        ))
    intervals, _ = merged_intervals(galloc.lifetimes)
    needed = s.graph_needed_sizes()
    buffers = []
    for i in range(s.n_backends):
        if galloc.shares_allocator(i) != i:
            continue
        sharing = [j for j in range(s.n_backends) if galloc.shares_allocator(j) == i]
        chunks = s.planned_chunks(i)
        buffers.append(BufferPlan(
            s.bufts[i].name, tuple(backends[j].name for j in sharing), s.buffer_size(i), needed[i], chunks,
            peak_live_bytes(intervals, set(sharing)),
        ))
    return Plan(
        g.n_nodes, g.n_leafs, s.n_copies, tuple(nodes), tuple(splits), tuple(allocs), tuple(buffers),
        graph_copy_nodes=len(s.graph_copy_nodes), notes=tuple(s.warnings),
    )
