"""``ggml_backend_sched_split_graph``: the five placement passes and the graph copy, as functions.

:func:`ggml_backend_sched_split_graph` takes everything it reads as arguments (the backends,
their buffer types, the tables the scheduler carries between graphs) and returns a frozen
:class:`Assignment`: the backend of every tensor and why, the input copies, the splits and the
graph copy the allocator plans. Each pass is its own function named after the part of ggml's
function it ports; every loop visits in ggml's order, and the comments name the rule each
branch reproduces.

The tables a pass fills (``ids``, ``causes``, ``copies``) are built by
:func:`ggml_backend_sched_split_graph` alone and frozen into the Assignment when it returns;
the scheduler never writes into an Assignment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from toolkit.backend.buft import BufferType
from toolkit.backend.device import Backend
from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import VIEW_OPS, BufferUsage, Op, Tensor, TensorFlag
from toolkit.sched.metadata import GGML_SCHED_MAX_SPLIT_INPUTS, TENSOR_OVERHEAD
from toolkit.sched.plan import Cause

_WEIGHTS = BufferUsage.WEIGHTS
_INPUT = TensorFlag.INPUT
_OUTPUT = TensorFlag.OUTPUT
_and = int.__and__  # IntFlag's own & is Python-level; this is the C one
# op names: string hashing is C-fast, Enum hashing is not
VIEW_OP_NAMES = frozenset(op.value for op in VIEW_OPS)

Ids = dict[int, int]                          # id(tensor) -> backend index (hv_tensor_backend_ids)
Causes = dict[int, Cause]                     # id(tensor) -> why (SET_CAUSE of ggml debug builds)
Copies = dict[tuple[int, int], list[Tensor]]  # (id(tensor), backend) -> one copy per n_copies
BufferSupported = Callable[[Tensor, int], bool]


class SchedulerAbort(RuntimeError):
    """Where ggml aborts during splitting (the message says which rule and which tensor)."""


@dataclass(frozen=True, eq=False)
class Split:
    """One ``ggml_backend_sched_split``: backend, half-open node range, inputs, and the inputs
    capacity of its slot (slots persist across graphs on the same scheduler)."""

    backend_id: int
    i_start: int
    i_end: int
    inputs: tuple[Tensor, ...]
    inputs_capacity: int
    nodes: tuple[Tensor, ...]

    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    def __repr__(self) -> str:
        return (f"Split(backend_id={self.backend_id}, nodes=[{self.i_start}, {self.i_end}), "
                f"n_inputs={self.n_inputs}, inputs_capacity={self.inputs_capacity})")


@dataclass(frozen=True, eq=False)
class Assignment:
    """The result of one ``ggml_backend_sched_split_graph``: plain data, never written after.

    ``node_ids``/``leaf_ids`` are ggml's fixed-size ``node_backend_ids``/``leaf_backend_ids``
    arrays: positions past this graph's graph copy keep what an older graph wrote there, which
    the change check of ``ggml_backend_sched_alloc_splits`` reads.
    """

    graph: Graph
    backend_ids: Mapping[int, int]
    causes: Mapping[int, Cause]
    copies: Mapping[tuple[int, int], Sequence[Tensor]]
    splits: tuple[Split, ...]
    graph_inputs: tuple[Tensor, ...]
    graph_copy_nodes: tuple[Tensor, ...]
    graph_copy_leafs: tuple[Tensor, ...]
    node_ids: tuple[int, ...]
    leaf_ids: tuple[int, ...]
    cur_copy: int
    n_ctx_tensors: int                   # tensors created in the scheduler's context (copies, views)
    null_in_hash: bool                   # pass 3 looked up a null view_src (one more hash slot used)
    # what persists on the scheduler and may have grown while splitting
    inputs_capacities: tuple[int, ...]   # every split slot's inputs capacity (0: never used)
    splits_capacity: int
    graph_inputs_capacity: int
    warnings: tuple[str, ...] = field(default=())

    @property
    def n_splits(self) -> int:
        return len(self.splits)

    def tensor_backend_id(self, t: Tensor) -> int:
        return self.backend_ids.get(id(t), -1)

    def split_input_pairs(self, split: Split, copy: int) -> list[tuple[Tensor, Tensor]]:
        """(source, its copy ``copy`` on the split's backend) for each input, in input order."""
        return [(t, self.copies[(id(t), split.backend_id)][copy]) for t in split.inputs]


def _dup_layout(src: Tensor, name: str) -> Tensor:
    """``ggml_dup_tensor_layout``: same type, shape and *strides* (a copy's nbytes = the source's)."""
    t = Tensor(src.type, src.ne, nb=src.nb)
    t.name = name
    return t


def _view_dep(src: Tensor) -> Tensor:
    """``ggml_view_tensor`` of a split input with src[0] = input: keeps the source alive while copied."""
    t = Tensor(src.type, src.ne, view_src=src, view_offs=0, nb=src.nb, name=f"{src.name} (view)")
    t.src = [src]
    return t


Readers = dict[BufferType, tuple[int, ...]]   # buft -> the backends whose supports_buft accepts it


def _readers(backends: Sequence[Backend], buft: BufferType, memo: Readers) -> tuple[int, ...]:
    """The backends that read ``buft``, in order (``supports_buft`` asked once per split)."""
    r = memo.get(buft)
    if r is None:
        r = memo[buft] = tuple(b for b, be in enumerate(backends) if be.supports_buft(buft))
    return r


def _backend_from_buffer(backends: Sequence[Backend], t: Tensor, op: Tensor, readers: Readers) -> int:
    """``ggml_backend_sched_backend_from_buffer``: the first backend that reads t's buffer and runs op."""
    buf = t.view_src.buffer if t.view_src is not None else t.buffer
    if buf is None:
        return -1
    for b in _readers(backends, buf.buft, readers):
        if backends[b].supports_op(op):
            return b
    return -1


def _buffer_supported_fn(backends: Sequence[Backend], bufts: Sequence[BufferType], ids: Ids,
                         readers: Readers) -> BufferSupported:
    """``ggml_backend_sched_buffer_supported``: can backend b read t where it lives (or will live)?"""
    get = ids.get

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
        return b in _readers(backends, buft, readers)

    return buffer_supported


def _backend_id_from_cur(backends: Sequence[Backend], op_offload: bool, t: Tensor, causes: Causes,
                         readers: Readers) -> int:
    """``ggml_backend_sched_backend_id_from_cur``: pre-allocated buffer, graph input, weight, op offload."""
    last = len(backends) - 1
    # the tensor's buffer, then its view base's: a view's own lookup already reads the base's buffer
    # (views point at their base), so both of ggml's lookups give the same answer
    vs = t.view_src
    buf = vs.buffer if vs is not None else t.buffer
    if buf is not None:
        for b in _readers(backends, buf.buft, readers):
            if backends[b].supports_op(t):
                causes[id(t)] = Cause.BUFFER
                return b
    if buf is not None or t.buffer is not None:
        held = buf if buf is not None else t.buffer
        raise SchedulerAbort(
            f"pre-allocated tensor ({t.name}) in a buffer ({held.buft.name}) that cannot run the operation "
            f"({t.op_desc()})"
        )
    if _and(t.flags, 1):
        causes[id(t)] = Cause.INPUT
        return last
    # weight rule: the first weight src decides; ROPE and FLASH_ATTN_EXT are skipped (their weight-like
    # sources are not what should pin them)
    if t.op is not Op.ROPE and t.op is not Op.FLASH_ATTN_EXT:
        for src in t.src:
            if src is None:
                continue
            sbuf = src.buffer
            if sbuf is not None and sbuf.usage is _WEIGHTS:
                wb = _backend_from_buffer(backends, src, t, readers)
                if op_offload and wb == last and sbuf.buft.is_host:
                    for b in range(wb):
                        if backends[b].supports_op(t) and backends[b].offload_op(t):
                            causes[id(t)] = Cause.OP_OFFLOAD
                            return b
                causes[id(t)] = Cause.WEIGHT
                return wb
    return -1


def pass1_assign_from_cur(graph: Graph, backends: Sequence[Backend], op_offload: bool,
                          ids: Ids, causes: Causes, readers: Readers) -> None:
    """Pass 1: pre-allocated tensors, graph inputs and weights decide (leafs, then nodes)."""
    get = ids.get
    for t in graph.leafs:
        if get(id(t), -1) == -1:
            ids[id(t)] = _backend_id_from_cur(backends, op_offload, t, causes, readers)
    for t in graph.nodes:
        if get(id(t), -1) == -1:
            ids[id(t)] = _backend_id_from_cur(backends, op_offload, t, causes, readers)


def pass2_expand(compute: Sequence[Tensor], backends: Sequence[Backend], ids: Ids, causes: Causes) -> None:
    """Pass 2: expand assignments to neighbouring nodes, four sweeps over non-view nodes
    (down then up skipping the CPU, then down and up with it)."""
    last = len(backends) - 1
    get = ids.get
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


def pass3_upgrade(compute: Sequence[Tensor], backends: Sequence[Backend], bufts: Sequence[BufferType],
                  buffer_supported: BufferSupported, ids: Ids, causes: Causes) -> bool:
    """Pass 3: unassigned nodes go where most of their inputs are; assigned ones move to a
    higher-priority backend with the same buffer type when it runs them. Returns whether a null
    ``view_src`` was looked up (ggml hashes it: a harmless quirk that takes one more hash slot)."""
    n_b = len(backends)
    get = ids.get
    null_in_hash = False
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
                        null_in_hash = True
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
    return null_in_hash


def pass4_assign_remaining(graph: Graph, backends: Sequence[Backend], ids: Ids, causes: Causes) -> None:
    """Pass 4: views take their base's backend, unassigned sources their user's; a node nothing
    assigned goes to the first backend that supports it."""
    n_b = len(backends)
    get = ids.get
    for t in graph.nodes:
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


class _SplitSlot:
    """A split being built by pass 5 (frozen into a :class:`Split` at the end)."""

    __slots__ = ("backend_id", "i_start", "i_end", "inputs", "inputs_capacity")

    def __init__(self, inputs_capacity: int) -> None:
        self.backend_id = 0
        self.i_start = 0
        self.i_end = 0
        self.inputs: list[Tensor] = []
        self.inputs_capacity = inputs_capacity


@dataclass
class _Pass5Result:
    slots: list[_SplitSlot]
    capacities: list[int]
    splits_capacity: int
    graph_inputs: list[Tensor]
    graph_inputs_capacity: int
    n_ctx_tensors: int
    warnings: list[str]


def pass5_split(graph: Graph, backends: Sequence[Backend], n_copies: int, cur_copy: int,
                buffer_supported: BufferSupported, ids: Ids, copies: Copies, capacities: Sequence[int],
                splits_capacity: int, graph_inputs_capacity: int) -> _Pass5Result:
    """Pass 5: cut the node list into splits and create the input copies; sources are rewritten
    to point at their copy for ``cur_copy`` (the graph is mutated, as ggml does).

    ``capacities`` are the inputs capacities of the scheduler's split slots: a slot keeps its
    grown capacity for later graphs (it starts at 0 and grows to GGML_SCHED_MAX_SPLIT_INPUTS, then doubles).
    """
    get = ids.get
    nodes = graph.nodes
    caps = list(capacities)
    slots: list[_SplitSlot] = []
    graph_inputs: list[Tensor] = []
    warnings: list[str] = []
    n_ctx = 0

    def slot(k: int) -> _SplitSlot:
        nonlocal splits_capacity
        while k >= len(caps):
            caps.append(0)
        if k >= splits_capacity:
            splits_capacity *= 2
        sl = _SplitSlot(caps[k])
        slots.append(sl)
        return sl

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
                # a fresh split per offloaded host weight, so earlier weight copies can be freed
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
            caps[len(slots) - 1] = split.inputs_capacity
            split = slot(len(slots))
            split.backend_id = nb
            split.i_start = i
            cur = nb
        for j, src in enumerate(node.src):
            if src is None:
                continue
            sb = get(id(src), -1)
            if sb == -1:
                raise SchedulerAbort(f"source {src.name} of {node.name} has no backend")
            if n_copies > 1 and _and(src.flags, 1) and (id(src), sb) not in copies:
                # graph-input replication: the entry at cur_copy is the tensor itself
                name = backends[sb].name
                reps: list[Tensor] = []
                for c in range(n_copies):
                    t = src if c == cur_copy else _dup_layout(src, f"{name}#{src.name}#{c}")
                    if c != cur_copy:
                        n_ctx += 1
                    t.flags |= _INPUT | _OUTPUT
                    reps.append(t)
                copies[(id(src), sb)] = reps
                if len(graph_inputs) >= graph_inputs_capacity:
                    warnings.append(f"increasing graph inputs capacity from {graph_inputs_capacity} to "
                                    f"{graph_inputs_capacity * 2}")
                    graph_inputs_capacity *= 2
                graph_inputs.append(src)
            if sb != cur and not buffer_supported(src, cur):
                entries = copies.get((id(src), cur))
                if entries is None:
                    name = backends[cur].name
                    entries = [_dup_layout(src, f"{name}#{src.name}#{c}") for c in range(n_copies)]
                    n_ctx += n_copies
                    if n_copies > 1:
                        for t in entries:
                            t.flags |= _INPUT | _OUTPUT
                    copies[(id(src), cur)] = entries
                    if len(split.inputs) >= split.inputs_capacity:
                        new_cap = GGML_SCHED_MAX_SPLIT_INPUTS if split.inputs_capacity == 0 \
                            else split.inputs_capacity * 2
                        if split.inputs_capacity:
                            warnings.append(
                                f"increasing split inputs capacity from {split.inputs_capacity} to {new_cap}")
                        split.inputs_capacity = new_cap
                    split.inputs.append(src)
                node.src[j] = entries[cur_copy]
    split.i_end = n
    caps[len(slots) - 1] = split.inputs_capacity
    return _Pass5Result(slots, caps, splits_capacity, graph_inputs, graph_inputs_capacity, n_ctx, warnings)


def build_graph_copy(graph: Graph, splits: Sequence[Split], graph_inputs: Sequence[Tensor], ids: Ids,
                     copies: Copies, n_copies: int, cur_copy: int) -> tuple[list[Tensor], list[int], list[Tensor],
                                                                           list[int], int]:
    """The end of ``ggml_backend_sched_split_graph``: ``graph_copy`` with, per split, a dependency
    view and the copy of each input, then the split's nodes; under pipeline parallelism every
    copy of the graph inputs and split inputs as leafs, then the graph's leafs.

    Returns (nodes, node backend ids, leafs, leaf backend ids, dependency views created).
    """
    get = ids.get
    gc_nodes: list[Tensor] = []
    gc_leafs: list[Tensor] = []
    node_ids: list[int] = []
    leaf_ids: list[int] = []
    n_views = 0
    for split in splits:
        for inp in split.inputs:
            dep = _view_dep(inp)
            n_views += 1
            gc_nodes.append(dep)
            node_ids.append(get(id(inp), -1))
            gc_nodes.append(copies[(id(inp), split.backend_id)][cur_copy])
            node_ids.append(split.backend_id)
        for t in split.nodes:
            gc_nodes.append(t)
            node_ids.append(get(id(t), -1))
    if n_copies > 1:
        for inp in graph_inputs:
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
    return gc_nodes, node_ids, gc_leafs, leaf_ids, n_views


def _over(older: Sequence[int], new: list[int]) -> tuple[int, ...]:
    """ggml's fixed-size id arrays: this graph's ids, then what an older graph left past them."""
    n = len(new)
    return tuple(new) + tuple(older[n:]) if len(older) > n else tuple(new)


@dataclass(frozen=True)
class SchedState:
    """What ``ggml_backend_sched_split_graph`` reads from the scheduler besides the graph."""

    backends: Sequence[Backend]
    bufts: Sequence[BufferType]
    op_offload: bool
    n_copies: int
    cur_copy: int
    context_buffer_size: int
    inputs_capacities: Sequence[int]
    splits_capacity: int
    graph_inputs_capacity: int
    older_node_ids: Sequence[int] = ()   # the id arrays this split overwrites (two graphs ago)
    older_leaf_ids: Sequence[int] = ()


def ggml_backend_sched_split_graph(graph: Graph, st: SchedState, ids: Ids, causes: Causes,
                                   copies: Copies) -> Assignment:
    """Assign every tensor a backend (passes 1-4), cut splits and create input copies (pass 5),
    and build the graph copy. ``ids``/``causes``/``copies`` are the tables to start from (the
    user's pins, or what an earlier split left when the scheduler was not reset); they become the
    Assignment's and must not be written afterwards. Mutates ``graph``: sources point at copies.
    """
    backends = st.backends
    readers: Readers = {}
    buffer_supported = _buffer_supported_fn(backends, st.bufts, ids, readers)
    pass1_assign_from_cur(graph, backends, st.op_offload, ids, causes, readers)
    compute = [t for t in graph.nodes if t.op._value_ not in VIEW_OP_NAMES]
    pass2_expand(compute, backends, ids, causes)
    null_in_hash = pass3_upgrade(compute, backends, st.bufts, buffer_supported, ids, causes)
    pass4_assign_remaining(graph, backends, ids, causes)
    p5 = pass5_split(graph, backends, st.n_copies, st.cur_copy, buffer_supported, ids, copies,
                     st.inputs_capacities, st.splits_capacity, st.graph_inputs_capacity)
    nodes = graph.nodes
    splits = tuple(Split(sl.backend_id, sl.i_start, sl.i_end, tuple(sl.inputs), sl.inputs_capacity,
                         tuple(nodes[sl.i_start:sl.i_end])) for sl in p5.slots)
    gc_nodes, node_ids, gc_leafs, leaf_ids, n_views = build_graph_copy(
        graph, splits, p5.graph_inputs, ids, copies, st.n_copies, st.cur_copy)
    n_ctx = p5.n_ctx_tensors + n_views
    if n_ctx * TENSOR_OVERHEAD > st.context_buffer_size:
        raise SchedulerAbort(
            f"not enough space in the context's memory pool: {n_ctx} scheduler tensors need "
            f"{n_ctx * TENSOR_OVERHEAD} bytes, the context buffer holds {st.context_buffer_size}"
        )
    return Assignment(
        graph, ids, causes, copies, splits, tuple(p5.graph_inputs), tuple(gc_nodes), tuple(gc_leafs),
        _over(st.older_node_ids, node_ids), _over(st.older_leaf_ids, leaf_ids), st.cur_copy, n_ctx, null_in_hash,
        tuple(p5.capacities), p5.splits_capacity, p5.graph_inputs_capacity, tuple(p5.warnings))
