"""Cases in the schema of the oracle's ``cases.json``: ``{id, model, cparams, observed?}``.

:func:`toolkit.context.plan_case` creates the context a case describes and returns what llama.cpp printed for
it, under the oracle's field names (``graph_nodes``, ``graph_splits``, ``compute_buffers_bytes``,
``kv_bytes``, ``n_copies``, …), or ``{"id", "error"}`` when llama.cpp refuses the context.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toolkit.models import memory


def load_cases(path: str | Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(c, dict) and "model" in c and "cparams" in c for c in data):
        raise ValueError(f"{path}: expected a list of cases with 'model' and 'cparams'")
    return data


def summary(ctx: Any) -> dict[str, Any]:
    """A context's numbers under the oracle's names (the last reserve event's)."""
    ev = ctx.events[-1]
    return {
        "graph_nodes": ev.n_nodes_pp, "graph_nodes_tg": ev.n_nodes_tg,
        "graph_splits": ev.n_splits_pp, "graph_splits_tg": ev.n_splits_tg,
        "compute_buffers_bytes": ctx.compute_buffers_bytes(),
        "kv_bytes": ctx.kv_bytes, "kv_buffers_bytes": ctx.kv_buffers_bytes,
        "model_buffers_bytes": ctx.model_buffers_bytes, "output_buffer_bytes": ctx.output_buffer_bytes,
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
    }


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
            for name, b in result["model_buffers_bytes"].items()]
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
