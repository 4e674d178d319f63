"""``python -m toolkit run``: run tokens of a llama GGUF through the scheduled graph on JAX devices.

    python -m toolkit run --gguf model.gguf --tokens 1,2,3 --devices sim:2 --ngl 99 --json
    python -m toolkit run --gguf model.gguf --prompt "The capital of France is"

``--prompt`` tokenizes a text with the file's own tokenizer (:mod:`toolkit.models.tokenizer`, as
llama.cpp's completion tool does: BOS as the vocabulary asks, special tokens parsed); the top tokens
are then shown as text beside their ids.

Prints the backends, the reserve events, each split (backend, nodes, inputs, compiled or cache
hit, compile ms, XLA's temp/argument/output bytes and flops) and the last token's logits
(the full vector with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import jax

from toolkit.context import Context
from toolkit.jaxrt.devices import GPU_PLATFORMS, parse_devices, request_cpu_devices
from toolkit.jaxrt.gguf_io import SUPPORTED, read_gguf
from toolkit.jaxrt.runtime import ContextRuntime, load_weights, runtime_of
from toolkit.models import ContextParams
from toolkit.models.tokenizer import load_vocab, top_tokens


def _onoff(s: str) -> bool:
    v = s.strip().lower()
    if v in ("on", "1", "true", "yes"):
        return True
    if v in ("off", "0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {s!r}")


def _tokens(s: str) -> list[int]:
    try:
        toks = [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tokens {s!r}: expected comma-separated integers such as 1,2,3") from None
    if not toks:
        raise argparse.ArgumentTypeError("--tokens: at least one token id is needed")
    return toks


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit run", description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", required=True, help="GGUF file (weights of "
                   + ", ".join(t.name for t in SUPPORTED) + ")")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", type=_tokens, help="token ids, e.g. 1,2,3")
    src.add_argument("--prompt", help="a text, tokenized by the GGUF file's own tokenizer")
    p.add_argument("--devices", default="cpu", help="cpu | sim:N (N simulated accelerators) | auto (JAX GPUs/TPUs)")
    p.add_argument("--ngl", type=int, default=999, help="n_gpu_layers (default: all)")
    p.add_argument("--op-offload", type=_onoff, default=True, metavar="on|off")
    p.add_argument("--parallel", type=_onoff, default=None, metavar="on|off",
                   help="pipeline parallelism (default: llama.cpp's rule)")
    p.add_argument("--flash-attn", type=_onoff, default=False, metavar="on|off")
    p.add_argument("--n-ubatch", type=int, default=512)
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--sim-budget", default=None, help="compute-buffer budget of each simulated accelerator, e.g. 64M")
    p.add_argument("--json", action="store_true", help="machine-readable output with the full logits vector")
    return p


def _model_devices(spec: str, budget: str | None) -> tuple[str, ...]:
    kind, n = parse_devices(spec)
    if kind == "cpu":
        return ()
    if kind == "sim":
        request_cpu_devices(n + 1)
        return tuple(f"sim:{budget}" if budget else "sim" for _ in range(n))
    devs = jax.devices()
    gpus = sum(1 for d in devs if d.platform in GPU_PLATFORMS)
    tpus = sum(1 for d in devs if d.platform == "tpu")
    return ("cuda",) * gpus + ("tpu",) * tpus


def _ggml_vs_xla(ctx: Context, rt: ContextRuntime) -> list[dict[str, Any]]:
    """Per backend: the ggml plan's compute buffer beside XLA's temp + output bytes of its splits."""
    out = []
    for i, b in enumerate(ctx.scheduler.backends):
        mine = [ps.compiled for ps in rt.runner.last_splits if ps.spec.backend_id == i]
        temp = [c.temp_bytes for c in mine]
        outs = [c.output_bytes for c in mine]
        out.append({"backend": b.name, "buft": ctx.scheduler.bufts[i].name,
                    "ggml_compute_buffer": ctx.scheduler.buffer_size(i), "n_splits": len(mine),
                    "xla_temp_bytes": None if None in temp else sum(temp),  # type: ignore[arg-type]
                    "xla_output_bytes": None if None in outs else sum(outs)})  # type: ignore[arg-type]
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    devices = _model_devices(args.devices, args.sim_budget)
    model = read_gguf(args.gguf)  # parsed once: hyperparameters for planning, tensor views for the weights
    hp = model.hparams
    cp = ContextParams(n_ctx=args.n_ctx, n_batch=max(args.n_ubatch, args.n_ctx), n_ubatch=args.n_ubatch,
                       flash_attn="on" if args.flash_attn else "off", n_gpu_layers=args.ngl, devices=devices,
                       op_offload=args.op_offload)
    vocab = load_vocab(args.gguf) if args.prompt is not None else None
    tokens = args.tokens if vocab is None else vocab.tokenize(args.prompt, add_special=True, parse_special=True)
    if not tokens:
        raise ValueError(f"--prompt {args.prompt!r} gives no tokens")
    ctx = Context(hp, cp, parallel=args.parallel)
    load_weights(ctx, model)
    rt = runtime_of(ctx)
    logits = rt.decode(tokens)
    last = logits[-1]
    if vocab is None:
        try:
            vocab = load_vocab(args.gguf)
        except ValueError:
            vocab = None   # no vocabulary this module reads: ids only
    top = top_tokens(last, 5, vocab)
    pieces = None if vocab is None else [p for _, _, p in top]
    return {
        "model": hp.name, "gguf": args.gguf, "tokens": tokens, "prompt": args.prompt,
        "top5_text": pieces,
        "backends": [{"name": b.name, "kind": b.kind, "device": str(b.executor)} for b in ctx.backends],
        "events": [e.to_dict() for e in ctx.events], "events_text": [e.to_text() for e in ctx.events],
        "ubatches": [{"n_tokens": lg.n_tokens, "n_copies": lg.n_copies, "weight_copies": lg.weight_copies,
                      "splits": lg.splits} for lg in rt.log],
        "splits_text": rt.runner.splits_text(),
        "ggml_vs_xla": _ggml_vs_xla(ctx, rt),
        "argmax": top[0][0], "top5": [[i, v] for i, v, _ in top],
        "logits": [float(x) for x in last],
    }


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        out = run(args)
    except (ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        out.pop("events_text")
        print(json.dumps(out, default=str))
        return 0
    print(f"model {out['model']} ({out['gguf']}), {len(out['tokens'])} tokens")
    print("backends: " + ", ".join(f"{b['name']} ({b['kind']}, {b['device']})" for b in out["backends"]))
    print("events:")
    for t in out["events_text"]:
        print("  " + t.replace("\n", "\n  "))
    print("splits (last ubatch):")
    print("  " + out["splits_text"].replace("\n", "\n  "))
    print("ggml plan vs XLA, per backend (bytes):")
    for r in out["ggml_vs_xla"]:
        na = "unavailable"
        print(f"  {r['backend']:<8s} ggml compute buffer ({r['buft']}) {r['ggml_compute_buffer']:>10d}   "
              f"XLA temp {r['xla_temp_bytes'] if r['xla_temp_bytes'] is not None else na} "
              f"output {r['xla_output_bytes'] if r['xla_output_bytes'] is not None else na} "
              f"over {r['n_splits']} split(s)")
    if out["prompt"] is not None:
        print(f"prompt {out['prompt']!r} -> tokens {out['tokens']}")
    texts = out["top5_text"] or [None] * len(out["top5"])
    print(f"last token logits: argmax {out['argmax']}, top5 " +
          ", ".join(f"{i}:{v:.4f}" + ("" if t is None else f" {t!r}") for (i, v), t in zip(out["top5"], texts)))
    print("  first 8: " + " ".join(f"{x:.5f}" for x in out["logits"][:8]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
