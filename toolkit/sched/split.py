"""``ggml_backend_sched_split_graph``: passes 1–5 and graph_copy (spec §3).

Written as functions over a :class:`~toolkit.sched.scheduler.Scheduler` so that the
scheduler module stays about its lifecycle. Every loop visits in ggml's order; the
comments name the rule (and spec section) each branch reproduces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import VIEW_OPS, BufferUsage, Op, Tensor, TensorFlag
from toolkit.sched.metadata import GGML_SCHED_MAX_SPLIT_INPUTS, TENSOR_OVERHEAD
from toolkit.sched.plan import Cause

if TYPE_CHECKING:
    from toolkit.sched.scheduler import Scheduler

_WEIGHTS = BufferUsage.WEIGHTS
_INPUT = TensorFlag.INPUT
_OUTPUT = TensorFlag.OUTPUT
_and = int.__and__  # IntFlag's own & is Python-level; this is the C one
# op names: string hashing is C-fast, Enum hashing is not
VIEW_OP_NAMES = frozenset(op.value for op in VIEW_OPS)


class SchedulerAbort(RuntimeError):
    """Where ggml aborts during splitting (the message says which rule and which tensor)."""


class Split:
    """One split slot: ``backend_id``, half-open node range, inputs; the slot (and its
    ``inputs_capacity``) persists across graphs on the same scheduler (§3.5, T5)."""

    __slots__ = ("backend_id", "i_start", "i_end", "inputs", "inputs_capacity", "nodes")

    def __init__(self) -> None:
        self.backend_id = 0
        self.i_start = 0
        self.i_end = 0
        self.inputs: list[Tensor] = []
        self.inputs_capacity = 0
        self.nodes: list[Tensor] = []

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return (f"Split(backend_id={self.backend_id}, nodes=[{self.i_start}, {self.i_end}), "
                f"n_inputs={self.n_inputs}, inputs_capacity={self.inputs_capacity})")


def _dup_layout(src: Tensor, name: str) -> Tensor:
    """``ggml_dup_tensor_layout``: same type, shape and *strides* (a copy's nbytes = the source's)."""
    t = Tensor(src.type, src.ne, nb=src.nb)
    t.name = name
    return t


def _view_dep(src: Tensor) -> Tensor:
    """``ggml_view_tensor`` of a split input with src[0] = input: keeps the source alive (§3.6)."""
    t = Tensor(src.type, src.ne, view_src=src, view_offs=0, nb=src.nb, name=f"{src.name} (view)")
    t.src[0] = src
    return t


def split_graph(s: Scheduler, graph: Graph) -> None:
    backends = s.backends
    n_b = len(backends)
    last = n_b - 1
    bufts = s.bufts
    ids = s._ids
    causes = s._causes
    get = ids.get
    nodes = graph.nodes
    leafs = graph.leafs

    s.n_splits = 0
    s.graph_inputs = []
    s.is_reset = False
    s._ctx_tensors = 0
    s._graph = graph
    s._null_in_hash = False

    def from_buffer(t: Tensor, op: Tensor) -> int:
        buf = t.view_src.buffer if t.view_src is not None else t.buffer
        if buf is None:
            return -1
        for b in range(n_b):
            be = backends[b]
            if be.supports_buft(buf.buft) and be.supports_op(op):
                return b
        return -1

    def buffer_supported(t: Tensor, b: int) -> bool:
        vs = t.view_src
        buf = vs.buffer if vs is not None else t.buffer
        if buf is not None:
            buft = buf.buft
        else:
            tb = get(id(t), -1)
            if tb == -1 and vs is not None:
                tb = get(id(vs), -1)
            if tb == -1:
                return False
            buft = bufts[tb]
        return backends[b].supports_buft(buft)

    def from_cur(t: Tensor) -> int:
        b = from_buffer(t, t)
        if b != -1:
            causes[id(t)] = Cause.BUFFER
            return b
        vs = t.view_src
        if vs is not None:
            b = from_buffer(vs, t)
            if b != -1:
                causes[id(t)] = Cause.BUFFER
                return b
        if t.buffer is not None or (vs is not None and vs.buffer is not None):
            buf = vs.buffer if vs is not None else t.buffer
            raise SchedulerAbort(
                f"pre-allocated tensor ({t.name}) in a buffer ({buf.buft.name}) that cannot run the operation "
                f"({t.op_desc()})"
            )
        if _and(t.flags, 1):
            causes[id(t)] = Cause.INPUT
            return last
        # weight rule: the first weight src decides; ROPE and FLASH_ATTN_EXT are skipped (§3.1 step 5)
        if t.op is not Op.ROPE and t.op is not Op.FLASH_ATTN_EXT:
            for src in t.src:
                if src is None:
                    continue
                sbuf = src.buffer
                if sbuf is not None and sbuf.usage is _WEIGHTS:
                    wb = from_buffer(src, t)
                    if s.op_offload and wb == last and sbuf.buft.is_host:
                        for b in range(wb):
                            if backends[b].supports_op(t) and backends[b].offload_op(t):
                                causes[id(t)] = Cause.OP_OFFLOAD
                                return b
                    causes[id(t)] = Cause.WEIGHT
                    return wb
        return -1

    # ---- pass 1: pre-allocated tensors, inputs and weights (leafs, then nodes) -----------
    for t in leafs:
        if get(id(t), -1) == -1:
            ids[id(t)] = from_cur(t)
    for t in nodes:
        if get(id(t), -1) == -1:
            ids[id(t)] = from_cur(t)

    # ---- pass 2: expansion, four sweeps over non-view nodes (§3.2) -----------------------
    compute = [t for t in nodes if t.op._value_ not in VIEW_OP_NAMES]
    for order, gpu_only, cause in (
        (compute, True, Cause.EXPAND_DOWN),
        (compute[::-1], True, Cause.EXPAND_UP),
        (compute, False, Cause.EXPAND_DOWN),
        (compute[::-1], False, Cause.EXPAND_UP),
    ):
        cur = -1
        for t in order:
            b = get(id(t), -1)
            if b != -1:
                cur = -1 if (gpu_only and b == last) else b
            elif cur != -1 and backends[cur].supports_op(t):
                ids[id(t)] = cur
                causes[id(t)] = cause

    # ---- pass 3: best inputs for unassigned nodes, upgrades for assigned ones (§3.3) -----
    for t in compute:
        k = get(id(t), -1)
        if k == -1:
            best_n = -1
            for b in range(n_b):
                if not backends[b].supports_op(t):
                    continue
                n = 0
                for src in t.src:
                    if src is None:
                        continue
                    if get(id(src), -1) != -1:
                        known = True
                    elif src.view_src is None:
                        s._null_in_hash = True  # ggml hashes the null view_src (a harmless quirk)
                        known = False
                    else:
                        known = get(id(src.view_src), -1) != -1
                    if known and buffer_supported(src, b):
                        n += 1
                if n > best_n:
                    best_n = n
                    ids[id(t)] = b
                    causes[id(t)] = Cause.BEST_INPUTS
        else:
            for b in range(k):
                if bufts[b] is bufts[k] and backends[b].supports_op(t):
                    if all(buffer_supported(src, b) for src in t.src if src is not None):
                        ids[id(t)] = b
                        causes[id(t)] = Cause.UPGRADE
                        break

    # ---- pass 4: views take their base's backend, srcs their user's (§3.4) ---------------
    for t in nodes:
        cur = get(id(t), -1)
        if t.view_src is not None and cur == -1:
            cur = ids[id(t)] = get(id(t.view_src), -1)
            causes[id(t)] = Cause.VIEW_SOURCE
        for src in t.src:
            if src is None or get(id(src), -1) != -1:
                continue
            if src.view_src is not None:
                ids[id(src)] = get(id(src.view_src), -1)
                causes[id(src)] = Cause.VIEW_SOURCE
            else:
                ids[id(src)] = cur
                causes[id(src)] = Cause.NODE_SOURCE
        if cur == -1:
            for b in range(n_b):
                if backends[b].supports_op(t):
                    cur = ids[id(t)] = b
                    causes[id(t)] = Cause.FIRST_SUPPORTED
                    break
        if cur == -1:
            raise SchedulerAbort(f"node {t.name} ({t.op_desc()}) is supported by no backend (no CPU fallback)")

    _pass5(s, graph, buffer_supported)
    _build_graph_copy(s, graph)


def _pass5(s: Scheduler, graph: Graph, buffer_supported) -> None:  # type: ignore[no-untyped-def]
    """Splits and input copies (§3.5)."""
    ids = s._ids
    get = ids.get
    copies = s._copies
    backends = s.backends
    n_copies = s.n_copies
    cur_copy = s.cur_copy
    nodes = graph.nodes
    slots = s._slots

    def slot(k: int) -> Split:
        while k >= len(slots):
            slots.append(Split())
        if k >= s.splits_capacity:
            s.splits_capacity *= 2
        return slots[k]

    i = 0
    n = len(nodes)
    split = slot(0)
    split.backend_id = 0
    while i < n:
        if nodes[i].op._value_ not in VIEW_OP_NAMES:
            split.backend_id = get(id(nodes[i]), -1)
            break
        i += 1
    split.i_start = 0
    split.inputs = []
    i_split = 0
    cur = split.backend_id
    first = i
    for i in range(first, n):
        node = nodes[i]
        if node.op._value_ in VIEW_OP_NAMES:
            continue
        nb = get(id(node), -1)
        if nb == -1:
            raise SchedulerAbort(f"node {node.name} has no backend after pass 4")
        need_new = False
        if nb == cur and split.inputs:
            for src in node.src:
                if src is None:
                    continue
                # a fresh split per offloaded host weight, so earlier weight copies can die (§3.5)
                sbuf = src.buffer
                if sbuf is not None and sbuf.usage is _WEIGHTS:
                    if get(id(src), -1) != cur and not buffer_supported(src, cur):
                        need_new = True
                        break
                if len(split.inputs) >= split.inputs_capacity:
                    if (get(id(src), -1) != cur and (id(src), cur) not in copies
                            and not buffer_supported(src, cur)):
                        need_new = True
                        break
        if nb != cur or need_new:
            split.i_end = i
            i_split += 1
            split = slot(i_split)
            split.backend_id = nb
            split.i_start = i
            split.inputs = []  # the slot keeps its inputs_capacity (T5)
            cur = nb
        for j, src in enumerate(node.src):
            if src is None:
                continue
            sb = get(id(src), -1)
            if sb == -1:
                raise SchedulerAbort(f"source {src.name} of {node.name} has no backend")
            if n_copies > 1 and _and(src.flags, 1) and (id(src), sb) not in copies:
                # graph-input replication: the entry at cur_copy is the tensor itself (§3.5, §5.1)
                name = backends[sb].name
                reps: list[Tensor] = []
                for c in range(n_copies):
                    t = src if c == cur_copy else _dup_layout(src, f"{name}#{src.name}#{c}")
                    if c != cur_copy:
                        s._ctx_tensors += 1
                    t.flags |= _INPUT | _OUTPUT
                    reps.append(t)
                copies[(id(src), sb)] = reps
                if len(s.graph_inputs) >= s.graph_inputs_capacity:
                    s.warnings.append(f"increasing graph inputs capacity from {s.graph_inputs_capacity} to "
                                      f"{s.graph_inputs_capacity * 2}")
                    s.graph_inputs_capacity *= 2
                s.graph_inputs.append(src)
            if sb != cur and not buffer_supported(src, cur):
                entries = copies.get((id(src), cur))
                if entries is None:
                    name = backends[cur].name
                    entries = [_dup_layout(src, f"{name}#{src.name}#{c}") for c in range(n_copies)]
                    s._ctx_tensors += n_copies
                    if n_copies > 1:
                        for t in entries:
                            t.flags |= _INPUT | _OUTPUT
                    copies[(id(src), cur)] = entries
                    if len(split.inputs) >= split.inputs_capacity:
                        new_cap = GGML_SCHED_MAX_SPLIT_INPUTS if split.inputs_capacity == 0 \
                            else split.inputs_capacity * 2
                        if split.inputs_capacity:
                            s.warnings.append(
                                f"increasing split inputs capacity from {split.inputs_capacity} to {new_cap}")
                        split.inputs_capacity = new_cap
                    split.inputs.append(src)
                node.src[j] = entries[cur_copy]
    split.i_end = n
    s.n_splits = i_split + 1


def _build_graph_copy(s: Scheduler, graph: Graph) -> None:
    """graph_copy: per split, (dep, copy) per input then the split's nodes; leafs (§3.6)."""
    ids = s._ids
    get = ids.get
    copies = s._copies
    cur_copy = s.cur_copy
    n_copies = s.n_copies
    # keep the previous assignment for the change check of alloc_splits (§6.7)
    s._node_ids, s._prev_node_ids = s._prev_node_ids, s._node_ids
    s._leaf_ids, s._prev_leaf_ids = s._prev_leaf_ids, s._leaf_ids
    gc_nodes: list[Tensor] = []
    gc_leafs: list[Tensor] = []
    node_ids: list[int] = []
    leaf_ids: list[int] = []
    nodes = graph.nodes
    splits = s.splits
    for split in splits:
        split.nodes = nodes[split.i_start:split.i_end]
        for inp in split.inputs:
            dep = _view_dep(inp)
            s._ctx_tensors += 1
            gc_nodes.append(dep)
            node_ids.append(get(id(inp), -1))
            gc_nodes.append(copies[(id(inp), split.backend_id)][cur_copy])
            node_ids.append(split.backend_id)
        for t in split.nodes:
            gc_nodes.append(t)
            node_ids.append(get(id(t), -1))
    if n_copies > 1:
        for inp in s.graph_inputs:
            b = get(id(inp), -1)
            for t in copies[(id(inp), b)]:
                gc_leafs.append(t)
                leaf_ids.append(b)
        for split in splits:
            for inp in split.inputs:
                for t in copies[(id(inp), split.backend_id)]:
                    gc_leafs.append(t)
                    leaf_ids.append(split.backend_id)
    for leaf in graph.leafs:
        gc_leafs.append(leaf)
        leaf_ids.append(get(id(leaf), -1))
    if s._ctx_tensors * TENSOR_OVERHEAD > s.context_buffer_size:
        raise SchedulerAbort(
            f"not enough space in the context's memory pool: {s._ctx_tensors} scheduler tensors need "
            f"{s._ctx_tensors * TENSOR_OVERHEAD} bytes, the context buffer holds {s.context_buffer_size}"
        )
    s.graph_copy_nodes = gc_nodes
    s.graph_copy_leafs = gc_leafs
    # write into the swapped-in arrays so stale tails survive, as with ggml's fixed arrays
    _overwrite(s._node_ids, node_ids)
    _overwrite(s._leaf_ids, leaf_ids)


def _overwrite(dst: list[int], src: list[int]) -> None:
    n = len(src)
    if len(dst) < n:
        dst.extend([0] * (n - len(dst)))
    dst[:n] = src
