"""The port of ggml_backend_sched (splitting, copies, pipeline copies) and ggml_gallocr (buffers).

Public API (the ggml function each call ports on the right)::

    s = Scheduler(backends, bufts=None, max_nodes=2048, parallel=False, op_offload=True, planner="ggml")
    s.reset(); s.synchronize(); s.free()                      # free: compute buffers back to alloc_limit
    s.set_tensor_backend(t, backend_index_or_Backend)          # ggml_backend_sched_set_tensor_backend
    s.tensor_backend_id(t) -> int; s.get_tensor_backend(t) -> Backend | None; s.tensor_cause(t) -> Cause | None
    s.split_graph(graph) -> Assignment                         # ggml_backend_sched_split_graph; mutates graph
    s.assignment                                               # the last Assignment (frozen; outlives reset)
    s.reserve(graph) -> bool                                   # ggml_backend_sched_reserve (False: alloc_limit)
    s.reserve_size(graph) -> list[int]                         # ggml_backend_sched_reserve_size
    s.alloc_graph(graph) -> bool                               # ggml_backend_sched_alloc_graph (rotates cur_copy)
    s.tensor_address(t) -> (buft name, chunk, offset) | None   # after alloc_graph
    s.tensor_copy(t, backend_id, copy=None) -> Tensor | None   # tensor_id_copy; split_input_pairs(split)
    s.compute_splits(copy, compute) -> list[Step]; s.graph_compute(graph, copy, compute)
    s.copy_callback / s.eval_callback (set_copy_callback, set_eval_callback)
    s.n_splits, s.splits (tuple[Split]), s.n_copies, s.cur_copy, s.hash_size, s.max_nodes, s.events,
    s.host_metadata_bytes, s.host_metadata (breakdown), s.split_capacities, s.graph_inputs,
    s.graph_copy_nodes, s.graph_copy_leafs, s.warnings
    s.buffer_size(i) -> int; s.buffer_sizes() -> list[int]     # ggml_backend_sched_get_buffer_size
    s.graph_needed_sizes() -> list[int]                        # last plan alone (shared buft → 0)
    s.plan() -> Plan; s.dump(causes=False) -> str              # GGML_SCHED_DEBUG=2 text
    GraphTooLarge(ValueError), SchedulerAbort(RuntimeError), AllocatorAbort(RuntimeError)
    hash_size(n), graph_overhead(n), context_buffer_size(max_nodes),
    host_metadata_bytes(max_nodes, n_backends=2, n_copies=1), host_metadata_breakdown(...)
    DynAllocator(alignment, max_size), GraphAllocator(bufts, placement=None)   # the allocator layers
    ggml_backend_sched_split_graph(graph, SchedState, ids, causes, copies) -> Assignment   (toolkit.sched.split)
    Plan, NodePlacement, SplitInfo, SplitInput, TensorAlloc, BufferPlan, Cause   (toolkit.sched.plan)
"""

from __future__ import annotations

from toolkit.sched.compute import Step
from toolkit.sched.dyn_alloc import GGML_VBUFFER_MAX_CHUNKS, MAX_FREE_BLOCKS, AllocatorAbort, DynAllocator
from toolkit.sched.gallocr import CAN_INPLACE_OPS, GraphAllocator
from toolkit.sched.metadata import (
    GGML_SCHED_MAX_BACKENDS,
    GGML_SCHED_MAX_COPIES,
    GGML_SCHED_MAX_SPLIT_INPUTS,
    context_buffer_size,
    graph_overhead,
    hash_size,
    host_metadata_breakdown,
    host_metadata_bytes,
)
from toolkit.sched.plan import BufferPlan, Cause, NodePlacement, Plan, SplitInfo, SplitInput, TensorAlloc
from toolkit.sched.scheduler import GraphTooLarge, Scheduler
from toolkit.sched.split import Assignment, SchedState, SchedulerAbort, Split, ggml_backend_sched_split_graph

__all__ = [
    "Assignment", "SchedState", "ggml_backend_sched_split_graph",
    "GGML_SCHED_MAX_BACKENDS", "GGML_SCHED_MAX_COPIES", "GGML_SCHED_MAX_SPLIT_INPUTS", "GGML_VBUFFER_MAX_CHUNKS",
    "CAN_INPLACE_OPS", "MAX_FREE_BLOCKS", "AllocatorAbort", "BufferPlan", "Cause", "DynAllocator", "GraphAllocator",
    "GraphTooLarge", "NodePlacement", "Plan", "Scheduler", "SchedulerAbort", "Split", "Step", "SplitInfo", "SplitInput",
    "TensorAlloc", "context_buffer_size", "graph_overhead", "hash_size", "host_metadata_breakdown",
    "host_metadata_bytes",
]
