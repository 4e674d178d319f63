"""GPU check: every architecture the runtime runs, in several weight types, on an NVIDIA GPU against the CPU.

For each tiny model (written on the fly with the ``gguf`` package by the builders in ``tests/``):

1. plan and run it with every layer on the GPU (``ContextParams(devices=("cuda",), n_gpu_layers=999)``,
   the JAX GPU device) and again on the CPU only (``devices=()``);
2. compare the logits of every token: ``max |gpu - cpu| / max |cpu|`` must be at most ``TOL``
   (1e-4; the kernels multiply at ``Precision.HIGHEST``, so no TF32 rounding is expected);
3. print, per compiled split of the GPU run, XLA's ``memory_analysis()`` (temp, argument and output
   bytes) beside the ggml plan's buffers for that split's backend: its compute buffer
   (``ggml_backend_sched`` reserve) and the model weights in its buffer type. ggml sizes one compute
   buffer per backend, shared by all its splits; XLA sizes each split's program on its own.

``--cpu`` is a dry run on a machine without a GPU: the "device" run uses one simulated accelerator
(a CUDA-like backend on an extra JAX CPU device), so the same splits, copies and compiles happen,
all on the CPU. ``--quick`` runs a subset (the CI test runs ``--cpu --quick``). The exit status is 1
when a model is outside the tolerance or fails, 0 otherwise.

Needs JAX (with its CUDA plugin for a GPU run), numpy and the ``gguf`` package (pure Python: on a
machine without network, ``pip install --no-index --find-links WHEELS gguf``). Everything else comes
from this repository. Run from the repository root: ``make gpu-check`` or
``python benchmarks/gpu_check.py [--cpu] [--quick] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from toolkit.jaxrt.devices import request_cpu_devices  # noqa: E402

request_cpu_devices(2)   # the CPU and, for --cpu, one simulated accelerator

import numpy as np  # noqa: E402

TOL = 1e-4           # max |device - cpu| / max |cpu| over every token's logits
TOKENS = [1, 5, 9, 2, 7, 3, 8, 4]
DATA = ROOT / "tests" / "data"


def _entries(name: str) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in json.loads((DATA / name).read_text())}


def _llama(dtype: str, moe: bool = False) -> Callable[[str], None]:
    def build(path: str) -> None:
        from toolkit.ggml.types import GGMLType
        from toolkit.jaxrt.gguf_io import random_weights, write_gguf
        from toolkit.models import archs
        from toolkit.models.hparams import HParams
        from toolkit.models.moe import MoEParams

        t = GGMLType.parse(dtype)
        # rows of 256 / 512: whole QK_K super-blocks, so every matrix is of type t
        hp = HParams(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_vocab=256, dtype=t,
                     moe=MoEParams(n_expert=4, n_expert_used=2) if moe else None, name=f"check_{t.lower}")
        vals = random_weights(hp, seed=3, scale=0.05)
        if t is GGMLType.Q4_K:   # gguf.quants cannot quantize K-quants: random blocks with finite f16 d, dmin
            rng = np.random.default_rng(3)
            for w in archs.get(hp.arch).weights(hp):
                if w.type is t:
                    raw = rng.integers(0, 256, (w.ne[1], w.ne[0] // t.blck_size, t.type_size), dtype=np.uint8)
                    for off in (0, 2):
                        mag = rng.uniform(0.0005, 0.001, raw.shape[:2]).astype(np.float16)
                        raw[..., off:off + 2] = mag.view(np.uint16)[..., None].view(np.uint8)
                    vals[w.name] = raw.reshape(w.ne[1], -1)
        write_gguf(path, hp, vals)
    return build


def _recipe(module: str, data: str, entry_id: str, **changes: Any) -> Callable[[str], None]:
    def build(path: str) -> None:
        mod = __import__(module)
        entry = _entries(data)[entry_id]
        if module == "arch_models":
            r = mod.recipe_of(entry)
            r.update(n_vocab=512, **changes)
        else:
            r = mod.recipe_of(entry, n_vocab=512, **changes)
        mod.write_model(path, r)
    return build


def _qwen3moe(path: str) -> None:
    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models.hparams import HParams
    from toolkit.models.moe import MoEParams

    hp = HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, n_vocab=256, arch="qwen3moe",
                 n_embd_head_k_=32, n_embd_head_v_=32, moe=MoEParams(n_expert=8, n_expert_used=4, n_ff_exp=64),
                 name="check_qwen3moe")
    write_gguf(path, hp, seed=4)


def _mla(name: str) -> Callable[[str], None]:
    def build(path: str) -> None:
        from mla_model import write_model

        write_model(path, name, n_vocab=512)
    return build


# name -> (builder, weight types, in the --quick subset)
MODELS: dict[str, tuple[Callable[[str], None], str, bool]] = {
    "llama": (_llama("f32"), "F32", True),
    "llama-f16": (_llama("f16"), "F16", False),
    "llama-q8_0": (_llama("q8_0"), "Q8_0", False),
    "llama-q4_0": (_llama("q4_0"), "Q4_0", True),
    "llama-q4_k": (_llama("q4_k"), "Q4_K", False),
    "llama-moe": (_llama("f32", moe=True), "F32", False),
    "llama-moe-q8_0": (_llama("q8_0", moe=True), "Q8_0", False),
    "qwen3": (_recipe("arch_models", "logits-archs.json", "logits-tiny_qwen3_f32-faon"), "F32", False),
    "qwen3moe": (_qwen3moe, "F32", False),
    "gemma3": (_recipe("arch_models", "logits-archs.json", "logits-tiny_gemma3_f32-faoff"), "F32", False),
    "gpt-oss": (_recipe("gptoss_model", "logits-gptoss.json", "logits-tiny_gptoss_f32-promptA-faoff"), "F32",
                False),
    "gpt-oss-mxfp4": (_recipe("gptoss_model", "logits-gptoss.json", "logits-tiny_gptoss_mxfp4-promptA-faoff"),
                      "MXFP4 experts", True),
    "gemma4": (_recipe("gemma4_model", "logits-gemma4.json", "logits-tiny_gemma4_f32-promptA-faoff"), "F32", False),
    "gemma4moe": (_recipe("gemma4_model", "logits-gemma4.json", "logits-tiny_gemma4moe_f32-promptA-faoff"),
                  "F32", False),
    "qwen35": (_recipe("hybrid_model", "logits-hybrid.json", "logits-tiny_qwen35_f32-promptA-faoff"), "F32", False),
    "qwen35moe": (_recipe("hybrid_model", "logits-hybrid.json", "logits-tiny_qwen35moe_f32-promptA-faoff"),
                  "F32", True),
    "deepseek2": (_mla("tiny_deepseek2"), "F32", False),
    "glm4moe": (_mla("tiny_glm4moe"), "F32", False),
}


def _run(path: str, devices: tuple[str, ...]) -> tuple[np.ndarray, Any, Any]:
    from toolkit.context import Context
    from toolkit.jaxrt.runtime import runtime_of
    from toolkit.models import ContextParams

    n = len(TOKENS)
    cp = ContextParams(n_ctx=64, n_batch=64, n_ubatch=n, flash_attn="off", devices=devices,
                       n_gpu_layers=999 if devices else 0)
    ctx = Context(path, cp)
    rt = runtime_of(ctx)
    logits = np.asarray(rt.decode(TOKENS), np.float32)
    return logits, ctx, rt


def check(name: str, workdir: str, device: tuple[str, ...]) -> dict[str, Any]:
    build, wtypes, _ = MODELS[name]
    path = str(Path(workdir) / f"{name}.gguf")
    build(path)
    t0 = time.perf_counter()
    got, ctx, rt = _run(path, device)
    t1 = time.perf_counter()
    want, _, _ = _run(path, ())
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    sched = ctx.scheduler
    model = ctx.model_buffers_bytes
    splits = []
    for i, s in enumerate(rt.log[-1].splits):
        b = s["backend_id"]
        buft = sched.bufts[b].name
        # the weights the split's backend reads in place: its buffer type's, and for the CPU the
        # memory-mapped and repacked CPU buffers too
        weights = (sum(v for k, v in model.items() if k in (buft, "CPU_Mapped", "CPU_REPACK"))
                   if sched.backends[b].kind == "cpu" else model.get(buft, 0))
        splits.append({"split": i, "backend": sched.backends[b].name, "device": s["device"], "n_nodes": s["n_nodes"],
                       "xla_temp": s["temp_bytes"], "xla_args": s["argument_bytes"], "xla_out": s["output_bytes"],
                       "ggml_compute": int(sched.buffer_size(b)), "ggml_model": weights})
    return {"model": name, "arch": ctx.setup.model.hparams.arch, "weights": wtypes, "rel": rel,
            "argmax_same": bool((got.argmax(-1) == want.argmax(-1)).all()), "ok": rel <= TOL,
            "device_s": round(t1 - t0, 2), "splits": splits}


def _b(x: int | None) -> str:
    return "n/a" if x is None else f"{x:,}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'model':<15s} {'arch':<10s} {'weights':<14s} {'rel diff':>9s} {'ok':<4s} {'split':>5s} "
            f"{'backend':<8s} {'nodes':>5s} {'XLA temp':>11s} {'XLA args':>11s} {'XLA out':>10s} "
            f"{'ggml compute':>12s} {'ggml model':>11s}")
    out = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            out.append(f"{r['model']:<15s} FAILED: {r['error']}")
            continue
        ok = "yes" if r["ok"] else "NO"
        first = f"{r['model']:<15s} {r['arch']:<10s} {r['weights']:<14s} {r['rel']:>9.1e} {ok:<4s}"
        for j, s in enumerate(r["splits"]):
            lead = first if j == 0 else " " * len(first)
            out.append(f"{lead} {s['split']:>5d} {s['backend']:<8s} {s['n_nodes']:>5d} {_b(s['xla_temp']):>11s} "
                       f"{_b(s['xla_args']):>11s} {_b(s['xla_out']):>10s} {_b(s['ggml_compute']):>12s} "
                       f"{_b(s['ggml_model']):>11s}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="dry run: the device is a simulated accelerator on the CPU")
    p.add_argument("--quick", action="store_true", help="a subset: " + ", ".join(n for n, m in MODELS.items() if m[2]))
    p.add_argument("--only", nargs="+", choices=sorted(MODELS), help="these models only")
    p.add_argument("--json", help="also write the rows to this JSON file")
    args = p.parse_args(argv)
    import jax

    from toolkit.jaxrt.devices import GPU_PLATFORMS

    if args.cpu:
        device: tuple[str, ...] = ("sim",)
    else:
        gpus = [d for d in jax.devices() if d.platform in GPU_PLATFORMS]
        if not gpus:
            print("gpu_check: JAX sees no GPU (devices: " + ", ".join(str(d) for d in jax.devices())
                  + "); install JAX's CUDA plugin, or run with --cpu for a dry run", file=sys.stderr)
            return 2
        device = ("cuda",)
    names = args.only or [n for n, m in MODELS.items() if m[2] or not args.quick]
    print(f"gpu_check: {'dry run, simulated accelerator on the CPU' if args.cpu else 'GPU ' + str(jax.devices()[0])}"
          f" against the CPU; {len(names)} model(s), tolerance max|diff|/max|cpu| <= {TOL:g}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check") as d:
        for n in names:
            try:
                rows.append(check(n, d, device))
            except Exception as e:  # noqa: BLE001 - one model's failure is a row of the table
                rows.append({"model": n, "error": f"{type(e).__name__}: {e}", "ok": False})
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    bad = [r["model"] for r in rows if not r["ok"]]
    failed = f"; failed: {', '.join(bad)}" if bad else ""
    print(f"gpu_check: {len(rows) - len(bad)}/{len(rows)} within tolerance{failed}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
