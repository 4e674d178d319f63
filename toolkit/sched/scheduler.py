"""``ggml_backend_sched``: creation, reset, reserve, reserve_size, alloc_graph, compute.

>>> from toolkit.backend import profiles
>>> from toolkit.ggml import F32, Graph, ops
>>> cpu = profiles.cpu()
>>> s = Scheduler([cpu], None, 64, False, True)
>>> x = ops.new_tensor_1d(F32, 10, "x").set_input()
>>> a = ops.scale(x, 2.0); b = ops.sqr(a); r = ops.sum_rows(ops.mul(a, b)).set_output()
>>> g = Graph(64); _ = g.build_forward_expand(r)
>>> s.reserve(g), s.n_splits, s.buffer_size(0)
(True, 1, 128)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolkit.backend.buft import BufferType
from toolkit.backend.device import Backend
from toolkit.errors import ToolkitError
from toolkit.ggml.bulk import paused_gc, with_paused_gc
from toolkit.ggml.graph import GGML_DEFAULT_GRAPH_SIZE, Graph
from toolkit.ggml.tensor import Tensor
from toolkit.sched.compute import ComputeFn, CopyCallback, CopyFn, EvalCallback, Step, compute_splits
from toolkit.sched.gallocr import GraphAllocator
from toolkit.sched.metadata import (
    GGML_SCHED_MAX_BACKENDS,
    GGML_SCHED_MAX_COPIES,
    GGML_SCHED_MAX_SPLIT_INPUTS,
    context_buffer_size,
    hash_size,
    host_metadata_breakdown,
)
from toolkit.sched.offline_glue import offline_placement
from toolkit.sched.plan import Cause, Plan
from toolkit.sched.report import dump, make_plan
from toolkit.sched.split import Assignment, SchedState, Split, ggml_backend_sched_split_graph


class GraphTooLarge(ToolkitError):
    """The graph does not fit the scheduler's hash set (ggml asserts ``H >= n_nodes + n_leafs``)."""

    def __init__(self, n_nodes: int, n_leafs: int, capacity: int, max_nodes: int) -> None:
        super().__init__(
            f"graph too large for the scheduler: n_nodes + n_leafs = {n_nodes} + {n_leafs} = {n_nodes + n_leafs} "
            f"exceeds the hash capacity {capacity} (hash_size(max_nodes={max_nodes}))"
        )
        self.n_nodes = n_nodes
        self.n_leafs = n_leafs
        self.capacity = capacity


class Scheduler:
    """The port of ``ggml_backend_sched``; lower backend index = higher priority, CPU last.

    ``planner="offline"`` replaces ggml's greedy offsets by ``toolkit.sched.offline.plan_offline``
    over the same lifetimes (buffer sizes then come from the offline plan).
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        bufts: Sequence[BufferType | None] | None = None,
        max_nodes: int = GGML_DEFAULT_GRAPH_SIZE,
        parallel: bool = False,
        op_offload: bool = True,
        planner: str = "ggml",
    ) -> None:
        n = len(backends)
        if not 1 <= n <= GGML_SCHED_MAX_BACKENDS:
            raise ValueError(f"n_backends = {n} must be in 1..{GGML_SCHED_MAX_BACKENDS}")
        if not backends[-1].is_cpu:
            raise ValueError(f"the last backend must be a CPU device, got {backends[-1].name} ({backends[-1].kind})")
        if max_nodes <= 0:
            raise ValueError(f"max_nodes = {max_nodes} must be positive")
        if planner not in ("ggml", "offline"):
            raise ValueError(f"planner {planner!r} is not one of 'ggml', 'offline'")
        if bufts is not None and len(bufts) != n:
            raise ValueError(f"got {len(bufts)} buffer types for {n} backends")
        self.backends = list(backends)
        self.bufts: list[BufferType] = [
            (bufts[i] if bufts is not None and bufts[i] is not None else be.buft)  # type: ignore[misc]
            for i, be in enumerate(backends)
        ]
        for be, buft in zip(self.backends, self.bufts, strict=True):
            if not be.supports_buft(buft):
                raise ValueError(f"backend {be.name} does not support buffer type {buft.name}")
        self.n_backends = n
        self.max_nodes = max_nodes
        self.parallel = parallel
        self.op_offload = op_offload
        self.planner = planner
        self.n_copies = GGML_SCHED_MAX_COPIES if parallel else 1
        self.hash_size = hash_size(max_nodes)
        self.context_buffer_size = context_buffer_size(max_nodes)
        self.host_metadata = host_metadata_breakdown(max_nodes, n, self.n_copies)
        self.host_metadata_bytes = sum(self.host_metadata.values())
        # ggml_backend_sched_new: one event per (backend, copy) when pipelining; None where the device has none
        self.events: list[list[object | None]] = (
            [[object() if be.caps_events else None for _ in range(self.n_copies)] for be in self.backends]
            if self.n_copies > 1 else []
        )
        self.galloc = GraphAllocator(self.bufts, offline_placement if planner == "offline" else None)
        self.copy_callback: CopyCallback | None = None
        self.eval_callback: EvalCallback | None = None
        self.warnings: list[str] = []
        self.cur_copy = 0
        self.next_copy = 0
        self.is_alloc = False
        self.is_reset = False
        self.graph_inputs_capacity = GGML_SCHED_MAX_SPLIT_INPUTS
        self.splits_capacity = 16
        self.addresses: dict[int, tuple[int, int, int]] = {}
        # the last ggml_backend_sched_split_graph (None before the first); it outlives reset()
        self.assignment: Assignment | None = None
        self._inputs_capacities: tuple[int, ...] = (0,) * 16   # the split slots persist across graphs
        self._prev_node_ids: tuple[int, ...] = ()   # ggml's prev_node_backend_ids (the split before)
        self._prev_leaf_ids: tuple[int, ...] = ()
        # hv_tensor_backend_ids / causes / tensor copies as the next split starts from them: the user's
        # pins after a reset, else what the last split left (ggml clears them only in reset)
        self._ids: dict[int, int] = {}
        self._causes: dict[int, Cause] = {}
        self._copies: dict[tuple[int, int], list[Tensor]] = {}
        self._split_since_reset = False
        self._pins: list[Tensor] = []
        self.reset()

    # ---- lifecycle: ggml_backend_sched_reset / synchronize / free -------------------------
    def reset(self) -> None:
        if not self.is_reset:
            self._ids = {}
            self._causes = {}
            self._copies = {}
            self._pins = []
            self._split_since_reset = False
            self.is_reset = True
        self.is_alloc = False

    def synchronize(self) -> None:
        # with no graph allocated, generation keeps copy 0 (stable CUDA graphs)
        if not self.is_alloc:
            self.next_copy = 0

    def free(self) -> None:
        """Release the compute buffers (their bytes return to the bufts' alloc_limit)."""
        self.galloc.free()

    def set_tensor_backend(self, t: Tensor, backend: int | Backend) -> None:
        """``ggml_backend_sched_set_tensor_backend``: a user pin, until the next reset."""
        b = backend if isinstance(backend, int) else self.backend_index(backend)
        if not 0 <= b < self.n_backends:
            raise ValueError(f"backend index {b} is out of range 0..{self.n_backends - 1}")
        if self._split_since_reset:
            # the tables belong to the last Assignment now: write into copies of them
            self._ids, self._causes, self._copies = dict(self._ids), dict(self._causes), dict(self._copies)
            self._split_since_reset = False
        self._ids[id(t)] = b
        self._causes[id(t)] = Cause.USER_PIN
        self._pins.append(t)  # keeps id(t) from being reused while pinned
        self.is_reset = False

    def get_tensor_backend(self, t: Tensor) -> Backend | None:
        b = self._ids.get(id(t), -1)
        return None if b == -1 else self.backends[b]

    def tensor_backend_id(self, t: Tensor) -> int:
        return self._ids.get(id(t), -1)

    def tensor_cause(self, t: Tensor) -> Cause | None:
        return self._causes.get(id(t))

    def tensor_copy(self, t: Tensor, backend_id: int, copy: int | None = None) -> Tensor | None:
        """``tensor_id_copy``: t's copy on a backend (copy ``cur_copy`` by default), None if none."""
        a = self.assignment
        entries = None if a is None else a.copies.get((id(t), backend_id))
        return None if entries is None else entries[self.cur_copy if copy is None else copy]

    def split_input_pairs(self, split: Split) -> list[tuple[Tensor, Tensor]]:
        """(source, its copy for cur_copy) for each input of a split, in input order."""
        return self._assigned().split_input_pairs(split, self.cur_copy)

    def backend_index(self, backend: Backend) -> int:
        for i, be in enumerate(self.backends):
            if be is backend:
                return i
        raise ValueError(f"backend {backend.name} is not one of this scheduler's backends")

    def set_eval_callback(self, cb: EvalCallback | None) -> None:
        self.eval_callback = cb

    def set_copy_callback(self, cb: CopyCallback | None) -> None:
        self.copy_callback = cb

    # ---- splitting ---------------------------------------------------------------------
    def _assigned(self) -> Assignment:
        if self.assignment is None:
            raise RuntimeError("no graph has been split by this scheduler yet")
        return self.assignment

    @property
    def n_splits(self) -> int:
        return 0 if self.assignment is None else self.assignment.n_splits

    @property
    def splits(self) -> tuple[Split, ...]:
        return () if self.assignment is None else self.assignment.splits

    @property
    def graph_inputs(self) -> tuple[Tensor, ...]:
        return () if self.assignment is None else self.assignment.graph_inputs

    @property
    def graph_copy_nodes(self) -> tuple[Tensor, ...]:
        return () if self.assignment is None else self.assignment.graph_copy_nodes

    @property
    def graph_copy_leafs(self) -> tuple[Tensor, ...]:
        return () if self.assignment is None else self.assignment.graph_copy_leafs

    @property
    def split_capacities(self) -> tuple[int, ...]:
        """inputs_capacity of every split slot used so far (slots persist across graphs)."""
        return tuple(c for c in self._inputs_capacities if c)

    def split_state(self) -> tuple[object, ...]:
        """What a split leaves behind for the next one, besides its assignment: the capacities that grow
        across graphs (split slots and their inputs, graph inputs) and the warnings logged so far. A
        graph split again after a split of the same graph that changed none of this changes none of it
        either (the split is a function of the graph, the pins and this state)."""
        return (self._inputs_capacities, self.splits_capacity, self.graph_inputs_capacity, len(self.warnings))

    @property
    def n_graph_inputs(self) -> int:
        return len(self.graph_inputs)

    def _check_size(self, graph: Graph) -> None:
        if graph.n_nodes + graph.n_leafs > self.hash_size:
            raise GraphTooLarge(graph.n_nodes, graph.n_leafs, self.hash_size, self.max_nodes)

    def split_graph(self, graph: Graph) -> Assignment:
        """``ggml_backend_sched_split_graph`` on this scheduler's state; mutates ``graph`` (srcs point
        at copies), so split a graph once. The result is also kept as :attr:`assignment`."""
        self._check_size(graph)
        st = SchedState(self.backends, self.bufts, self.op_offload, self.n_copies, self.cur_copy,
                        self.context_buffer_size, self._inputs_capacities, self.splits_capacity,
                        self.graph_inputs_capacity, self._prev_node_ids, self._prev_leaf_ids)
        if self._split_since_reset:
            # not reset since the last split: ggml's tables still hold it; the new split owns copies
            self._ids, self._causes, self._copies = dict(self._ids), dict(self._causes), dict(self._copies)
        self.is_reset = False
        with paused_gc():
            a = ggml_backend_sched_split_graph(graph, st, self._ids, self._causes, self._copies)
        if self.assignment is not None:
            self._prev_node_ids, self._prev_leaf_ids = self.assignment.node_ids, self.assignment.leaf_ids
        self.assignment = a
        self._split_since_reset = True
        self._inputs_capacities = a.inputs_capacities
        self.splits_capacity = a.splits_capacity
        self.graph_inputs_capacity = a.graph_inputs_capacity
        self.warnings += a.warnings
        if a.null_in_hash and graph.n_nodes + graph.n_leafs + 1 > self.hash_size:
            # the null key of pass 3 needs one more slot of a full set
            raise GraphTooLarge(graph.n_nodes, graph.n_leafs + 1, self.hash_size, self.max_nodes)
        return a

    # ---- allocation: ggml_backend_sched_reserve / alloc_graph ----------------------------
    def _plan_and_realloc(self, *, no_alloc: bool) -> bool:
        """``ggml_gallocr_reserve_n`` over the last graph copy (the allocator's placement decides offsets)."""
        a = self._assigned()
        return self.galloc.reserve_n(a.graph_copy_nodes, a.graph_copy_leafs, a.node_ids, a.leaf_ids,
                                     no_alloc=no_alloc)

    @with_paused_gc
    def reserve(self, graph: Graph) -> bool:
        """``ggml_backend_sched_reserve``: split and plan ``graph``, grow the buffers; False when an
        allocation fails (alloc_limit)."""
        self._check_size(graph)
        self.synchronize()
        self.split_graph(graph)
        ok = self._plan_and_realloc(no_alloc=False)
        if not ok:
            if self.galloc.failed:
                self.warnings.append(self.galloc.failed)
            return False
        self.reset()
        return True

    @with_paused_gc
    def reserve_size(self, graph: Graph) -> list[int]:
        """``ggml_backend_sched_reserve_size``: Σ chunk maxima per backend, nothing allocated."""
        self._check_size(graph)
        self.reset()
        self.synchronize()
        self.split_graph(graph)
        self._plan_and_realloc(no_alloc=True)
        return self.galloc.max_sizes()

    @with_paused_gc
    def alloc_graph(self, graph: Graph) -> bool:
        """``ggml_backend_sched_alloc_graph``: rotate the copy, split, allocate (re-reserving when the
        backend ids' bufts changed)."""
        self._check_size(graph)
        if self.is_alloc:
            raise RuntimeError("alloc_graph: a graph is already allocated; call reset() first")
        self.cur_copy = self.next_copy
        self.next_copy = (self.next_copy + 1) % self.n_copies
        self.split_graph(graph)
        ok = self._alloc_splits()
        if not ok:
            return False
        self.is_alloc = True
        return True

    def _ids_changed(self, cur: Sequence[int], prev: Sequence[int], n: int) -> bool:
        bufts = self.bufts
        lp = len(prev)
        for i in range(n):
            a = cur[i]
            b = prev[i] if i < lp else 0
            if a != b and bufts[a] is not bufts[b]:
                return True
        return False

    def _alloc_splits(self) -> bool:
        """``ggml_backend_sched_alloc_splits``: re-reserve when a node or leaf changed buffer type."""
        a = self._assigned()
        nodes, leafs = a.graph_copy_nodes, a.graph_copy_leafs
        changed = self._ids_changed(a.node_ids, self._prev_node_ids, len(nodes)) or self._ids_changed(
            a.leaf_ids, self._prev_leaf_ids, len(leafs))
        self.addresses = {}
        if changed or self.planner == "offline" or not self.galloc.alloc_graph(nodes, leafs, self.addresses):
            if not self._plan_and_realloc(no_alloc=False):
                self.warnings.append(self.galloc.failed or "failed to allocate graph")
                return False
            self.addresses = {}
            if not self.galloc.alloc_graph(nodes, leafs, self.addresses):
                self.warnings.append("failed to allocate graph")
                return False
        return True

    def tensor_address(self, t: Tensor) -> tuple[str, int, int] | None:
        """(buft name, chunk, offset) of a tensor placed by the last alloc_graph."""
        a = self.addresses.get(id(t))
        return None if a is None else (self.bufts[a[0]].name, a[1], a[2])

    # ---- computing: ggml_backend_sched_compute_splits ------------------------------------
    def compute_splits(self, copy: CopyFn, compute: ComputeFn) -> list[Step]:
        """Walk the allocated splits in ggml's order (waits, input copies, computes, events),
        calling ``copy`` and ``compute``; returns the steps."""
        return compute_splits(self._assigned(), self.backends, self.events, self.cur_copy, copy, compute,
                              self.copy_callback, self.eval_callback)

    def graph_compute(self, graph: Graph, copy: CopyFn, compute: ComputeFn) -> list[Step]:
        """``ggml_backend_sched_graph_compute``: reset if needed, allocate if needed, compute, sync."""
        if not self.is_reset and not self.is_alloc:
            self.reset()
        if not self.is_alloc and not self.alloc_graph(graph):
            raise RuntimeError(f"failed to allocate graph: {'; '.join(self.warnings[-1:])}")
        steps = self.compute_splits(copy, compute)
        self.synchronize()
        return steps

    # ---- sizes ---------------------------------------------------------------------------
    def buffer_size(self, i: int) -> int:
        """``get_buffer_size``: 0 for a buft shared with an earlier backend (deduplicated)."""
        if not 0 <= i < self.n_backends:
            raise ValueError(f"backend index {i} is out of range 0..{self.n_backends - 1}")
        return self.galloc.buffer_size(i)

    def buffer_sizes(self) -> list[int]:
        return [self.galloc.buffer_size(i) for i in range(self.n_backends)]

    def buffer_layout(self) -> list[tuple[int, ...] | None]:
        """The compute buffers' chunk sizes per backend, to hand back to :meth:`restore_buffer_layout`."""
        return self.galloc.buffer_layout()

    def restore_buffer_layout(self, layout: list[tuple[int, ...] | None]) -> bool:
        """Put the compute buffers back at a :meth:`buffer_layout` taken earlier (False: a budget refused it)."""
        return self.galloc.restore_buffer_layout(layout)

    def graph_needed_sizes(self) -> list[int]:
        """What the last planned graph alone needs per backend (Σ chunk maxima), 0 for a shared buft."""
        return self.galloc.needed_sizes()

    def planned_chunks(self, i: int) -> tuple[int, ...]:
        """The chunk sizes the last plan needs for backend i's allocator (offline or ggml)."""
        return self.galloc.chunk_sizes(i)

    # ---- reporting -------------------------------------------------------------------------
    def plan(self) -> Plan:
        """The last split graph and its allocation as plain data (:func:`toolkit.sched.report.make_plan`)."""
        return make_plan(self.assignment, self.backends, self.galloc, self.buffer_sizes(), self.n_copies,
                         self.warnings)

    def dump(self, causes: bool = False) -> str:
        """The ``GGML_SCHED_DEBUG=2`` listing of the last split graph (``causes=True`` fills the
        cause column that ggml prints only in debug builds)."""
        return "" if self.assignment is None else dump(self.assignment, self.backends, causes=causes)

    def __repr__(self) -> str:
        names = ", ".join(be.name for be in self.backends)
        return (f"Scheduler([{names}], max_nodes={self.max_nodes}, n_copies={self.n_copies}, "
                f"op_offload={self.op_offload}, n_splits={self.n_splits})")

    def __getstate__(self) -> Any:  # pragma: no cover - schedulers hold live buffers
        raise TypeError("a Scheduler holds live buffers and cannot be pickled")
