"""Cases in the schema of the oracle's ``cases.json``: ``{id, model, cparams, observed?}``.

:func:`context_from_case` creates the context a case describes (its ``cparams`` read by
:func:`cparams_from_case`, through llama.cpp's flag grammar when the case recorded its command line);
:func:`plan_case` returns what llama.cpp printed for it, under the oracle's field names
(``graph_nodes``, ``graph_splits``, ``compute_buffers_bytes``, ``kv_bytes``, ``n_copies``, …), or
``{"id", "error"}`` when llama.cpp refuses the context; :func:`log_lines` prints it as llama.cpp does.

>>> case = {"id": "t", "model": {"name": "t", "n_layer": 1, "n_embd": 64, "n_head": 2, "n_ff": 128},
...         "cparams": {"cli_args": ["-c", "256", "-ngl", "0", "-fa", "on"]}}
>>> r = plan_case(case)
>>> r["graph_splits"], r["n_copies"], r["max_nodes"]
(1, 1, 1024)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolkit.args import parse_args
from toolkit.context import Context
from toolkit.errors import ToolkitError
from toolkit.models import memory
from toolkit.models.cparams import DEFAULT_N_GPU_LAYERS, ContextParams
from toolkit.models.hparams import HParams


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(c, dict) and "model" in c and "cparams" in c for c in data):
        raise ValueError(f"{path}: expected a list of cases with 'model' and 'cparams'")
    return data


def cparams_from_case(d: Mapping[str, Any]) -> ContextParams:
    """A case's ``cparams``: its ``cli_args`` through llama.cpp's flag grammar
    (:func:`toolkit.args.parse_args`, with the case's ``env``) when present, else the
    requested values (``rpc_servers`` become RPC devices)."""
    if d.get("cli_args"):
        env = dict(d.get("env") or {})
        if d.get("forced_pipeline_parallel_env"):   # the same switch, recorded without the env
            env["ORACLE_FORCE_PP"] = "1"
        return parse_args([str(a) for a in d["cli_args"]], env=env).context_params()
    ngl = d.get("ngl", d.get("n_gpu_layers", DEFAULT_N_GPU_LAYERS))
    split = str(d.get("split_mode", "layer")).split()[0]
    ts = d.get("tensor_split")
    if isinstance(ts, str):
        ts = tuple(float(x) for x in ts.replace("/", ",").split(",") if x.strip())
    devices: list[str] = [f"rpc:{ep}" for ep in d.get("rpc_servers", ())]
    devices += [str(x) for x in d.get("extra_devices", ())]
    load_mode = str(d.get("load_mode") or "mmap").lower()
    use_mmap = bool(d.get("use_mmap", True)) and load_mode not in ("none", "no_mmap", "read")
    return ContextParams(
        n_ctx=int(d.get("n_ctx", 4096)), n_batch=int(d.get("n_batch", 2048)),
        n_ubatch=int(d.get("n_ubatch", 512)), n_seq_max=int(d.get("n_seq_max", 1)),
        flash_attn=d.get("flash_attn", "auto"), type_k=str(d.get("type_k", "f16")),
        type_v=str(d.get("type_v", "f16")), kv_unified=bool(d.get("kv_unified", False)),
        offload_kqv=bool(d.get("offload_kqv", True)), op_offload=bool(d.get("op_offload", True)),
        n_gpu_layers=int(ngl), split_mode=split,  # type: ignore[arg-type]
        main_gpu=int(d.get("main_gpu", 0)), tensor_split=tuple(ts) if ts else None,
        devices=tuple(devices), use_mmap=use_mmap,
        force_pipeline_parallel=bool(
            d.get("forced_pipeline_parallel_env", d.get("force_pipeline_parallel", False))),
        override_tensor=tuple(x for x in str(d.get("override_tensor") or "").split(",") if x),
        cpu_moe=bool(d.get("cpu_moe", False)), n_cpu_moe=int(d.get("n_cpu_moe", 0) or 0),
        swa_full=bool(d.get("swa_full", False)),
    )


def context_from_case(case: Mapping[str, Any], **kw: Any) -> Context:
    """The context an oracle case (``{id, model, cparams}``) describes."""
    hp = HParams.from_dict(case["model"])
    cp = cparams_from_case(case["cparams"])
    return Context(hp, cp, **kw)


def plan_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """What llama.cpp printed for a case, under the oracle's names, or ``{"id", "error"}`` when it refuses."""
    try:
        ctx = context_from_case(case)
    except ToolkitError as e:
        return {"id": case.get("id"), "error": e.llama_text or str(e)}
    return {"id": case.get("id"), **summary(ctx)}


def summary(ctx: Context) -> dict[str, Any]:
    """A context's numbers under the oracle's names (the last reserve event's)."""
    ev = ctx.events[-1]
    pp, tg = ev.graphs["pp"], ev.graphs["tg"]
    return {
        "graph_nodes": pp.n_nodes, "graph_nodes_tg": tg.n_nodes,
        "graph_splits": pp.n_splits, "graph_splits_tg": tg.n_splits,
        "compute_buffers_bytes": ctx.compute_buffers_bytes(),
        "kv_bytes": ctx.kv_bytes, "kv_buffers_bytes": ctx.kv_buffers_bytes,
        "model_buffers_bytes": ctx.model_buffers_bytes,
        "model_buffer_lines": [[n, b] for n, b in ctx.model_buffer_lines],
        "output_buffer_bytes": ctx.output_buffer_bytes,
        "n_copies": ev.n_copies, "pipeline_parallel": ev.pipeline_parallel, "max_nodes": ev.params.max_nodes,
        "n_tensors": ctx.setup.model.n_tensors,
        "kv_caches": [{"cache": c.kind, "cells": c.kv_size, "layers": len(c.layers), "n_stream": c.n_stream,
                       "size_k_bytes": c.k_bytes, "size_v_bytes": c.v_bytes, "buffers": dict(c.buffers_bytes)}
                      for c in ctx.setup.memory.caches],
        "reserve_n_tokens": min(ctx.setup.resolved.n_ctx, ctx.setup.resolved.n_ubatch),
        "flash_attn_effective": int(ctx.flash_attn), "n_backends": ev.n_backends,
        "layer_devices": [list(x) for x in ctx.layer_devices], "warnings": list(ev.warnings),
        # the rest of llama_kv_cache's size line (cells, layers and bytes are in kv_caches)
        "kv_types": {"n_seq_max": ctx.setup.resolved.n_seq_max, "type_k": ctx.setup.resolved.type_k.lower,
                     "type_v": ctx.setup.resolved.type_v.lower},
        "tensor_overrides": [o.to_dict() for o in ctx.setup.model.tensor_overrides],
        **_rs_summary(ctx),
    }


def _rs_summary(ctx: Context) -> dict[str, Any]:
    """A hybrid's recurrent state (``llama_memory_recurrent``): bytes per buffer, their sum, the sizes
    and the device of each recurrent layer; nothing for a model without one."""
    rs = ctx.setup.memory.recurrent
    if rs is None:
        return {}
    return {"rs_buffers_bytes": dict(rs.buffers_bytes), "rs_bytes": rs.total_bytes, "rs": rs.info(),
            "rs_layer_devices": [list(x) for x in rs.layer_devices]}


def kv_size_line(c: Mapping[str, Any], t: Mapping[str, Any]) -> str:
    """``llama_kv_cache``'s size line for one cache (``c``: a ``kv_caches`` entry, ``t``: ``kv_types``)."""
    return memory.kv_size_line(c["size_k_bytes"], c["size_v_bytes"], c["cells"], c["layers"], t["n_seq_max"],
                               c["n_stream"], t["type_k"], t["type_v"])


def log_lines(result: Mapping[str, Any]) -> list[str]:
    """llama.cpp's log lines for a planned case (sched_reserve's, with exact bytes, and the buffers)."""
    fit = list(result.get("fit_log_lines") or ())
    if "error" in result:
        return [*fit, f"llama_init_from_model: {result['error']}"]
    # llama_model_loader: the tensors -ot / --cpu-moe / --n-cpu-moe moved (ggml_nbytes / 1 MiB, then exact bytes)
    out = fit + [f"tensor {o['tensor']} ({o['bytes'] // 2**20} MiB {o['type']}) buffer type overridden to "
                 f"{o['buft']} ({o['bytes']} bytes)" for o in result.get("tensor_overrides", ())]
    out += [f"load_tensors: {name:>12s} model buffer size = {b / 2**20:8.2f} MiB ({b} bytes)"
            for name, b in result.get("model_buffer_lines") or result["model_buffers_bytes"].items()]
    out += [f"llama_context: {name:>10s}  output buffer size = {b / 2**20:8.2f} MiB ({b} bytes)"
            for name, b in result["output_buffer_bytes"].items()]
    caches = result.get("kv_caches") or []
    if len(caches) > 1:  # llama_kv_cache_iswa: each cache logs its size and its own buffers
        for w in result.get("warnings", ()):
            out.append(w)
        for c in caches:
            out.append(memory.iswa_cache_line(c["cache"], c["cells"]))
            out += [memory.kv_buffer_line(name, b) for name, b in c["buffers"].items()]
            if "kv_types" in result:
                out.append(kv_size_line(c, result["kv_types"]))
    else:
        out += [memory.kv_buffer_line(name, b) for name, b in result["kv_buffers_bytes"].items()]
        if caches and "kv_types" in result:
            out.append(kv_size_line(caches[0], result["kv_types"]))
    if result["pipeline_parallel"]:
        out.append("llama_context: pipeline parallelism enabled")
    out.append(f"sched_reserve: max_nodes = {result['max_nodes']}")
    for name, b in result["compute_buffers_bytes"].items():
        if b > 1:
            out.append(f"sched_reserve: {name:>10s} compute buffer size = {b / 2**20:8.2f} MiB ({b} bytes)")
    n, ntg = result["graph_nodes"], result["graph_nodes_tg"]
    s, stg = result["graph_splits"], result["graph_splits_tg"]
    bs = result.get("reserve_n_tokens", "?")
    out.append(f"sched_reserve: graph nodes  = {n}" if n == ntg
               else f"sched_reserve: graph nodes  = {n} (with bs={bs}), {ntg} (with bs=1)")
    out.append(f"sched_reserve: graph splits = {s}" if s == stg
               else f"sched_reserve: graph splits = {s} (with bs={bs}), {stg} (with bs=1)")
    out.append(f"sched_reserve: sched copies = {result['n_copies']}")
    out += ["common_memory_breakdown_print: " + line for line in result.get("memory_breakdown") or ()]
    return out


__all__ = ["context_from_case", "cparams_from_case", "kv_size_line", "load_cases", "log_lines", "plan_case",
           "summary"]
