"""``planner="offline"``: a placement strategy for the graph allocator over ggml's own lifetimes.

Each tensor the graph allocator planned becomes an ``Interval(size, start, end)``: its aligned
size and inclusive graph_copy positions (leaf-phase tensors start at -1, never-freed ones end at
n_nodes); in-place chains are merged into one interval. One buffer (one chunk) per distinct buft,
unless ggml's own plan for that buffer is no larger: then ggml's chunks and offsets are kept.
:func:`offline_placement` only computes; :class:`~toolkit.sched.gallocr.GraphAllocator` applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from toolkit.backend.buft import BufferType
from toolkit.sched.gallocr import Lifetime, PlacementResult, merged_intervals


def _offline_module() -> ModuleType:
    try:
        # lazy: the offline planner is optional (a search over numpy arrays); ggml's planner needs none of it
        from toolkit.sched import offline
    except ImportError as e:
        raise ImportError(
            "planner='offline' needs toolkit.sched.offline (Interval, plan_offline, lower_bound), "
            f"which could not be imported: {e}"
        ) from e
    return offline


def offline_placement(lifetimes: Sequence[Lifetime], bufts: Sequence[BufferType], shares: Sequence[int],
                      ggml_chunks: Sequence[tuple[int, ...]]) -> PlacementResult:
    """Run the offline planner per distinct buft; ``shares[i]`` is the buffer id whose allocator
    id i shares, ``ggml_chunks[i]`` the chunk sizes ggml's walk needed for it."""
    offline = _offline_module()
    n = len(bufts)
    intervals, index = merged_intervals(lifetimes)
    sizes: list[tuple[int, ...]] = [()] * n
    offsets_of: dict[int, int] = {}
    kept: set[int] = set()
    for i in range(n):
        if shares[i] != i:
            continue
        group = {j for j in range(n) if shares[j] == i}
        mine = [k for k, iv in enumerate(intervals) if iv[3] in group]
        ivs = [offline.Interval(intervals[k][0], intervals[k][1], intervals[k][2]) for k in mine]
        if not ivs:
            sizes[i] = ()
            continue
        offsets, total = offline.plan_offline(ivs, bufts[i].alignment)
        if sum(ggml_chunks[i]) <= total:
            # never worse than ggml: keep the online plan for this buffer when it is as small
            kept.update(group)
            sizes[i] = tuple(ggml_chunks[i])
            continue
        for k, off in zip(mine, offsets, strict=True):
            offsets_of[k] = int(off)
        sizes[i] = (int(total),)
    for i in range(n):
        sizes[i] = sizes[shares[i]]
    placed: dict[int, tuple[int, int]] = {}
    for life in lifetimes:
        if life.buffer_id in kept:
            placed[id(life.tensor)] = (life.chunk, life.offset)
        else:
            placed[id(life.tensor)] = (0, offsets_of[index[id(life.tensor)]])
    return PlacementResult(placed, tuple(sizes))
