"""The graph allocator (``ggml_gallocr``): liveness planning over graph_copy, and the buffers.

Buffer id i is backend i. Backends whose buft is the same object share one dynamic
allocator and one buffer (``ggml_gallocr_new_n`` deduplicates bufts). ``reserve_n`` plans and
grows buffers (never shrinks them); ``alloc_graph`` replays the recorded plan onto a new graph.

Offsets come from ggml's dynamic allocator as the walk goes; a *placement strategy* (see
:data:`Placement`, e.g. the offline planner of ``toolkit.sched.offline_glue``) may then place the
same lifetimes again, and the allocator records and sizes its buffers from that placement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from toolkit.backend.buft import Buffer, BufferType
from toolkit.ggml.tensor import BufferUsage, Op, Tensor, TensorFlag
from toolkit.sched.dyn_alloc import DynAllocator
from toolkit.sched.metadata import hash_size

# ggml_op_can_inplace: the ops whose result may reuse the memory of a source it is the last consumer of
CAN_INPLACE_OPS = frozenset({
    Op.FILL, Op.SCALE, Op.DIAG_MASK_ZERO, Op.DIAG_MASK_INF, Op.ADD, Op.ADD_ID, Op.ADD1, Op.SUB, Op.MUL,
    Op.DIV, Op.SQR, Op.SQRT, Op.LOG, Op.UNARY, Op.ROPE, Op.ROPE_BACK, Op.SILU_BACK, Op.RMS_NORM,
    Op.RMS_NORM_BACK, Op.SOFT_MAX, Op.SOFT_MAX_BACK,
})
# plain-int views of the hot membership tests: Enum hashing and IntFlag arithmetic are Python-level
CAN_INPLACE_OP_NAMES = frozenset(op.value for op in CAN_INPLACE_OPS)
_INPUT = int(TensorFlag.INPUT)
_OUTPUT = int(TensorFlag.OUTPUT)
_and = int.__and__


class HashNode:
    """Per-tensor bookkeeping of one planning pass (``hash_node``).

    It is also the tensor's record after the pass (ggml copies buffer id, chunk, offset and the
    alloc size into a ``tensor_alloc`` per graph position; here each position points at the hash
    node, which no later pass writes: every pass starts a new hash). ``size_max`` is the alloc
    size in the buffer id's buft (-1 until known); :data:`NO_RECORD` marks views and tensors
    that have memory already.
    """

    __slots__ = ("n_children", "n_views", "buffer_id", "chunk", "offset", "allocated", "size_max", "life")

    def __init__(self, buffer_id: int = 0, size_max: int = -1) -> None:
        self.n_children = 0
        self.n_views = 0
        self.buffer_id = buffer_id
        self.chunk = 0
        self.offset = 0
        self.allocated = False
        self.size_max = size_max
        self.life: Lifetime | None = None   # the planned allocation of this tensor, if any


# the record of a view or of a tensor that has memory already (buffer -1)
NO_RECORD = HashNode(-1, 0)


@dataclass(slots=True)
class Lifetime:
    """One planned allocation: [first, last] graph_copy node positions, for plans and figures."""

    tensor: Tensor
    buffer_id: int
    chunk: int
    offset: int
    size: int           # aligned size
    first: int          # -1: leaf or counting phase
    last: int           # node position whose completion frees it; n_nodes when never freed
    inplace_of: Tensor | None = None


_NONE = Op.NONE


@dataclass(frozen=True)
class PlacementResult:
    """Where a placement strategy puts every planned tensor, and the chunk sizes that need."""

    offsets: dict[int, tuple[int, int]]          # id(tensor) -> (chunk, offset)
    chunks: tuple[tuple[int, ...], ...]          # per buffer id (a shared buft repeats its owner's)


# a placement strategy: (lifetimes, bufts, owner buffer id of each id, ggml's chunk sizes per id) -> placement
Placement = Callable[[Sequence["Lifetime"], Sequence[BufferType], Sequence[int], Sequence[tuple[int, ...]]],
                     PlacementResult]


def merged_intervals(lifetimes: Sequence[Lifetime]) -> tuple[list[list[int]], dict[int, int]]:
    """In-place chains merged into one [size, first, last, buffer id] per chain; tensor id -> interval index."""
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


def peak_live_bytes(intervals: Sequence[Sequence[int]], buffer_ids: set[int]) -> int:
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


class VBuffer:
    """A virtual buffer (``vbuffer``): one backend buffer per chunk, each the chunk's high-water mark."""

    def __init__(self, chunks: list[Buffer]) -> None:
        self.chunks = chunks

    def chunk_size(self, c: int) -> int:
        return self.chunks[c].size if c < len(self.chunks) else 0

    @property
    def size(self) -> int:
        return sum(b.size for b in self.chunks)

    def free(self) -> None:
        for b in self.chunks:
            b.free()
        self.chunks = []


class GraphAllocator:
    """``ggml_gallocr`` over ``bufts`` (one buffer id per entry); ``placement`` re-places what
    ggml's dynamic allocator planned (None: ggml's own offsets)."""

    def __init__(self, bufts: Sequence[BufferType], placement: Placement | None = None) -> None:
        self.bufts = list(bufts)
        self.placement = placement
        self.placed: PlacementResult | None = None   # the strategy's result for the last plan
        self.n_buffers = len(self.bufts)
        self.allocators: list[DynAllocator] = []
        for i, buft in enumerate(self.bufts):
            shared = next((self.allocators[j] for j in range(i) if self.bufts[j] is buft), None)
            self.allocators.append(shared or DynAllocator(buft.alignment, buft.get_max_size()))
        self.buffers: list[VBuffer | None] = [None] * self.n_buffers
        self.hash: dict[int, HashNode] = {}
        self.hash_capacity = 0
        self.node_records: list[tuple[HashNode, list[HashNode | None]]] = []
        self.leaf_records: list[HashNode] = []
        self.n_nodes = 0
        self.n_leafs = 0
        self.lifetimes: list[Lifetime] = []
        self.failed: str | None = None
        self._pos = -1

    # ---- helpers ---------------------------------------------------------------------
    def _hn(self, t: Tensor) -> HashNode:
        hn = self.hash.get(id(t))
        if hn is None:
            hn = self.hash[id(t)] = HashNode()
        return hn

    def shares_allocator(self, i: int) -> int:
        """The earliest buffer id whose allocator buffer i shares (i itself if none)."""
        a = self.allocators[i]
        return next(j for j in range(i + 1) if self.allocators[j] is a)

    # ---- planning walk: ggml_gallocr_alloc_graph_impl -----------------------------------
    def _allocate_node(self, t: Tensor, bid: int) -> None:
        hn = self.hash.get(id(t))
        if hn is None:
            hn = self.hash[id(t)] = HashNode()
        self._allocate(t, hn, bid)

    def _allocate(self, t: Tensor, hn: HashNode, bid: int) -> None:
        # ggml_gallocr_is_allocated, or a view (views are never allocated on their own)
        if hn.allocated or t.data is not None or t.buffer is not None or t.view_src is not None:
            return
        hn.allocated = True
        if t.op._value_ in CAN_INPLACE_OP_NAMES:
            for p in t.src:
                if p is None:
                    continue
                p_hn = self.hash.get(id(p))
                # views are never own, so the view-parent branch of ggml is unreachable
                if p_hn is None or not p_hn.allocated:
                    continue
                if _and(p.flags, _OUTPUT) or (p.view_src is not None and _and(p.view_src.flags, _OUTPUT)):
                    continue
                if p.type is not t.type or p.ne != t.ne or p.nb != t.nb:
                    continue
                if p_hn.n_children == 1 and p_hn.n_views == 0:
                    self._take_over(t, hn, p, p_hn)
                    return
        if bid < 0:  # ggml asserts buffer_id >= 0
            raise ValueError(f"tensor {t.name!r} has no backend (buffer id {bid}); cannot allocate it")
        alloc = self.allocators[bid]
        size = hn.size_max = self.bufts[bid].alloc_size(t)
        hn.buffer_id = bid
        hn.chunk, hn.offset = alloc.alloc(size)
        life = hn.life = Lifetime(t, bid, hn.chunk, hn.offset, size + (-size) % alloc.alignment, self._pos, -2)
        self.lifetimes.append(life)

    def _take_over(self, t: Tensor, hn: HashNode, p: Tensor, p_hn: HashNode) -> None:
        # t reuses p's memory in place, even on another buffer id; the surplus tail goes back
        pbid = p_hn.buffer_id
        alloc = self.allocators[pbid]
        al = alloc.alignment
        psize = p_hn.size_max
        tsize = hn.size_max = self.bufts[pbid].alloc_size(t)
        psize += (-psize) % al
        tsize += (-tsize) % al
        if psize > tsize:
            alloc.free((p_hn.chunk, p_hn.offset + tsize), psize - tsize)
        hn.buffer_id = pbid
        hn.chunk = p_hn.chunk
        hn.offset = p_hn.offset
        p_hn.allocated = False  # the parent is never freed now
        plife = p_hn.life
        if plife is not None:
            plife.last = self._pos
        life = hn.life = Lifetime(t, pbid, hn.chunk, hn.offset, tsize, self._pos, -2, inplace_of=p)
        self.lifetimes.append(life)

    def _free_node(self, t: Tensor, hn: HashNode) -> None:
        if _and(t.flags, _OUTPUT):
            return
        bid = hn.buffer_id
        self.allocators[bid].free((hn.chunk, hn.offset), hn.size_max)
        hn.allocated = False
        life = hn.life
        if life is not None:
            life.last = self._pos

    def _alloc_graph_impl(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor],
                          node_ids: Sequence[int] | None, leaf_ids: Sequence[int] | None) -> None:
        self.hash = {}
        self.lifetimes = []
        self._pos = -1
        hash_get = self._hn
        allocate = self._allocate_node
        h = self.hash
        for i, leaf in enumerate(leafs):
            allocate(leaf, leaf_ids[i] if leaf_ids else 0)
        # counting pass; INPUT tensors are placed now, before anything is freed
        for i, node in enumerate(nodes):
            if node.view_src is not None and node.op is not _NONE:
                hash_get(node.view_src).n_views += 1
            if _and(node.flags, _INPUT):
                allocate(node, node_ids[i] if node_ids else 0)
            for src in node.src:
                if src is None:
                    continue
                hn = h.get(id(src))
                if hn is None:
                    hn = h[id(src)] = HashNode()
                hn.n_children += 1
                if _and(src.flags, _INPUT):
                    allocate(src, node_ids[i] if node_ids else 0)
        # allocation pass: srcs, node, then free the srcs whose last consumer this was
        place = self._allocate
        for i, node in enumerate(nodes):
            self._pos = i
            bid = node_ids[i] if node_ids else 0
            srcs = [(s, h[id(s)]) for s in node.src if s is not None]   # counted above: in the hash
            for p, p_hn in srcs:
                if not p_hn.allocated:
                    place(p, p_hn, bid)
            n_hn = h.get(id(node))
            if n_hn is None:
                n_hn = h[id(node)] = HashNode()
            place(node, n_hn, bid)
            for p, p_hn in srcs:
                p_hn.n_children -= 1
                if p_hn.n_children == 0 and p_hn.n_views == 0:
                    vs = p.view_src
                    if vs is not None:
                        vs_hn = h[id(vs)]
                        vs_hn.n_views -= 1
                        if vs_hn.n_views == 0 and vs_hn.n_children == 0 and vs_hn.allocated:
                            self._free_node(vs, vs_hn)
                    elif p_hn.allocated:
                        self._free_node(p, p_hn)
        n = len(nodes)
        for life in self.lifetimes:
            if life.last == -2:
                life.last = n

    def _record(self, t: Tensor) -> HashNode:
        # a view, or a tensor that already has memory (data, or a buffer: weights, KV cache)
        if t.view_src is not None or t.data is not None or t.buffer is not None:
            return NO_RECORD
        hn = self.hash.get(id(t))
        if hn is None:
            hn = self.hash[id(t)] = HashNode()
        if hn.size_max < 0:
            hn.size_max = self.bufts[hn.buffer_id].alloc_size(t)
        return hn

    # ---- ggml_gallocr_reserve_n ------------------------------------------------------
    def plan(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor],
             node_ids: Sequence[int] | None = None, leaf_ids: Sequence[int] | None = None) -> None:
        """Steps 1–3 of reserve_n: grow the hash set, reset the allocators, plan (then let the
        placement strategy re-place the lifetimes), record."""
        min_hash = len(nodes) + len(leafs)
        min_hash += min_hash // 4
        if self.hash_capacity < min_hash:
            self.hash_capacity = hash_size(min_hash)
        for a in self.allocators:
            a.reset()
        self._alloc_graph_impl(nodes, leafs, node_ids, leaf_ids)
        self.placed = None
        if self.placement is not None:
            shares = [self.shares_allocator(i) for i in range(self.n_buffers)]
            ggml_chunks = [tuple(a.chunk_sizes()) for a in self.allocators]
            placed = self.placement(self.lifetimes, self.bufts, shares, ggml_chunks)
            for life in self.lifetimes:
                chunk, off = placed.offsets[id(life.tensor)]
                hn = self.hash[id(life.tensor)]
                life.chunk, life.offset = hn.chunk, hn.offset = chunk, off
            self.placed = placed
        self.make_records(nodes, leafs)

    def make_records(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor]) -> None:
        """Step 3 of reserve_n: the per-position records alloc_graph replays."""
        rec = self._record
        self.node_records = [(rec(n), [None if s is None else rec(s) for s in n.src]) for n in nodes]
        self.leaf_records = [rec(leaf) for leaf in leafs]
        self.n_nodes = len(nodes)
        self.n_leafs = len(leafs)

    def reserve_n(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor],
                  node_ids: Sequence[int] | None = None, leaf_ids: Sequence[int] | None = None,
                  *, no_alloc: bool = False) -> bool:
        self.plan(nodes, leafs, node_ids, leaf_ids)
        return self.realloc_buffers(no_alloc=no_alloc)

    def chunk_sizes(self, i: int) -> tuple[int, ...]:
        """The chunk sizes the last plan needs for buffer id i (the placement's, else ggml's)."""
        if self.placed is not None:
            return self.placed.chunks[i]
        return tuple(self.allocators[i].chunk_sizes())

    def realloc_buffers(self, *, no_alloc: bool = False) -> bool:
        """Step 4 of reserve_n: grow-only (re)allocation per buffer id, shared bufts deduplicated."""
        self.failed = None
        for i in range(self.n_buffers):
            j = self.shares_allocator(i)
            if j != i:
                self.buffers[i] = self.buffers[j]
            new_chunks = self.chunk_sizes(i)
            cur = self.buffers[i]
            realloc = cur is None
            for c, new in enumerate(new_chunks):
                if new > (cur.chunk_size(c) if cur is not None else 0):
                    realloc = True
            if not realloc:
                continue
            if cur is not None:
                cur.free()
            if no_alloc:
                self.buffers[i] = None
                continue
            self.buffers[i] = self._alloc_chunks(i, new_chunks)
            if self.buffers[i] is None:
                self.failed = f"failed to allocate {self.bufts[i].name} buffer of size {sum(new_chunks)}"
                return False
        return True

    def _alloc_chunks(self, i: int, sizes: Sequence[int]) -> VBuffer | None:
        """One backend buffer per chunk for buffer id i; None (nothing kept) when one is refused."""
        chunks: list[Buffer] = []
        for c, size in enumerate(sizes):
            b = self.bufts[i].alloc_buffer(size, BufferUsage.COMPUTE, f"{self.bufts[i].name}#{c}")
            if b is None:
                for done in chunks:
                    done.free()
                return None
            chunks.append(b)
        return VBuffer(chunks)

    def buffer_size(self, i: int) -> int:
        """``ggml_gallocr_get_buffer_size``: 0 when null or the same buffer as an earlier id."""
        buf = self.buffers[i]
        if buf is None:
            return 0
        for j in range(i):
            if self.buffers[j] is buf:
                return 0
        return buf.size

    def max_sizes(self) -> list[int]:
        """``reserve_n_size``'s report: Σ chunk max_size per buffer id (not deduplicated)."""
        if self.placed is not None:
            return [sum(c) for c in self.placed.chunks]
        return [a.max_size() for a in self.allocators]

    def needed_sizes(self) -> list[int]:
        """What the last plan alone needs per buffer id, 0 for a buft shared with an earlier id."""
        raw = self.max_sizes()
        return [raw[i] if self.shares_allocator(i) == i else 0 for i in range(self.n_buffers)]

    def buffer_layout(self) -> list[tuple[int, ...] | None]:
        """The chunk sizes of each buffer id's allocated buffer (None: none allocated)."""
        return [None if b is None else tuple(c.size for c in b.chunks) for b in self.buffers]

    def restore_buffer_layout(self, layout: Sequence[tuple[int, ...] | None]) -> bool:
        """Reallocate the buffers to ``layout`` (a :meth:`buffer_layout` taken earlier): buffers that
        grew over past reserves come back at their old sizes after a replan from scratch."""
        for i, want in enumerate(layout):
            j = self.shares_allocator(i)
            if j != i:
                self.buffers[i] = self.buffers[j]
                continue
            cur = self.buffers[i]
            have = None if cur is None else tuple(c.size for c in cur.chunks)
            if have == want:
                continue
            if cur is not None:
                cur.free()
            self.buffers[i] = None if want is None else self._alloc_chunks(i, want)
            if want is not None and self.buffers[i] is None:
                return False
        return True

    def free(self) -> None:
        for i, b in enumerate(self.buffers):
            if b is not None and self.shares_allocator(i) == i:
                b.free()
        self.buffers = [None] * self.n_buffers

    # ---- ggml_gallocr_alloc_graph ---------------------------------------------------
    def _valid(self, t: Tensor, rec: HashNode | None) -> bool:
        size = 0
        if t.data is None and t.buffer is None and t.view_src is None:
            if rec is None or rec.buffer_id < 0:
                return False
            size = self.bufts[rec.buffer_id].alloc_size(t)
        return rec is not None and rec.size_max >= size

    def needs_realloc(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor]) -> bool:
        if self.n_nodes != len(nodes) or self.n_leafs != len(leafs):
            return True
        for node, (dst, srcs) in zip(nodes, self.node_records, strict=True):
            if not self._valid(node, dst):
                return True
            for j, s in enumerate(node.src):
                # a source slot past the recorded ones has no record (ggml's slot would be empty)
                if s is not None and not self._valid(s, srcs[j] if j < len(srcs) else None):
                    return True
        return False

    def alloc_graph(self, nodes: Sequence[Tensor], leafs: Sequence[Tensor],
                    addresses: dict[int, tuple[int, int, int]]) -> bool:
        """Replay the recorded plan: ``addresses[id(t)] = (buffer id, chunk, offset)`` for every tensor
        placed in a compute buffer (views at their base's address plus view_offs). Re-reserves by
        itself only with one buffer (as ggml_gallocr_alloc_graph does).

        Unlike ggml, ``t.buffer`` is left alone: in this model a non-None buffer marks a
        pre-allocated tensor (weights, KV cache), and graphs are rebuilt for every allocation."""
        if self.needs_realloc(nodes, leafs):
            if self.n_buffers != 1:
                return False
            if not self.reserve_n(nodes, leafs):
                return False
        for leaf, rec in zip(leafs, self.leaf_records, strict=True):
            self._init_tensor(leaf, rec, addresses)
        for node, (dst, srcs) in zip(nodes, self.node_records, strict=True):
            for j, s in enumerate(node.src):
                if s is not None:
                    self._init_tensor(s, srcs[j] or NO_RECORD, addresses)
            self._init_tensor(node, dst, addresses)
        return True

    def _init_tensor(self, t: Tensor, rec: HashNode, addresses: dict[int, tuple[int, int, int]]) -> None:
        if id(t) in addresses:
            return
        vs = t.view_src
        if vs is not None:
            base = addresses.get(id(vs))  # ggml_backend_view_init
            if base is not None:
                addresses[id(t)] = (base[0], base[1], base[2] + t.view_offs)
            return
        if t.data is not None or t.buffer is not None or rec.buffer_id < 0:
            return
        buf = self.buffers[rec.buffer_id]
        if buf is None or rec.chunk >= len(buf.chunks):
            return
        addresses[id(t)] = (rec.buffer_id, rec.chunk, rec.offset)
