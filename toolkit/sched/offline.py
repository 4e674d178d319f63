"""An offline memory planner: every tensor's lifetime is known before any offset is chosen.

ggml's allocator (``ggml_dyn_tallocr`` driven by ``ggml_gallocr_alloc_graph_impl``) is *online*:
it walks the graph in node order and picks each offset by best fit among the blocks free at that
moment, so an early choice can strand a hole that a later, larger tensor cannot use. Here the
whole set of lifetimes is known in advance (the scheduler collects them from ggml's own walk),
which turns planning into the classic dynamic storage allocation problem: place rectangles
(time x bytes) so that no two rectangles that share a node position share a byte, minimising
the height.

Several cheap constructive strategies run and the lowest total wins (DEFAULT_STRATEGIES):
- greedy by a key (size; also start = the order ggml sees tensors): place each interval, in key
  order, in the tightest gap left by the already placed intervals that overlap it in time (best
  fit), else on top;
- skyline best fit: repeatedly take the lowest stretch of the placed profile and fill it with an
  interval lying under it in time, preferring one that spans the stretch exactly, then one that
  touches an end of it (fewer stranded slivers), then the largest area / size / lifetime; when
  none fits, raise that stretch to its lower neighbour.
Optional seeded randomized skyline passes (``iterations``) search further. Each strategy is
O(n * k) (k = intervals overlapping in time), a few thousand intervals take well under a second,
and planning stops as soon as a plan reaches the lower bound (the usual case on llama graphs,
where only a few tensors are live at once).

Lifetimes are *inclusive* node positions ([start, end]): a tensor allocated at node i and freed
after its last consumer at node j occupies [i, j]. Two intervals conflict when they share any
position, which reproduces ggml's rule that a node's parents are freed only after the node itself
is allocated (``ggml_gallocr_alloc_graph_impl``); in-place chains arrive already merged into one interval.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """One buffer to place: ``size`` bytes live at node positions ``start..end`` (inclusive)."""

    size: int
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError(f"Interval size {self.size} is negative (must be >= 0)")
        if self.end < self.start:
            raise ValueError(f"Interval end {self.end} is before its start {self.start}")

    def overlaps(self, other: Interval) -> bool:
        """True when the two lifetimes share at least one node position."""
        return self.start <= other.end and other.start <= self.end


def align_up(size: int, alignment: int) -> int:
    """ggml's GGML_PAD: round ``size`` up to a multiple of ``alignment``."""
    return (size + alignment - 1) // alignment * alignment


def _check_alignment(alignment: int) -> None:
    if alignment < 1:
        raise ValueError(f"alignment {alignment} must be >= 1")


def lower_bound(intervals: Sequence[Interval], alignment: int = 1) -> int:
    """Peak of simultaneously live bytes: no plan (online or offline) can be smaller.

    Sizes are rounded up to ``alignment`` first (the scheduler already passes aligned sizes).
    """
    _check_alignment(alignment)
    events: dict[int, int] = {}
    for iv in intervals:
        if iv.size == 0:
            continue
        size = align_up(iv.size, alignment)
        events[iv.start] = events.get(iv.start, 0) + size
        events[iv.end + 1] = events.get(iv.end + 1, 0) - size
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def check_plan(intervals: Sequence[Interval], offsets: Sequence[int], alignment: int = 1) -> None:
    """Raise ValueError when two time-overlapping intervals share bytes or an offset is unaligned.

    O(n^2); meant for tests and debugging, not for the planning path.
    """
    if len(offsets) != len(intervals):
        raise ValueError(f"{len(offsets)} offsets for {len(intervals)} intervals")
    spans = []
    for i, (iv, off) in enumerate(zip(intervals, offsets, strict=True)):
        if off < 0 or off % alignment:
            raise ValueError(f"interval {i} offset {off} is negative or not a multiple of {alignment}")
        if iv.size:
            spans.append((i, iv, off, off + align_up(iv.size, alignment)))
    for a in range(len(spans)):
        i, iv, lo, hi = spans[a]
        for b in range(a + 1, len(spans)):
            j, jv, lo2, hi2 = spans[b]
            if iv.overlaps(jv) and lo < hi2 and lo2 < hi:
                raise ValueError(f"intervals {i} {iv} @[{lo},{hi}) and {j} {jv} @[{lo2},{hi2}) overlap")


# --- strategies -----------------------------------------------------------------------------
# Each takes (sizes, starts, ends) as numpy int64 arrays of the non-empty intervals, sizes
# already aligned, and returns int64 offsets. Offsets are always 0 or the top of another
# placed interval, so they stay multiples of the alignment.

_Strategy = Callable[["np.ndarray", "np.ndarray", "np.ndarray"], "np.ndarray"]


def _greedy(order: np.ndarray, sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Place intervals in ``order``; each goes into the smallest gap that fits it among the
    intervals already placed that overlap it in time (lowest gap on ties), else on top."""

    n = len(sizes)
    offsets = np.zeros(n, dtype=np.int64)
    p_start = np.empty(n, dtype=np.int64)
    p_end = np.empty(n, dtype=np.int64)
    p_off = np.empty(n, dtype=np.int64)
    p_top = np.empty(n, dtype=np.int64)
    k = 0
    for i in order:
        s, e, size = starts[i], ends[i], sizes[i]
        hit = np.flatnonzero((p_start[:k] <= e) & (p_end[:k] >= s))
        off = 0
        if len(hit):
            o = p_off[hit]
            srt = np.argsort(o, kind="stable")
            o = o[srt]
            reach = np.maximum.accumulate(p_top[hit][srt])   # highest byte used below each block
            gaps = o - np.concatenate(([0], reach[:-1]))      # free bytes just below each block
            fit = np.flatnonzero(gaps >= size)
            if len(fit):
                best = fit[np.argmin(gaps[fit])]              # best fit; argmin keeps the lowest
                off = 0 if best == 0 else int(reach[best - 1])
            else:
                off = int(reach[-1])
        offsets[i] = off
        p_start[k], p_end[k], p_off[k], p_top[k] = s, e, off, off + size
        k += 1
    return offsets


def _greedy_by(key: str) -> _Strategy:
    def run(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:

        length = ends - starts + 1
        if key == "start":  # time order, like ggml's online walk, larger first on ties
            return _greedy(np.lexsort((-sizes, starts)), sizes, starts, ends)
        primary = {"size": sizes, "area": sizes * length, "length": length}[key]
        secondary = length if key == "size" else sizes
        # np.lexsort sorts by the last key first; negate for "largest first", then by start
        order = np.lexsort((starts, -secondary, -primary))
        return _greedy(order, sizes, starts, ends)

    run.__name__ = f"greedy_by_{key}"
    return run


def _skyline_place(score: np.ndarray, sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Skyline best fit: fill the lowest stretch of the placed profile first.

    The profile is a list of time segments [t0, t1] (compressed time) at a height. The lowest
    segment (leftmost on ties) takes an unplaced interval lying inside [t0, t1]: one spanning it
    exactly if any, else one starting or ending with it if any, else any; the highest ``score``
    among those. When none lies inside, the segment is raised to its lower neighbour and merged.
    """


    n = len(sizes)
    # compress time to the distinct starts, so segments split only where something starts
    times = np.unique(starts)
    n_t = len(times)
    cs = np.searchsorted(times, starts)
    ce = np.searchsorted(times, ends, side="right") - 1
    # candidates for a segment [t0, t1] start inside it: keep them sorted by start, so a
    # segment looks only at its own slice instead of at all n intervals
    by_start = np.argsort(cs, kind="stable")
    cs_sorted, ce_sorted, score_sorted = cs[by_start], ce[by_start], score[by_start].astype(np.float64)
    # the same as lists: short slices are scanned in plain Python (cheaper than numpy calls)
    cs_l, ce_l, score_l, by_start_l = cs_sorted.tolist(), ce_sorted.tolist(), score_sorted.tolist(), by_start.tolist()
    sizes_l, cs_i, ce_i = sizes.tolist(), cs.tolist(), ce.tolist()
    placed_end = n_t  # an end no segment reaches: marks a placed interval
    offsets = [0] * n
    # the profile: segments are contiguous in compressed time, so a segment is found by its
    # first position (end_of, height) or its last (start_of); a heap of (height, t0, t1) gives
    # the lowest, leftmost segment, its stale entries skipped on pop
    end_of = [-1] * n_t
    start_of = [-1] * n_t
    height = [0] * n_t
    heap: list[tuple[int, int, int]] = []

    def put(t0: int, t1: int, h: int) -> None:
        end_of[t0], start_of[t1], height[t0] = t1, t0, h
        heapq.heappush(heap, (h, t0, t1))

    put(0, n_t - 1, 0)
    left = n
    while left:
        h, t0, t1 = heapq.heappop(heap)
        if end_of[t0] != t1 or height[t0] != h:
            continue  # stale: the segment was split, merged or raised since
        lo = bisect_left(cs_l, t0)
        hi = bisect_left(cs_l, t1 + 1, lo)
        k = _pick(cs_l, ce_l, score_l, cs_sorted, ce_sorted, score_sorted, lo, hi, t0, t1)
        if k >= 0:
            i = by_start_l[k]
            score_l[k] = score_sorted[k] = -np.inf         # placed: never a candidate again
            ce_l[k] = ce_sorted[k] = placed_end
            left -= 1
            offsets[i] = h
            a, b = cs_i[i], ce_i[i]
            if a > t0:
                put(t0, a - 1, h)
            put(a, b, h + sizes_l[i])
            if b < t1:
                put(b + 1, t1, h)
            continue
        # nothing fits under this stretch: raise it to its lower neighbour and merge the run
        # of equal heights, so the next candidate search sees the whole stretch
        left_h = height[start_of[t0 - 1]] if t0 > 0 else None
        right_h = height[t1 + 1] if t1 + 1 < n_t else None
        if left_h is None and right_h is None:  # cannot happen while intervals remain
            raise RuntimeError("skyline planner found no place for the remaining intervals")
        new_h = min(x for x in (left_h, right_h) if x is not None)
        while t0 > 0 and height[start_of[t0 - 1]] == new_h:
            end_of[t0] = -1
            t0 = start_of[t0 - 1]
        while t1 + 1 < n_t and height[t1 + 1] == new_h:
            start_of[t1] = -1
            end_of[t1 + 1], t1 = -1, end_of[t1 + 1]
        put(t0, t1, new_h)
    return np.array(offsets, dtype=np.int64)


# below this many candidates a plain loop beats a dozen numpy calls
_SCAN_IN_PYTHON = 24


def _pick(cs_l: list[int], ce_l: list[int], score_l: list[float], cs_a: np.ndarray, ce_a: np.ndarray,
          score_a: np.ndarray, lo: int, hi: int, t0: int, t1: int) -> int:
    """Index (in start order) of the interval to place in segment [t0, t1], or -1 if none fits.

    One spanning the segment exactly if any, else one starting or ending with it if any, else
    any; the highest score among those, the first on ties. Both paths choose alike.
    """

    if hi - lo <= _SCAN_IN_PYTHON:
        best, best_key = -1, (-1, 0.0)
        for k in range(lo, hi):
            e = ce_l[k]
            if e > t1:
                continue
            at_lo, at_hi = cs_l[k] == t0, e == t1
            key = (2 if at_lo and at_hi else 1 if at_lo or at_hi else 0, score_l[k])
            if key > best_key:
                best, best_key = k, key
        return best
    fits = ce_a[lo:hi] <= t1
    if not fits.any():
        return -1
    touch_lo = cs_a[lo:hi] == t0
    touch_hi = ce_a[lo:hi] == t1
    for prefer in (fits & touch_lo & touch_hi, fits & (touch_lo | touch_hi), fits):
        if prefer.any():
            break
    return lo + int(np.argmax(np.where(prefer, score_a[lo:hi], -np.inf)))


def _skyline_score(key: str, sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:

    length = (ends - starts + 1).astype(np.float64)
    fsizes = sizes.astype(np.float64)
    if key == "length":   # longest lifetime first, larger size on ties
        return length * 2.0**40 + fsizes
    if key == "size":
        return fsizes * 2.0**20 + length
    return fsizes * length


def _skyline(key: str) -> _Strategy:
    def run(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        return _skyline_place(_skyline_score(key, sizes, starts, ends), sizes, starts, ends)

    run.__name__ = f"skyline_by_{key}"
    return run


# Order matters only for the early exit at the lower bound: cheap and usually best first.
STRATEGIES: dict[str, _Strategy] = {
    s.__name__: s
    for s in (
        _greedy_by("size"), _skyline("area"), _skyline("size"), _skyline("length"),
        _greedy_by("area"), _greedy_by("length"), _greedy_by("start"),
    )
}

# What plan_offline runs by default: greedy by area or by lifetime never beat these on the
# MiniMalloc instances or the llama graphs of benchmarks/ (they stay selectable by name).
DEFAULT_STRATEGIES: tuple[str, ...] = (
    "greedy_by_size", "skyline_by_area", "skyline_by_size", "skyline_by_length", "greedy_by_start",
)

# Multiplicative noise on the skyline's area score for the optional randomized passes: enough
# to change which interval fills a stretch, small enough to keep the area preference.
_NOISE = 0.5


def plan_offline(intervals: Sequence[Interval], alignment: int = 1, *,
                 strategies: Sequence[str] | None = None,
                 iterations: int = 0, seed: int = 0) -> tuple[list[int], int]:
    """Offsets for ``intervals`` (same order) and the total size; best of several strategies.

    Every offset is a multiple of ``alignment``; time-overlapping intervals never share a byte;
    the total is at least ``lower_bound(intervals, alignment)``. Zero-size intervals get offset 0.
    ``iterations`` adds that many randomized skyline passes (seeded by ``seed``, so the result
    is deterministic); planning stops early once a plan reaches the lower bound.

    >>> plan_offline([Interval(64, 0, 1), Interval(32, 1, 2), Interval(64, 2, 3)])
    ([0, 64, 0], 96)
    """

    _check_alignment(alignment)
    if iterations < 0:
        raise ValueError(f"iterations {iterations} must be >= 0")
    names = list(DEFAULT_STRATEGIES) if strategies is None else list(strategies)
    for name in names:
        if name not in STRATEGIES:
            raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
    live = [i for i, iv in enumerate(intervals) if iv.size > 0]
    offsets = [0] * len(intervals)
    if not live:
        return offsets, 0
    sizes = np.array([align_up(intervals[i].size, alignment) for i in live], dtype=np.int64)
    starts = np.array([intervals[i].start for i in live], dtype=np.int64)
    ends = np.array([intervals[i].end for i in live], dtype=np.int64)
    bound = lower_bound(intervals, alignment)
    best: np.ndarray | None = None
    best_total = 0

    def keep(offs: np.ndarray) -> bool:
        nonlocal best, best_total
        total = int((offs + sizes).max())
        if best is None or total < best_total:
            best, best_total = offs, total
        return best_total == bound  # optimal: nothing can do better

    done = False
    for name in names:
        if done := keep(STRATEGIES[name](sizes, starts, ends)):
            break
    if iterations and not done:
        rng = np.random.default_rng(seed)
        area = _skyline_score("area", sizes, starts, ends)
        for _ in range(iterations):
            noisy = area * (1.0 + _NOISE * rng.random(len(sizes)))
            if keep(_skyline_place(noisy, sizes, starts, ends)):
                break
    assert best is not None
    for i, off in zip(live, best.tolist(), strict=True):
        offsets[i] = off
    return offsets, best_total
