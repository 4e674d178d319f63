"""How long a fit takes: ``toolkit.fit.fit_params`` on llama-shaped models and simulated devices.

    python3 benchmarks/bench_fit.py [--exact]

llama.cpp's own fit takes about 1-2 s on a real GPU (its log: "fitting params to free memory took
1.15 seconds"); each of its probes loads the model without allocating. Here every probe plans a
whole context (pp, tg and pp graphs, split and allocated in Python), so the figure to watch is
seconds per probe. Target: a fit that needs layer fitting on Llama-3-70B-shaped devices in under
30 s, under 2 s per probe.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolkit.args import parse_args  # noqa: E402
from toolkit.fit import fit_params  # noqa: E402
from toolkit.models import presets  # noqa: E402

CASES = [
    ("llama3_8b", ["--device", "sim:8G", "-fa", "on"]),
    ("llama3_8b", ["--device", "sim:9100M,sim:9100M", "-fa", "on", "-c", "8192", "-ub", "2048", "-fitt", "256"]),
    ("llama3_70b", ["--device", "sim:16G,sim:16G", "-fa", "on"]),
    ("llama3_70b", ["--device", "sim:24G,sim:24G", "-fa", "on"]),
]
TARGET_TOTAL_S = 30.0
TARGET_PER_PROBE_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exact", action="store_true", help="search on the full reserve (toolkit's exact fit)")
    a = ap.parse_args()
    print(f"{'model':12s} {'devices':22s} {'printed':30s} {'probes':>6s} {'total s':>8s} {'s/probe':>8s}")
    for name, argv in CASES:
        hp = presets.get(name)
        args = parse_args(["-m", name, *argv])
        t0 = time.perf_counter()
        r = fit_params(hp, args, exact=a.exact)
        dt = time.perf_counter() - t0
        per = dt / max(1, len(r.probes))
        print(f"{name:12s} {argv[1]:22s} {r.printed:30s} {len(r.probes):6d} {dt:8.2f} {per:8.2f}"
              f"   target total < {TARGET_TOTAL_S:.0f} s {'ok' if dt < TARGET_TOTAL_S else 'MISSED'},"
              f" per probe < {TARGET_PER_PROBE_S:.0f} s {'ok' if per < TARGET_PER_PROBE_S else 'MISSED'}")


if __name__ == "__main__":
    main()
