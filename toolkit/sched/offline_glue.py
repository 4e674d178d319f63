"""``planner="offline"``: the same lifetimes, offsets from ``toolkit.sched.offline`` (see the contracts).

Each tensor the graph allocator planned becomes an ``Interval(size, start, end)``: its aligned
size and inclusive graph_copy positions (leaf-phase tensors start at -1, never-freed ones end at
n_nodes); in-place chains are merged into one interval. One buffer (one chunk) per distinct buft, unless
ggml's own plan for that buffer is no larger: then ggml's chunks and offsets are kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.sched.report import merged_intervals

if TYPE_CHECKING:
    from toolkit.sched.scheduler import Scheduler


def _offline_module():  # type: ignore[no-untyped-def]
    try:
        from toolkit.sched import offline
    except ImportError as e:
        raise ImportError(
            "planner='offline' needs toolkit.sched.offline (Interval, plan_offline, lower_bound), "
            f"which could not be imported: {e}"
        ) from e
    return offline


def plan_with_offline(s: Scheduler) -> list[tuple[int, ...]]:
    """Run the offline planner per distinct buft; patch the allocator's records; return chunk sizes."""
    offline = _offline_module()
    galloc = s.galloc
    intervals, index = merged_intervals(galloc.lifetimes)
    sizes: list[tuple[int, ...]] = [()] * galloc.n_buffers
    offsets_of: dict[int, int] = {}
    kept: set[int] = set()
    for i in range(galloc.n_buffers):
        if galloc.shares_allocator(i) != i:
            continue
        group = {j for j in range(galloc.n_buffers) if galloc.shares_allocator(j) == i}
        mine = [k for k, iv in enumerate(intervals) if iv[3] in group]
        ivs = [offline.Interval(intervals[k][0], intervals[k][1], intervals[k][2]) for k in mine]
        if not ivs:
            sizes[i] = ()
            continue
        offsets, total = offline.plan_offline(ivs, galloc.bufts[i].alignment)
        ggml_chunks = tuple(galloc.allocators[i].chunk_sizes())
        if sum(ggml_chunks) <= total:
            # never worse than ggml: keep the online plan for this buffer when it is as small
            kept.update(group)
            sizes[i] = ggml_chunks
            continue
        for k, off in zip(mine, offsets, strict=True):
            offsets_of[k] = int(off)
        sizes[i] = (int(total),)
    for i in range(galloc.n_buffers):
        sizes[i] = sizes[galloc.shares_allocator(i)]
    allocs: dict[int, tuple[int, int]] = {}
    for life in galloc.lifetimes:
        hn = galloc.hash[id(life.tensor)]
        if life.buffer_id in kept:
            allocs[id(life.tensor)] = (hn.chunk, hn.offset)
            continue
        off = offsets_of[index[id(life.tensor)]]
        allocs[id(life.tensor)] = (0, off)
        hn.chunk, hn.offset = 0, off
    galloc.make_records(s.graph_copy_nodes, s.graph_copy_leafs)
    s._offline_allocs = allocs
    s._offline_sizes = tuple(sum(x) for x in sizes)
    s._offline_chunks = tuple(sizes)
    return sizes
