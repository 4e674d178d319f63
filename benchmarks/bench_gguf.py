"""GGUF benchmark: opening a file with a Llama-3-sized vocabulary, and ``python -m toolkit run`` end to end.

    python benchmarks/bench_gguf.py [--runs 3] [--dir DIR] [--profile OUTDIR] [--root REPO] [--json]

1. ``Context(path)`` (metadata + first reserve) on a one-layer llama GGUF whose tokenizer has
   Llama-3's sizes (128,256 tokens with scores and types, 280,147 merges): wall seconds and MB
   of RSS over ``import toolkit`` (current and peak), in a fresh subprocess; also the seconds
   of the GGUF parse alone (``open_gguf``).
2. ``python -m toolkit run`` on a 9 MB GGUF with a 32,000-token vocabulary (the tiny model),
   3 tokens, with a warm persistent compile cache: subprocess wall seconds, JAX import included
   (median of ``--runs`` after one warm-up run). The same run is split into its phases (JAX
   import, toolkit imports, GGUF parse, Context, weights + runtime_of, decode) in a second child.

Files are written once with the ``gguf`` package into ``--dir`` (default: a temporary folder).
``--profile OUTDIR`` writes pyinstrument HTML profiles of both (``context.html``, ``run.html``).
``--root`` picks the toolkit checkout the children import (default: this one), so the same
script measures an older checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LLAMA3_VOCAB, LLAMA3_MERGES = 128_256, 280_147

TARGETS = {"context_s": 0.5, "context_rss_mb": 50.0, "run_s": 3.0}

CONTEXT_CHILD = r"""
import json, sys, time
def rss():
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                vals[k] = int(v.split()[0]) / 1024.0
    return vals
import toolkit
from toolkit.context import Context
base = rss()
t0 = time.perf_counter()
ctx = Context(sys.argv[1])
t1 = time.perf_counter()
after = rss()
out = {"context_s": t1 - t0, "rss_mb": after["VmRSS"] - base["VmRSS"], "peak_mb": after["VmHWM"] - base["VmRSS"],
       "n_vocab": ctx.hparams.n_vocab, "events": len(ctx.events)}
try:
    from toolkit.models.gguf_file import open_gguf
    t0 = time.perf_counter()
    f = open_gguf(sys.argv[1])
    out["parse_s"] = time.perf_counter() - t0
except ImportError:
    out["parse_s"] = None
print(json.dumps(out))
"""

RUN_PHASES_CHILD = r"""
import json, sys, time
t = [time.perf_counter()]
import jax, jax.numpy
t.append(time.perf_counter())
from toolkit.context import Context
from toolkit.jaxrt.gguf_io import read_gguf
from toolkit.jaxrt.runtime import runtime_of, load_weights
from toolkit.models import ContextParams
t.append(time.perf_counter())
model = read_gguf(sys.argv[1])
t.append(time.perf_counter())
ctx = Context(model.hparams, ContextParams(n_ctx=512, n_batch=512, n_ubatch=512, flash_attn="off"))
t.append(time.perf_counter())
import toolkit.jaxrt.gguf_io as gio
load_weights(ctx, model if hasattr(gio, "GGUFFile") else sys.argv[1])  # an older checkout parses again
rt = runtime_of(ctx)
t.append(time.perf_counter())
rt.decode([1, 2, 3])
t.append(time.perf_counter())
names = ["import jax", "import toolkit (context, jaxrt)", "GGUF parse", "Context (first reserve)",
         "weights + runtime_of", "decode 3 tokens (compile cache warm)"]
print(json.dumps({n: t[i + 1] - t[i] for i, n in enumerate(names)}))
"""


def write_vocab_model(path: Path) -> None:
    """One llama layer (n_embd 64, f32, tied) and Llama-3's tokenizer sizes: about 40 MB."""
    import gguf
    import numpy as np

    from toolkit.models import archs
    from toolkit.models.hparams import HParams

    hp = HParams(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=LLAMA3_VOCAB,
                      n_ctx_train=8192, rope_freq_base=500000.0, tied=True, name="llama3-vocab-1layer")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(hp.name)
    w.add_block_count(hp.n_layer)
    w.add_context_length(hp.n_ctx_train)
    w.add_embedding_length(hp.n_embd)
    w.add_feed_forward_length(hp.n_ff())
    w.add_head_count(hp.n_head())
    w.add_head_count_kv(hp.n_head_kv())
    w.add_layer_norm_rms_eps(hp.eps)
    w.add_rope_freq_base(hp.rope_freq_base)
    w.add_vocab_size(hp.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list([f"\u0120tok{i}" for i in range(LLAMA3_VOCAB)])
    w.add_token_scores([0.0] * LLAMA3_VOCAB)
    w.add_token_types([1] * LLAMA3_VOCAB)
    w.add_token_merges([f"\u0120t{i % 5000} ok{i}" for i in range(LLAMA3_MERGES)])
    rng = np.random.default_rng(0)
    for wi in archs.get(hp.arch).weights(hp):
        w.add_tensor(wi.name, (0.02 * rng.standard_normal(tuple(reversed(wi.ne)))).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_run_model(path: Path) -> None:
    """The tiny model, tied output (2 layers, n_embd 64, f32, 32,000-token vocabulary): about 9 MB."""
    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models import presets

    write_gguf(path, presets.tiny(tied=True), seed=0)


def child_env(root: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(root)
    env["TOOLKIT_JAX_CACHE"] = str(cache)
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_child(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    # in the checkout's folder: `python -c` and `-m` put the current folder first on sys.path
    p = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, check=False,
                       cwd=env["PYTHONPATH"])
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"child {args[:3]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return wall, p.stdout


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="timed `toolkit run` calls after one warm-up")
    ap.add_argument("--dir", type=Path, default=None, help="where to write (and reuse) the GGUF files")
    ap.add_argument("--root", type=Path, default=ROOT, help="toolkit checkout the children import")
    ap.add_argument("--profile", type=Path, default=None, help="write pyinstrument HTML profiles here")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    work = a.dir or Path(tempfile.mkdtemp(prefix="bench_gguf_"))
    work.mkdir(parents=True, exist_ok=True)
    vocab, tiny, cache = work / "llama3-vocab-1layer.gguf", work / "tiny-32k.gguf", work / "jax-cache"
    if not vocab.exists():
        write_vocab_model(vocab)
    if not tiny.exists():
        write_run_model(tiny)
    env = child_env(a.root, cache)

    _, out = run_child(["-c", CONTEXT_CHILD, str(vocab)], env)
    ctx = json.loads(out.strip().splitlines()[-1])
    run_cmd = ["-m", "toolkit", "run", "--gguf", str(tiny), "--tokens", "1,2,3"]
    run_child(run_cmd, env)  # warm-up: fills the persistent compile cache
    walls = [run_child(run_cmd, env)[0] for _ in range(a.runs)]
    _, out = run_child(["-c", RUN_PHASES_CHILD, str(tiny)], env)
    phases = json.loads(out.strip().splitlines()[-1])
    res: dict[str, Any] = {
        "context_s": ctx["context_s"], "context_rss_mb": ctx["rss_mb"], "context_peak_mb": ctx["peak_mb"],
        "parse_s": ctx["parse_s"], "run_s": statistics.median(walls), "run_walls_s": walls,
        "run_phases_s": phases, "vocab_file_mb": vocab.stat().st_size / 2**20,
        "run_file_mb": tiny.stat().st_size / 2**20, "root": str(a.root),
    }
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
        script = work / "context_child.py"
        script.write_text(CONTEXT_CHILD)
        run_child(["-m", "pyinstrument", "-r", "html", "-o", str(a.profile / "context.html"), str(script),
                   str(vocab)], env)
        run_child(["-m", "pyinstrument", "-r", "html", "-o", str(a.profile / "run.html"), "-m", "toolkit",
                   *run_cmd[2:]], env)
        res["profiles"] = [str(a.profile / "context.html"), str(a.profile / "run.html")]
    if a.json:
        print(json.dumps(res))
        return 0
    t = TARGETS
    print(f"toolkit at {a.root}; files in {work}")
    print(f"Context(path), {LLAMA3_VOCAB:,} tokens + {LLAMA3_MERGES:,} merges, 1 layer "
          f"({res['vocab_file_mb']:.0f} MB file), metadata + first reserve:")
    print(f"  time               {res['context_s']:8.3f} s    target <= {t['context_s']} s")
    print(f"  RSS over import    {res['context_rss_mb']:8.1f} MB   target <= {t['context_rss_mb']:.0f} MB "
          f"(peak {res['context_peak_mb']:.1f} MB)")
    if res["parse_s"] is not None:
        print(f"  of which GGUF parse (open_gguf) {res['parse_s']:.3f} s")
    print(f"python -m toolkit run, {res['run_file_mb']:.1f} MB GGUF, 32,000-token vocabulary, 3 tokens, "
          "warm compile cache:")
    print(f"  wall (median of {len(walls)})  {res['run_s']:8.3f} s    target <= {t['run_s']} s   "
          f"(runs: {', '.join(f'{w:.2f}' for w in walls)})")
    print("  phases (one child process):")
    for name, s in phases.items():
        print(f"    {name:<40s} {s:7.3f} s")
    if a.profile is not None:
        print("profiles: " + ", ".join(res["profiles"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
