"""``python -m toolkit``: plan oracle-style cases, replay reuse/rebuild sequences, run (JAX).

- ``plan --cases FILE.json [--json]``: per case, what llama.cpp prints (graph nodes and splits,
  compute/KV/model/output buffers, n_copies, pipeline parallelism), as log lines or a JSON list;
- ``replay --case FILE.json --id ID --steps "max_nodes=4096; parallel=on" [--json]``: the
  reserve-event log of the initial reserve followed by one event per step;
- ``run ...``: execution on JAX, delegated to ``toolkit.jaxrt.cli:main`` (imported only then).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any

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


def cmd_plan(args: argparse.Namespace) -> int:
    from toolkit.context import plan_case
    from toolkit.models.cases import load_cases, log_lines
    cases = load_cases(args.cases)
    results = [plan_case(c) for c in cases]
    if getattr(args, "html", None):   # one self-contained HTML report (toolkit.ui.share, plotly)
        importlib.import_module("toolkit.ui.share").save_cases_html(args.html, cases, source=str(args.cases))
    if args.json:
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    for r in results:
        print(f"===== CASE {r['id']}")
        for line in log_lines(r):
            print(line)
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from toolkit.context import context_from_case
    from toolkit.models.cases import load_cases
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


def cmd_run(argv: Sequence[str]) -> int:
    mod = importlib.import_module("toolkit.jaxrt.cli")
    return int(mod.main(list(argv)) or 0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m toolkit", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    pl = sub.add_parser("plan", help="plan every case of a cases.json-style file")
    pl.add_argument("--cases", required=True, help="JSON list of {id, model, cparams}")
    pl.add_argument("--json", action="store_true", help="print a JSON list instead of log lines")
    pl.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report (figures, events)")
    rp = sub.add_parser("replay", help="replay a sequence of parameter changes and print the reserve events")
    rp.add_argument("--case", required=True, help="JSON file with the case(s)")
    rp.add_argument("--id", help="case id (default: the first case)")
    rp.add_argument("--steps", default="", help='e.g. "max_nodes=4096; parallel=on; op_offload=off"')
    rp.add_argument("--json", action="store_true")
    sub.add_parser("run", help="execute on JAX (toolkit.jaxrt)", add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return cmd_run(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return cmd_plan(args) if args.command == "plan" else cmd_replay(args)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
