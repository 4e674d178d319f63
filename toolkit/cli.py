"""``python -m toolkit``: plan and fit llama.cpp command lines, replay reuse/rebuild sequences, run (JAX).

- ``plan -m MODEL [llama.cpp flags] [--json]``: what llama.cpp prints for that command line
  (buffers, KV cache, graph nodes and splits, the memory breakdown table); ``-m`` takes a preset
  name (``name:type`` for another weight type, e.g. ``qwen3_30b_a3b:q8_0``), a GGUF path or a JSON
  model description; devices are ``--device sim:24G,cuda:24G`` or
  ``--rpc HOST:PORT`` (memory of servers with ``--device-memory``);
- ``plan --cases FILE.json [--json]``: per case, what llama.cpp prints (graph nodes and splits,
  compute/KV/model/output buffers, n_copies, pipeline parallelism), as log lines or a JSON list;
  either form takes ``--html FILE``: also one self-contained HTML report (figures, event log,
  parameters; ``toolkit.ui.share``);
- ``fit -m MODEL [llama.cpp flags] [--fit-target MiB] [--fit-ctx N] [--fit-print on] [--exact]
  [--json]``: what ``llama-fit-params`` prints (its log on stderr), then, beyond llama.cpp, the
  real buffers of the printed parameters against the estimate; ``fit --cases FILE --json``: a
  JSON list with per case ``{id, printed, fitted, probes, log_lines, …}``;
- ``replay --case FILE.json --id ID --steps "max_nodes=4096; parallel=on" [--json]``: the
  reserve-event log of the initial reserve followed by one event per step;
- ``explain LOG [-m FILE.gguf] [--json] [--html FILE]``: read a llama.cpp start-up log, rebuild the
  context it describes (:mod:`toolkit.explain`) and print each logged number beside the toolkit's,
  with the difference in bytes; ``--json``: ``{"compared": [{line, what, buffer, logged, ours}, …],
  "missing": [what the rebuild assumed], …}``; ``--html``: also the standalone report;
- ``tokenize -m FILE.gguf TEXT [--no-bos] [--parse-special]``: the ids of TEXT by the file's own
  tokenizer, printed as ``llama-tokenize --ids`` does (BOS as the vocabulary asks unless
  ``--no-bos``); ``tokenize -m FILE.gguf --json``: a JSON list of strings on stdin -> a JSON list of
  id lists, with add_special and parse_special off (as llama.cpp's tokenizer tests call
  ``common_tokenize``);
- ``run ...``: execution on JAX, delegated to ``toolkit.jaxrt.cli:main`` (imported only then).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolkit.errors import ParameterError

_BOOL = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}
_BOOL_FIELDS = {"parallel", "op_offload", "kv_unified", "offload_kqv", "use_mmap", "force_pipeline_parallel"}
_INT_FIELDS = {"max_nodes", "n_ctx", "n_batch", "n_ubatch", "n_seq_max", "n_gpu_layers", "main_gpu", "n_outputs_max"}


def parse_value(key: str, raw: str) -> Any:
    """A step's value, typed by its field: on/off for flags, integers, lists for devices and tensor_split."""
    v = raw.strip()
    if key in ("max_nodes", "parallel", "n_outputs_max") and v.lower() in ("auto", "none", "default"):
        return None
    if key in _BOOL_FIELDS:
        if v.lower() not in _BOOL:
            raise ValueError(f"{key}={v!r}: expected on/off")
        return _BOOL[v.lower()]
    if key in _INT_FIELDS:
        try:
            return int(v)
        except ValueError:
            raise ValueError(f"{key}={v!r}: expected an integer") from None
    if key == "tensor_split":
        return tuple(float(x) for x in v.split(",")) if v.lower() not in ("", "none") else None
    if key == "devices":
        return tuple(x.strip() for x in v.split(",") if x.strip() and x.strip().lower() != "cpu")
    return v


def parse_steps(text: str) -> list[dict[str, Any]]:
    """``"max_nodes=4096; parallel=on, op_offload=off"``: steps split on ';', changes within one on ','
    (values of devices/tensor_split keep their commas when written after the last key of a step)."""
    steps: list[dict[str, Any]] = []
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        changes: dict[str, Any] = {}
        for item in _split_items(part):
            key, eq, raw = item.partition("=")
            if not eq:
                raise ValueError(f"step {item!r} is not KEY=VALUE")
            changes[key.strip()] = parse_value(key.strip(), raw)
        steps.append(changes)
    return steps


def _split_items(part: str) -> list[str]:
    items: list[str] = []
    for chunk in part.split(","):
        if "=" in chunk or not items:
            items.append(chunk)
        else:
            items[-1] += "," + chunk  # a list value (devices=rpc:2,cuda)
    return [i.strip() for i in items if i.strip()]


_TOOL_OPTS = {"--cases": True, "--json": False, "--exact": False, "--no-real": False, "--html": True}


def split_tool_options(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """The toolkit's own options of plan/fit, and the llama.cpp flags left for the grammar."""
    opts: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in _TOOL_OPTS:
            if _TOOL_OPTS[name]:
                if not eq:
                    if i + 1 >= len(argv):
                        raise ParameterError(name, None, "a value after the option")
                    val = argv[i + 1]
                    i += 1
                opts[name.lstrip("-").replace("-", "_")] = val
            else:
                opts[name.lstrip("-").replace("-", "_")] = True
        else:
            rest.append(a)
        i += 1
    return opts, rest


def cmd_plan(argv: Sequence[str]) -> int:
    from toolkit.args import parse_args
    from toolkit.cases import load_cases, log_lines, plan_case
    from toolkit.fit.plan import plan_args
    opts, rest = split_tool_options(argv)
    if "cases" not in opts:
        made: list[Any] = []
        r = plan_args(parse_args(rest, env=os.environ), contexts=made)
        if opts.get("html") and made:   # one self-contained HTML report (toolkit.ui.share, plotly)
            share = importlib.import_module("toolkit.ui.share")
            share.save_html(opts["html"], [share.section_of(made[0], str(r.get("id")))],
                            title=f"toolkit plan {' '.join(rest)}")
        if opts.get("json"):
            json.dump(r, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            print("\n".join(log_lines(r)))
        return 0 if "error" not in r else 1
    if rest:
        raise ParameterError("plan --cases", " ".join(rest), "no llama.cpp flags (each case brings its own)")
    cases = load_cases(opts["cases"])
    results = [plan_case(c) for c in cases]
    if opts.get("html"):   # one self-contained HTML report (toolkit.ui.share, plotly)
        importlib.import_module("toolkit.ui.share").save_cases_html(opts["html"], cases, source=str(opts["cases"]))
    if opts.get("json"):
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for r in results:
        print(f"===== CASE {r['id']}")
        for line in log_lines(r):
            print(line)
    return 0


def cmd_fit(argv: Sequence[str]) -> int:
    from toolkit.args import load_model_arg, parse_args
    from toolkit.fit import fit_params, fit_print, real_run
    from toolkit.fit.cases import fit_case
    from toolkit.ggml.bulk import paused_gc
    opts, rest = split_tool_options(argv)
    if "cases" in opts:
        cases = json.loads(Path(opts["cases"]).read_text())
        out = [fit_case(c, real=not opts.get("no_real")) for c in (cases if isinstance(cases, list) else [cases])]
        if opts.get("json"):
            json.dump(out, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            for one in out:
                print(f"===== CASE {one['id']}")
                print(one.get("printed") or one.get("error", ""))
        return 0
    args = parse_args(rest, env=os.environ)
    hp = load_model_arg(args.model)
    if args.fit_print:
        fp = fit_print(hp, args)
        if opts.get("json"):
            json.dump({"printed": fp.printed, "probe": fp.probe.to_dict(), "log_lines": list(fp.log_lines)},
                      sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            print("\n".join(fp.log_lines), file=sys.stderr)
            print("\n".join(fp.rows))
        return 0
    # one context per probe, each dropped after it, and the process ends after the fit: CPython's cyclic
    # collector would only rescan what the probes keep alive (see toolkit.ggml.bulk)
    with paused_gc():
        r = fit_params(hp, args, exact=bool(opts.get("exact")))
        real = None if opts.get("no_real") else real_run(hp, args, r)
    if opts.get("json"):
        d = r.to_dict()
        if real is not None:
            d["real"] = real.to_dict()
        json.dump(d, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(r.log_lines), file=sys.stderr)
        if real is not None:
            print("\n".join("real run: " + line for line in real.lines()), file=sys.stderr)
        if r.printed_differs:
            print(f"note: the printed line drops the trailing zero split entries of -ts "
                  f"{','.join(map(str, r.fitted.ts or ()))}: a program given it splits by free memory", file=sys.stderr)
        if r.printed:
            print(r.printed)
    return 0 if r.status == "success" else 1


def cmd_replay(args: argparse.Namespace) -> int:
    from toolkit.cases import context_from_case, load_cases
    found = [c for c in load_cases(args.case) if c.get("id") == args.id or args.id is None]
    if not found:
        print(f"error: no case with id {args.id!r} in {args.case}", file=sys.stderr)
        return 2
    steps = parse_steps(args.steps or "")
    ctx = context_from_case(found[0])
    for changes in steps:
        try:
            ctx.update(**changes)
        except ValueError:
            pass  # the error event is in the log
    if args.json:
        json.dump([e.to_dict() for e in ctx.events], sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
    else:
        for e in ctx.events:
            print(e.to_text())
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from toolkit.explain import explain
    exp = explain(args.log, args.model)
    d = exp.to_dict()
    if args.json:
        json.dump(d, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print("\n".join(exp.lines()))
    if args.html:
        from toolkit.ui.share import explained_html, save_html, section_of
        save_html(args.html, [section_of(exp.context, f"rebuilt from {exp.run.log.source}")],
                  title=f"toolkit explain: {Path(exp.run.log.source).name}",
                  meta={"llama.cpp build": exp.run.log.build or "not printed"},
                  preamble=explained_html(d["compared"], d["missing"], d["causes"]))
    return 0 if exp.all_equal else 1


def cmd_run(argv: Sequence[str]) -> int:
    mod = importlib.import_module("toolkit.jaxrt.cli")
    return int(mod.main(list(argv)) or 0)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from toolkit.models.tokenizer import load_vocab, tokenize_json
    vocab = load_vocab(args.model)
    if args.json:
        if args.text is not None:
            raise ParameterError("text", args.text, "no TEXT with --json (the texts come on stdin)")
        print(tokenize_json(vocab, sys.stdin.read()))
        return 0
    if args.text is None:
        raise ParameterError("text", None, "a TEXT argument, or --json with a JSON list on stdin")
    ids = vocab.tokenize(args.text, add_special=vocab.add_bos and not args.no_bos,
                         parse_special=args.parse_special)
    print("[" + ", ".join(str(i) for i in ids) + "]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("plan", help="plan a llama.cpp command line (-m MODEL flags...) or --cases FILE", add_help=False)
    sub.add_parser("fit", help="fit a llama.cpp command line to device memory, as llama-fit-params", add_help=False)
    rp = sub.add_parser("replay", help="replay a sequence of parameter changes and print the reserve events")
    rp.add_argument("--case", required=True, help="JSON file with the case(s)")
    rp.add_argument("--id", help="case id (default: the first case)")
    rp.add_argument("--steps", default="", help='e.g. "max_nodes=4096; parallel=on; op_offload=off"')
    rp.add_argument("--json", action="store_true")
    ep = sub.add_parser("explain", help="rebuild the context of a llama.cpp start-up log and compare its numbers")
    ep.add_argument("log", help="the log file (llama-server / llama-cli / llama-completion start-up output)")
    ep.add_argument("-m", "--model", help="the GGUF file the run loaded (its tensor types)")
    ep.add_argument("--json", action="store_true")
    ep.add_argument("--html", help="also write the standalone HTML report here")
    tp = sub.add_parser("tokenize", help="token ids of a text by a GGUF file's own tokenizer")
    tp.add_argument("-m", "--model", required=True, help="the GGUF file")
    tp.add_argument("text", nargs="?", help="the text (llama-tokenize -p)")
    tp.add_argument("--json", action="store_true", help="JSON list of texts on stdin -> JSON list of id lists")
    tp.add_argument("--no-bos", action="store_true", help="do not add BOS (llama-tokenize --no-bos)")
    tp.add_argument("--parse-special", action="store_true", help="split out control tokens too")
    sub.add_parser("run", help="execute on JAX (toolkit.jaxrt)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return cmd_run(argv[1:])
    try:
        if argv and argv[0] in ("plan", "fit"):
            if "-h" in argv[1:] or "--help" in argv[1:]:
                print(__doc__)
                return 0
            return cmd_plan(argv[1:]) if argv[0] == "plan" else cmd_fit(argv[1:])
        args = build_parser().parse_args(argv)
        if args.command == "tokenize":
            return cmd_tokenize(args)
        return cmd_explain(args) if args.command == "explain" else cmd_replay(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
