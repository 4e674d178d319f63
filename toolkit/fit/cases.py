"""Fit cases in the schema of the oracle's ``fit-cases.json``: ``{id, model, inputs, fit?, run?}``.

:func:`fit_case` runs what the case ran: ``llama-fit-params`` with ``inputs.cli_args`` against
devices whose free memory comes from ``inputs`` (the exact bytes in ``server_env``, else
``server_free_mib``). A server started without a limit reported the host's physical memory,
which a case records only in the breakdown table it printed; that value is read from there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from toolkit.args import model_from_dict, parse_args
from toolkit.errors import ToolkitError, UnsupportedFeature
from toolkit.fit.impl import fit_params, fit_print
from toolkit.fit.real import real_run
from toolkit.memory import MiB, device_memory

_TABLE_ROW = re.compile(r"\|\s+- (\S+) \(.*?\)\s*\|\s*(\d+) = (\d+) \+")


def memory_from_inputs(case: Mapping[str, Any]) -> list[tuple[int, int]]:
    """(free, total) bytes per RPC server of a fit case."""
    inp = case["inputs"]
    reported = [(int(m.group(3)) << 20, int(m.group(2)) << 20)
                for line in case.get("fit", {}).get("fit_log_lines", ()) if (m := _TABLE_ROW.search(line))]
    out: list[tuple[int, int]] = []
    for i, env in enumerate(inp.get("server_env") or [{}] * len(inp.get("server_free_mib", ()))):
        free_mib = (inp.get("server_free_mib") or [None] * (i + 1))[i]
        if env.get("ORACLE_RPC_FREE_BYTES"):
            free = int(env["ORACLE_RPC_FREE_BYTES"])
            out.append((free, int(env.get("ORACLE_RPC_TOTAL_BYTES", free))))
        elif free_mib is not None:
            out.append((int(free_mib * MiB), int((inp.get("server_total_mib") or [free_mib] * (i + 1))[i] * MiB)))
        elif i < len(reported):
            out.append(reported[i])
        else:
            raise ToolkitError(f"case {case.get('id')!r}: no memory for RPC server {i}")
    return out


def printed_fields(printed: str) -> dict[str, Any] | None:
    """``fit.fitted``: the printed line parsed into c, ngl, ts and ot (as printed)."""
    if not printed:
        return None
    m = re.fullmatch(r'-c (\d+) -ngl (-?\d+)(?: -ts (\S+))?(?: -ot "(.*)")?', printed)
    if not m:
        return None
    return {"c": int(m.group(1)), "ngl": int(m.group(2)), "ts": m.group(3), "ot": m.group(4)}


# a real-size model description: its recipe's names for what the oracle's cases.json schema calls otherwise
_RECIPE_NAMES = {"head_dim": "n_embd_head"}
_EXPERT_WEIGHTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight")


def model_description(d: Mapping[str, Any]) -> dict[str, Any]:
    """A fit case's ``model`` in the schema :func:`toolkit.args.model_from_dict` reads.

    The oracle's real-size cases (sparse GGUFs written from a published config) keep the sizes the
    file was generated from under ``recipe`` (``head_dim`` for the head size, ``expert_dtype`` for the
    experts' type) and list the file's stored types in ``tensor_types``, where the cases.json schema
    has per-suffix type overrides; such a description is flattened, its list dropped and its experts'
    type, where it differs from ``dtype``, made an override. Any other description is returned as it is.
    """
    recipe = d.get("recipe")
    if not isinstance(recipe, Mapping) or "n_embd" in d or "n_embd" not in recipe:
        return dict(d)
    out: dict[str, Any] = {_RECIPE_NAMES.get(str(k), str(k)): v for k, v in recipe.items() if v is not None}
    out.update({k: v for k, v in d.items() if k not in ("recipe", "tensor_types")})
    types = dict(d["tensor_types"]) if isinstance(d.get("tensor_types"), Mapping) else {}
    expert = recipe.get("expert_dtype")
    if expert and int(recipe.get("n_expert") or 0) > 0 and expert != recipe.get("dtype"):
        types.update(dict.fromkeys(_EXPERT_WEIGHTS, expert))
    out["tensor_types"] = types
    return out


def fit_case(case: Mapping[str, Any], *, real: bool = True) -> dict[str, Any]:
    """Fit one case; ``{"id", "printed", "fitted", "probes", "log_lines", …}`` or ``{"id", "error"}``."""
    cid = case.get("id")
    try:
        hp = model_from_dict(model_description(case["model"]))
        args = parse_args([str(a) for a in case["inputs"]["cli_args"]])
        mem = device_memory(args, memory_from_inputs(case))
        if args.fit_print:
            fp = fit_print(hp, args, mem)
            return {"id": cid, "status": "success", "printed": fp.printed, "fitted": None,
                    "probes": [fp.probe.to_dict()], "log_lines": list(fp.log_lines)}
        r = fit_params(hp, args, mem)
        out: dict[str, Any] = {"id": cid, **r.to_dict(), "fitted": printed_fields(r.printed),
                               "fitted_in_process": r.fitted.to_dict()}
        if real:
            out["real"] = real_run(hp, args, r).to_dict()
            if len(mem) > 1:
                # -fit on inside the program: fit's own split, or after a refused fit the user's parameters
                out["real_fit_on"] = real_run(hp, args, r, in_process=True).to_dict()
        return out
    except UnsupportedFeature as e:
        return {"id": cid, "error": str(e), "unsupported": e.feature}
    except ToolkitError as e:
        return {"id": cid, "error": str(e)}


__all__ = ["fit_case", "memory_from_inputs", "model_description", "printed_fields"]
