"""``ggml_backend_sched``: creation, reset, reserve, reserve_size, alloc_graph (spec §2, §5, §6.8).

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

import functools
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from toolkit.backend.buft import BufferType
from toolkit.backend.device import Backend
from toolkit.errors import ToolkitError
from toolkit.ggml.graph import GGML_DEFAULT_GRAPH_SIZE, Graph
from toolkit.ggml.tensor import Tensor
from toolkit.sched.gallocr import GraphAllocator
from toolkit.sched.metadata import (
    GGML_SCHED_MAX_BACKENDS,
    GGML_SCHED_MAX_COPIES,
    GGML_SCHED_MAX_SPLIT_INPUTS,
    context_buffer_size,
    hash_size,
    host_metadata_breakdown,
)
from toolkit.sched.plan import Cause, Plan
from toolkit.sched.split import Split, split_graph

CopyCallback = Callable[[Backend, Tensor, Tensor, Split], bool]
EvalCallback = Callable[[Tensor, bool], bool]


@contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic GC while planning: the passes create ~3 small objects per tensor, and the
    collections they trigger rescan the whole graph, making reserve time grow faster than linearly."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_F = TypeVar("_F", bound=Callable[..., Any])


def _paused_gc(fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _no_cyclic_gc():
            return fn(*args, **kwargs)
    return wrapper  # type: ignore[return-value]


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
        # one event per (backend, copy) when pipelining; None where the device has none (§2.3 item 7)
        self.events: list[list[object | None]] = (
            [[object() if be.caps_events else None for _ in range(self.n_copies)] for be in self.backends]
            if self.n_copies > 1 else []
        )
        self.galloc = GraphAllocator(self.bufts)
        self.copy_callback: CopyCallback | None = None
        self.eval_callback: EvalCallback | None = None
        self.warnings: list[str] = []
        self.cur_copy = 0
        self.next_copy = 0
        self.is_alloc = False
        self.is_reset = False
        self.n_splits = 0
        self.splits_capacity = 16
        self.graph_inputs: list[Tensor] = []
        self.graph_inputs_capacity = GGML_SCHED_MAX_SPLIT_INPUTS
        self.graph_copy_nodes: list[Tensor] = []
        self.graph_copy_leafs: list[Tensor] = []
        self.addresses: dict[int, tuple[int, int, int]] = {}
        self._slots: list[Split] = [Split() for _ in range(16)]
        self._ids: dict[int, int] = {}
        self._causes: dict[int, Cause] = {}
        self._copies: dict[tuple[int, int], list[Tensor]] = {}
        self._pins: list[Tensor] = []
        self._node_ids: list[int] = []
        self._prev_node_ids: list[int] = []
        self._leaf_ids: list[int] = []
        self._prev_leaf_ids: list[int] = []
        self._graph: Graph | None = None
        self._ctx_tensors = 0
        self._null_in_hash = False
        self._offline_allocs: dict[int, tuple[int, int]] | None = None
        self._snap_ids: dict[int, int] = {}
        self._snap_causes: dict[int, Cause] = {}
        self._snap_copies: dict[tuple[int, int], list[Tensor]] = {}
        self.reset()

    # ---- lifecycle (§2.4, §5.2) ------------------------------------------------------
    def reset(self) -> None:
        if not self.is_reset:
            self._ids = {}
            self._causes = {}
            self._copies = {}
            self._pins = []
            self.is_reset = True
        self.is_alloc = False

    def synchronize(self) -> None:
        # with no graph allocated, generation keeps copy 0 (stable CUDA graphs, §5.2)
        if not self.is_alloc:
            self.next_copy = 0

    def free(self) -> None:
        """Release the compute buffers (their bytes return to the bufts' alloc_limit)."""
        self.galloc.free()

    def set_tensor_backend(self, t: Tensor, backend: int | Backend) -> None:
        """A user pin: survives until the next reset (§2.4)."""
        b = backend if isinstance(backend, int) else self.backend_index(backend)
        if not 0 <= b < self.n_backends:
            raise ValueError(f"backend index {b} is out of range 0..{self.n_backends - 1}")
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
        entries = self._snap_copies.get((id(t), backend_id))
        return None if entries is None else entries[self.cur_copy if copy is None else copy]

    def split_input_pairs(self, split: Split) -> list[tuple[Tensor, Tensor]]:
        """(source, its copy for cur_copy) for each input of a split, in input order (§3.5)."""
        return [(t, self._snap_copies[(id(t), split.backend_id)][self.cur_copy]) for t in split.inputs]

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
    @property
    def splits(self) -> list[Split]:
        return self._slots[: self.n_splits]

    @property
    def split_capacities(self) -> tuple[int, ...]:
        """inputs_capacity of every split slot used so far (persists across graphs, T5)."""
        return tuple(sl.inputs_capacity for sl in self._slots if sl.inputs_capacity)

    @property
    def n_graph_inputs(self) -> int:
        return len(self.graph_inputs)

    def _check_size(self, graph: Graph) -> None:
        if graph.n_nodes + graph.n_leafs > self.hash_size:
            raise GraphTooLarge(graph.n_nodes, graph.n_leafs, self.hash_size, self.max_nodes)

    def split_graph(self, graph: Graph) -> None:
        """Passes 1–5 and graph_copy; mutates ``graph`` (srcs point at copies): split a graph once."""
        self._check_size(graph)
        with _no_cyclic_gc():
            split_graph(self, graph)
        # reset() replaces these dicts, so the snapshot survives for plan() and dump()
        self._snap_ids = self._ids
        self._snap_causes = self._causes
        self._snap_copies = self._copies
        if self._null_in_hash and graph.n_nodes + graph.n_leafs + 1 > self.hash_size:
            # the null key of pass 3 needs one more slot of a full set (§3.3 quirk)
            raise GraphTooLarge(graph.n_nodes, graph.n_leafs + 1, self.hash_size, self.max_nodes)

    # ---- allocation (§6.8) -------------------------------------------------------------
    def _plan_and_realloc(self, *, no_alloc: bool) -> bool:
        args = (self.graph_copy_nodes, self.graph_copy_leafs, self._node_ids, self._leaf_ids)
        if self.planner == "offline":
            from toolkit.sched.offline_glue import plan_with_offline
            self.galloc.plan(*args)
            sizes = plan_with_offline(self)
            return self.galloc.realloc_buffers(no_alloc=no_alloc, sizes=sizes)
        self._offline_allocs = None
        return self.galloc.reserve_n(*args, no_alloc=no_alloc)

    @_paused_gc
    def reserve(self, graph: Graph) -> bool:
        """Split and plan ``graph``, grow the buffers; False when an allocation fails (alloc_limit)."""
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

    @_paused_gc
    def reserve_size(self, graph: Graph) -> list[int]:
        """``ggml_backend_sched_reserve_size``: Σ chunk maxima per backend, nothing allocated."""
        self._check_size(graph)
        self.reset()
        self.synchronize()
        self.split_graph(graph)
        self._plan_and_realloc(no_alloc=True)
        if self._offline_allocs is not None:
            return list(self._offline_sizes)
        return self.galloc.max_sizes()

    @_paused_gc
    def alloc_graph(self, graph: Graph) -> bool:
        """Rotate the copy, split, allocate (re-reserving when the backend ids' bufts changed)."""
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

    def _ids_changed(self, cur: list[int], prev: list[int], n: int) -> bool:
        bufts = self.bufts
        lp = len(prev)
        for i in range(n):
            a = cur[i]
            b = prev[i] if i < lp else 0
            if a != b and bufts[a] is not bufts[b]:
                return True
        return False

    def _alloc_splits(self) -> bool:
        nodes, leafs = self.graph_copy_nodes, self.graph_copy_leafs
        changed = self._ids_changed(self._node_ids, self._prev_node_ids, len(nodes)) or self._ids_changed(
            self._leaf_ids, self._prev_leaf_ids, len(leafs))
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

    # ---- computing (§5.3) ------------------------------------------------------------------
    def compute_splits(self, copy: Callable[[Tensor, Tensor, Split], None],
                       compute: Callable[[int, list[Tensor]], None]) -> list[Any]:
        """Walk the allocated splits in ggml's order (waits, input copies, computes, events),
        calling ``copy`` and ``compute``; returns the steps (:class:`toolkit.sched.compute.Step`)."""
        from toolkit.sched.compute import compute_splits
        return compute_splits(self, copy, compute)

    def graph_compute(self, graph: Graph, copy: Callable[[Tensor, Tensor, Split], None],
                      compute: Callable[[int, list[Tensor]], None]) -> list[Any]:
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

    def graph_needed_sizes(self) -> list[int]:
        """What the last planned graph alone needs per backend (Σ chunk maxima), 0 for a shared buft."""
        raw = list(self._offline_sizes) if self._offline_allocs is not None else self.galloc.max_sizes()
        return [raw[i] if self.galloc.shares_allocator(i) == i else 0 for i in range(self.n_backends)]

    _offline_sizes: tuple[int, ...] = ()
    _offline_chunks: tuple[tuple[int, ...], ...] = ()

    def planned_chunks(self, i: int) -> tuple[int, ...]:
        """The chunk sizes the last plan needs for backend i's allocator (offline or ggml)."""
        if self._offline_allocs is not None:
            return self._offline_chunks[i]
        return tuple(self.galloc.allocators[i].chunk_sizes())

    # ---- reporting -------------------------------------------------------------------------
    def plan(self) -> Plan:
        from toolkit.sched.report import make_plan
        return make_plan(self)

    def dump(self, causes: bool = False) -> str:
        """The ``GGML_SCHED_DEBUG=2`` listing of the last split graph (``causes=True`` fills the
        cause column that ggml prints only in debug builds)."""
        from toolkit.sched.report import dump
        return dump(self, causes=causes)

    def __repr__(self) -> str:
        names = ", ".join(be.name for be in self.backends)
        return (f"Scheduler([{names}], max_nodes={self.max_nodes}, n_copies={self.n_copies}, "
                f"op_offload={self.op_offload}, n_splits={self.n_splits})")

    def __getstate__(self) -> Any:  # pragma: no cover - schedulers hold live buffers
        raise TypeError("a Scheduler holds live buffers and cannot be pickled")
