"""Plain, frozen snapshots of a scheduler's work: what figures and tests read.

The scheduler fills these after each reserve / alloc_graph; nothing here computes a plan.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Cause(enum.Enum):
    """Why a node sits on its backend (ggml keeps this only in debug builds; we always do)."""

    BUFFER = "pre-allocated buffer"      # pass 1: the tensor (or its view source) lives in a buffer
    INPUT = "graph input"                # pass 1: INPUT flag -> last (CPU) backend
    WEIGHT = "weight"                    # pass 1: first weight source decides
    OP_OFFLOAD = "op offload"            # pass 1: host weight, batch large enough to offload
    EXPAND_UP = "expansion up"           # pass 2 backward sweeps
    EXPAND_DOWN = "expansion down"       # pass 2 forward sweeps
    UPGRADE = "upgrade"                  # pass 3: same buffer type, higher-priority backend
    BEST_INPUTS = "best inputs"          # pass 3: most supported inputs
    VIEW_SOURCE = "view source"          # pass 4: a view takes its base's backend
    NODE_SOURCE = "source of a node"     # pass 4: an unassigned source takes its user's backend
    FIRST_SUPPORTED = "first supporting backend"  # pass 4 fallback
    USER_PIN = "user pin"                # set_tensor_backend


@dataclass(frozen=True)
class NodePlacement:
    index: int            # position in the original graph's node list
    name: str
    op: str               # op_desc, e.g. MUL_MAT, SWIGLU
    backend: str          # backend name
    backend_id: int
    cause: Cause
    split: int            # split index (-1 for view nodes skipped by pass 5)
    is_view: bool
    nbytes: int
    srcs: tuple[str, ...] = ()
    ne: tuple[int, ...] = ()   # shape (ggml's ne, 4 dims)
    type: str = ""             # ggml type name, e.g. f32


@dataclass(frozen=True)
class SplitInput:
    name: str             # the source tensor's name
    src_backend: str
    nbytes: int
    is_weight: bool


@dataclass(frozen=True)
class SplitInfo:
    index: int
    backend: str
    backend_id: int
    i_start: int
    i_end: int
    inputs: tuple[SplitInput, ...]
    inputs_capacity: int


@dataclass(frozen=True)
class TensorAlloc:
    """One tensor planned by the graph allocator: [first, last] are graph_copy node positions."""

    name: str
    buft: str
    chunk: int
    offset: int
    size: int             # aligned size taken from the allocator
    first: int            # node position where it is allocated (-1: leaf phase)
    last: int             # node position after which it is freed (n_nodes: never freed)
    inplace_of: str | None = None


@dataclass(frozen=True)
class BufferPlan:
    buft: str
    backends: tuple[str, ...]
    allocated: int        # the (deduplicated) buffer size the scheduler holds
    needed: int           # what this graph alone needs (sum of chunk high-water marks)
    chunks: tuple[int, ...] = ()
    lower_bound: int | None = None


@dataclass(frozen=True)
class Plan:
    """A scheduled graph: placements, splits, allocations and buffer sizes."""

    n_nodes: int
    n_leafs: int
    n_copies: int
    nodes: tuple[NodePlacement, ...]
    splits: tuple[SplitInfo, ...]
    allocs: tuple[TensorAlloc, ...]
    buffers: tuple[BufferPlan, ...]
    graph_copy_nodes: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def n_splits(self) -> int:
        return len(self.splits)
