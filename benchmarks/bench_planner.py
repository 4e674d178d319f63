"""The offline planner on the MiniMalloc "challenging" instances: planned size / lower bound.

    python3 benchmarks/bench_planner.py [--iterations 100] [--markdown]

Each CSV row is one buffer `id,lower,upper,size`, live on the half-open interval [lower, upper)
(benchmarks/data/minimalloc-challenging/README.md); toolkit's Interval is inclusive, so it becomes
Interval(size, lower, upper - 1). Columns:
- time order: best fit in time order, the order ggml's online allocator sees tensors
  (ggml_gallocr_alloc_graph_impl);
- by size: greedy, largest first, best-fit offset;
- offline: plan_offline with its default strategies (what the scheduler's planner="offline" runs);
- +search: plan_offline with that many extra randomized skyline passes.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.sched.offline import Interval, check_plan, lower_bound, plan_offline  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "minimalloc-challenging"


def load(path: Path) -> list[Interval]:
    """One MiniMalloc CSV as inclusive intervals ([lower, upper) -> [lower, upper - 1])."""
    with path.open(newline="") as f:
        return [Interval(int(r["size"]), int(r["lower"]), int(r["upper"]) - 1) for r in csv.DictReader(f)]


def instances() -> list[tuple[str, int, list[Interval]]]:
    """(name, capacity, intervals) per instance; the capacity is the number in the file name."""
    out = []
    for path in sorted(DATA.glob("*.csv")):
        name, capacity, _ = path.name.split(".")
        out.append((name, int(capacity), load(path)))
    return out


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def timed(ivs: list[Interval], **kw: object) -> tuple[int, float]:
    t = time.perf_counter()
    offsets, total = plan_offline(ivs, **kw)  # type: ignore[arg-type]
    ms = (time.perf_counter() - t) * 1e3
    check_plan(ivs, offsets)  # a number from an overlapping plan would be meaningless
    return total, ms


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=100, help="randomized passes for the +search column")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args(argv)

    cols = ["instance", "n", "lower bound", "capacity", "time order", "by size", "offline", "ms",
            f"+search({args.iterations})", "ms "]
    rows: list[list[str]] = []
    ratios: dict[str, list[float]] = {"time order": [], "by size": [], "offline": [], "+search": []}
    times: dict[str, float] = {"offline": 0.0, "+search": 0.0}
    for name, capacity, ivs in instances():
        lb = lower_bound(ivs)
        online, _ = timed(ivs, strategies=["greedy_by_start"])
        by_size, _ = timed(ivs, strategies=["greedy_by_size"])
        offline, ms = timed(ivs)
        search, ms_s = timed(ivs, iterations=args.iterations)
        for key, total in (("time order", online), ("by size", by_size), ("offline", offline), ("+search", search)):
            ratios[key].append(total / lb)
        times["offline"] += ms
        times["+search"] += ms_s
        rows.append([name, str(len(ivs)), str(lb), str(capacity), f"{online / lb:.3f}", f"{by_size / lb:.3f}",
                     f"{offline / lb:.3f}", f"{ms:.0f}", f"{search / lb:.3f}", f"{ms_s:.0f}"])
    rows.append(["geomean", "", "", "", *(f"{geomean(ratios[k]):.3f}" for k in ("time order", "by size", "offline")),
                 f"{times['offline']:.0f}", f"{geomean(ratios['+search']):.3f}", f"{times['+search']:.0f}"])
    rows.append(["worst", "", "", "", *(f"{max(ratios[k]):.3f}" for k in ("time order", "by size", "offline")),
                 "", f"{max(ratios['+search']):.3f}", ""])
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
        for r in rows:
            print("  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)))
    print("ratios are planned / lower bound; ms = planning time (total in the geomean row)")


if __name__ == "__main__":
    main()
