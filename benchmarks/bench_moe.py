"""Planning a Mixtral-8x7B-shaped context with experts on the CPU: context creation (load placement,
KV cache, sched_reserve: fused-op probes, pp, tg, pp) and one ``ctx.update(n_cpu_moe=...)``.

Run: ``python3 benchmarks/bench_moe.py`` (prints each figure next to its target).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.context import Context  # noqa: E402
from toolkit.models import ContextParams, presets  # noqa: E402
from toolkit.models.moe import expert_copies  # noqa: E402

TARGET_CREATE_S = 2.0    # a 32-layer MoE context planned from scratch
TARGET_UPDATE_S = 1.0    # one --n-cpu-moe change on a live context (the dashboard's slider)


def main() -> None:
    hp = presets.mixtral_8x7b()
    best_create = best_update = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        ctx = Context(hp, ContextParams(n_ctx=4096, n_ubatch=512, flash_attn="on", devices=("cuda",), n_cpu_moe=4))
        best_create = min(best_create, time.perf_counter() - t)
        t = time.perf_counter()
        ctx.update(n_cpu_moe=8)
        best_update = min(best_update, time.perf_counter() - t)
    ev = ctx.events[-1]
    copies = expert_copies(ev.plan) if ev.plan is not None else []
    pp, tg = ev.graphs["pp"], ev.graphs["tg"]
    print(f"model {hp.name}: {pp.n_nodes} nodes, {pp.n_splits} splits (pp), {tg.n_splits} (tg), "
          f"{len(copies)} expert copies, CUDA0 compute {ctx.compute_buffers_bytes()['CUDA0'] / 2**20:.1f} MiB")
    print(f"{'figure':<34} {'seconds':>9} {'target':>8}")
    print(f"{'create (n_cpu_moe 4)':<34} {best_create:9.3f} {TARGET_CREATE_S:8.1f}")
    print(f"{'update n_cpu_moe 4 -> 8':<34} {best_update:9.3f} {TARGET_UPDATE_S:8.1f}")


if __name__ == "__main__":
    main()
