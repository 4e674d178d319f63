"""Time from a dashboard control change to updated figures, for a reuse and for a rebuild.

    python3 benchmarks/bench_dashboard.py [--model llama3_8b] [--devices cpu] [--repeats 5] [--session 240]

Planning only (no JAX): the dashboard runs headless with no coalescing delay, so one control
change is one synchronous path: observer -> ctx.update (sched_reserve) -> four FigureWidgets
rebuilt from the newest ReserveEvent. Columns:
- total: control change until the figures hold the new event (what a user waits for, minus the
  browser's own drawing);
- update: ``ctx.update`` (checks, the graph size precheck, then sched_reserve);
- reserve: of which the context's sched_reserve (sched_new + probes + the pp/tg/pp reserves);
- draw: building the four figures from the events and sending them to the FigureWidgets.
Reuse alternates max_nodes between two values below the held one (same flags: reused); rebuild
toggles op offload (a different flag: rebuilt).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.ui.choices import make_context  # noqa: E402
from toolkit.ui.dashboard import Dashboard  # noqa: E402


def measure(dash: Dashboard, key: str, values: list[object], expect: str) -> list[tuple[float, ...]]:
    out = []
    for v in values:
        n = len(dash.ctx.events)
        t0 = time.perf_counter()
        dash.controls[key].value = v
        total = (time.perf_counter() - t0) * 1e3
        ev = dash.ctx.events[-1]
        assert len(dash.ctx.events) == n + 1 and dash.error is None, dash.error
        assert ev.decision == expect, f"{key}={v}: {ev.decision}, expected {expect}"
        out.append((total, dash.timings_ms["update"], ev.timings_ms["total"], dash.timings_ms["draw"]))
    return out


def row(label: str, xs: list[tuple[float, ...]]) -> str:
    med = [statistics.median(c) for c in zip(*xs)]
    best = min(x[0] for x in xs)
    return f"{label:<8} {med[0]:10.1f} {best:10.1f} {med[1]:10.1f} {med[2]:10.1f} {med[3]:10.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3_8b")
    ap.add_argument("--devices", default="cpu", help="cpu, rpc:N, sim:N")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", metavar="HTML", help="also write a pyinstrument flame graph of the measured changes")
    ap.add_argument("--session", type=int, default=0, metavar="N",
                    help="then N more max_nodes changes: does a long session stay as fast and as small?")
    args = ap.parse_args()
    profiler = None
    if args.profile:
        from pyinstrument import Profiler

        profiler = Profiler(interval=0.0005)

    t0 = time.perf_counter()
    ctx = make_context(args.model, args.devices)
    dash = Dashboard(ctx, debounce_s=0)
    setup_ms = (time.perf_counter() - t0) * 1e3
    ev = ctx.events[-1]
    held = ctx.scheduler.max_nodes
    pp = ev.graphs["pp"]
    print(f"model {ctx.hparams.name} on {args.devices}: {pp.n_nodes} nodes (pp), {pp.n_splits} splits, "
          f"max_nodes {held}; context + dashboard {setup_ms:.0f} ms")

    if profiler is not None:
        profiler.start()
    reuse = measure(dash, "max_nodes", [str(held - 1 - (i % 2)) for i in range(args.repeats)], "reused")
    dash.controls["max_nodes"].value = "auto"   # back to the held size (reused)
    flags = [i % 2 == 1 for i in range(args.repeats)]   # op offload off, on, off, ...
    rebuild = measure(dash, "op_offload", flags, "rebuilt")

    print(f"{'':<8} {'total ms':>10} {'best ms':>10} {'update ms':>10} {'reserve ms':>10} {'draw ms':>10}"
          f"   (median of {args.repeats})")
    print(row("reuse", reuse))
    print(row("rebuild", rebuild))
    # targets: control -> figures <= 150 ms (reuse) / <= 250 ms (rebuild) for 8B, <= 150 ms (reuse and
    # rebuild) for 70B on sim:2, <= 300 ms for gpt-oss-120b, Qwen3.6-35B-A3B and Gemma-4-31B on sim:2, <= 400 ms for
    # DeepSeek-V3 on sim:8
    med = {k: statistics.median(x[0] for x in xs) for k, xs in (("reuse", reuse), ("rebuild", rebuild))}
    draw = {k: statistics.median(x[3] for x in xs) for k, xs in (("reuse", reuse), ("rebuild", rebuild))}
    goals = {"gpt_oss_120b": (300, 300), "qwen3_6_35b_a3b": (300, 300), "gemma4_31b": (300, 300),
             "deepseek_v3": (400, 400)}
    goal = goals.get(args.model.partition(":")[0], (150, 150) if "70b" in args.model.lower() else (150, 250))
    print(f"target ({args.model}): total reuse {med['reuse']:.0f} ms / {goal[0]} ms, rebuild {med['rebuild']:.0f} ms "
          f"/ {goal[1]} ms; of which drawing {draw['reuse']:.0f} / {draw['rebuild']:.0f} ms")
    if profiler is not None:
        profiler.stop()
        Path(args.profile).write_text(profiler.output_html())
        print(f"flame graph: {args.profile}")
    if args.session:
        session(dash, held, args.session)


def session(dash: Dashboard, held: int, n: int) -> None:
    """``n`` reuse changes in a row: the first and last tenth's median, the slowest change (a full pass of
    the cyclic collector), and what the process kept (RSS, objects the collector tracks).
    Target: the last tenth within 10% of the first, and no growth per change."""
    import gc
    import resource

    def rss_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    k = max(1, n // 10)
    obj0, rss0, ms = len(gc.get_objects()), rss_mb(), []
    for i in range(n):
        t0 = time.perf_counter()
        dash.controls["max_nodes"].value = str(held - 1 - (i % 2))
        ms.append((time.perf_counter() - t0) * 1e3)
    first, last = statistics.median(ms[:k]), statistics.median(ms[-k:])
    print(f"session of {n} changes: first {k} {first:.0f} ms, last {k} {last:.0f} ms (target <= {1.1 * first:.0f}), "
          f"slowest {max(ms):.0f} ms; peak RSS +{rss_mb() - rss0:.0f} MB, tracked objects "
          f"{(len(gc.get_objects()) - obj0) / n:+.0f} per change")


if __name__ == "__main__":
    main()
