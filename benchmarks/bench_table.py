"""ggml's online allocator vs the offline planner vs the lower bound, on llama graphs.

    python3 benchmarks/bench_table.py [--models tiny,small,llama3_8b,llama3_70b] [--n-ctx 4096,32768]
                                      [--devices cuda] [--markdown]

For every model x n_ctx x flash attention (on, off), at n_ubatch 512, two contexts are created:
one with planner="ggml" (byte-exact ggml_gallocr) and one with planner="offline". Columns:
- nodes: graph_copy nodes of the pp graph (what the allocator walks);
- ggml / offline: bytes the final pp plan needs (sum over compute buffers of the chunk high-water
  marks; `needed` in the plan, before the buffers' historical maximum);
- lower bound: sum over buffers of the peak of simultaneously live bytes (same lifetimes);
- ggml/LB, offline/LB: the two ratios;
- ggml walk us/node: ggml's planning walk (ggml_gallocr_alloc_graph_impl) over the pp graph_copy, per node; the offline
  planner runs the same walk first, to learn the lifetimes;
- offline us/node: plan_offline alone on the pp graph's merged lifetimes, per graph_copy node
  (both timings: minimum over --repeat runs);
- reuse ms / rebuild ms: sched_reserve (probes + pp + tg + pp) on the ggml context when the
  scheduler is kept (max_nodes back to its smaller value) and when it is rebuilt (max_nodes
  grown), from ReserveEvent.timings_ms["total"], the minimum over --repeat rounds;
- sched_new ms: the part of the rebuild spent creating the scheduler (the part reuse skips).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.context import Context  # noqa: E402
from toolkit.models import ContextParams, presets  # noqa: E402
from toolkit.sched.gallocr import merged_intervals  # noqa: E402
from toolkit.sched.offline import Interval, plan_offline  # noqa: E402

COLS = ["model", "n_ctx", "fa", "nodes", "ggml", "offline", "lower bound", "ggml/LB", "offline/LB",
        "ggml walk us/node", "offline us/node", "reuse ms", "rebuild ms", "sched_new ms"]


def plan_bytes(ctx: Context) -> tuple[int, int, int]:
    """(needed, lower bound, graph_copy nodes) of the context's final pp plan."""
    plan = ctx.events[-1].plan
    assert plan is not None
    needed = sum(b.needed for b in plan.buffers)
    lb = sum(b.lower_bound or 0 for b in plan.buffers)
    return needed, lb, plan.graph_copy_nodes


def offline_plan_time(ctx: Context, repeat: int) -> float:
    """Seconds plan_offline takes on the scheduler's last planned lifetimes (one call per buffer),
    the minimum over ``repeat`` runs (the machine may be shared)."""
    s = ctx.scheduler
    merged, _ = merged_intervals(s.galloc.lifetimes)
    by_buffer: dict[int, list[Interval]] = {}
    for size, first, last, bid in merged:
        by_buffer.setdefault(s.galloc.shares_allocator(bid), []).append(Interval(size, first, last))
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for bid, ivs in by_buffer.items():
            plan_offline(ivs, s.galloc.bufts[bid].alignment)
        best = min(best, time.perf_counter() - t)
    return best


def ggml_plan_time(ctx: Context, repeat: int) -> float | None:
    """Seconds of ggml's planning walk (``ggml_gallocr_alloc_graph_impl``) over the last split graph, the
    minimum over ``repeat`` runs; None before the scheduler split a graph."""
    s = ctx.scheduler
    a = s.assignment
    if a is None:
        return None
    args = (a.graph_copy_nodes, a.graph_copy_leafs, a.node_ids, a.leaf_ids)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        s.galloc.plan(*args)
        best = min(best, time.perf_counter() - t)
    return best


def reserve_times(ctx: Context, repeat: int) -> tuple[float, float, float]:
    """(reuse ms, rebuild ms, rebuild's sched_new ms), each the minimum over ``repeat`` rounds.

    Each round first grows max_nodes past the scheduler's (a new scheduler under llama.cpp #32009's reuse
    rule), then goes back to the original max_nodes (<= the scheduler's: it is kept). ctx ends at its
    original max_nodes.
    """
    m = ctx.events[-1].params.max_nodes
    reuse, rebuild, new = [], [], []
    for k in range(repeat):
        rebuilt = ctx.update(max_nodes=m * (2 + k))
        reused = ctx.update(max_nodes=m)
        assert rebuilt.decision == "rebuilt" and reused.decision == "reused", (rebuilt.decision, reused.decision)
        reuse.append(reused.timings_ms["total"])
        rebuild.append(rebuilt.timings_ms["total"])
        new.append(rebuilt.timings_ms["sched_new"])
    return min(reuse), min(rebuild), min(new)


def row(model: str, n_ctx: int, fa: str, devices: tuple[str, ...], repeat: int) -> list[str]:
    hp = presets.get(model)
    cp = ContextParams(n_ctx=n_ctx, n_ubatch=512, flash_attn=fa, devices=devices)  # type: ignore[arg-type]
    ggml_ctx = Context(hp, cp, planner="ggml")
    off_ctx = Context(hp, cp, planner="offline")
    g_bytes, lb, nodes = plan_bytes(ggml_ctx)
    o_bytes, lb_o, _ = plan_bytes(off_ctx)
    assert lb == lb_o, (lb, lb_o)  # same graph, same lifetimes
    per_node_us = offline_plan_time(ggml_ctx, repeat) / max(nodes, 1) * 1e6
    walk = ggml_plan_time(ggml_ctx, repeat)
    walk_us = "n/a" if walk is None else f"{walk / max(nodes, 1) * 1e6:.1f}"
    reuse_ms, rebuild_ms, new_ms = reserve_times(ggml_ctx, repeat)
    return [model, str(n_ctx), fa, str(nodes), str(g_bytes), str(o_bytes), str(lb), f"{g_bytes / lb:.4f}",
            f"{o_bytes / lb:.4f}", walk_us, f"{per_node_us:.1f}", f"{reuse_ms:.1f}", f"{rebuild_ms:.1f}",
            f"{new_ms:.1f}"]


def render(rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLS, widths, strict=True))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,small,llama3_8b,llama3_70b")
    ap.add_argument("--n-ctx", default="4096,32768")
    ap.add_argument("--devices", default="", help="ContextParams.devices, comma-separated (default: CPU only)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per reserve timing (minimum kept)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    devices = tuple(d for d in args.devices.split(",") if d)
    rows: list[list[str]] = []
    failures: list[str] = []
    for model in args.models.split(","):
        for n_ctx in (int(x) for x in args.n_ctx.split(",")):
            for fa in ("on", "off"):
                try:
                    rows.append(row(model, n_ctx, fa, devices, args.repeat))
                except ValueError as e:  # e.g. a context the model cannot take; reported, not hidden
                    failures.append(f"{model} n_ctx={n_ctx} fa={fa}: {e}")
                print(f"  done {model} n_ctx={n_ctx} fa={fa}", file=sys.stderr, flush=True)
    if rows:
        print(render(rows, args.markdown))
    print(f"devices: {', '.join(devices) or 'CPU'}; n_ubatch 512; bytes of the pp graph's plan")
    for f in failures:
        print("skipped:", f)
    worse = [r for r in rows if int(r[5]) > int(r[4])]
    print(f"offline worse than ggml on {len(worse)} of {len(rows)} graphs; "
          f"worst offline/LB {max((float(r[8]) for r in rows), default=float('nan')):.4f}")


if __name__ == "__main__":
    main()
