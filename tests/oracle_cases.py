"""The oracle's cases and GGML_SCHED_DEBUG=2 dumps (tests/data/), parsed for the oracle tests."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
CASES_JSON = DATA / "cases.json"
# the second oracle's qwen3 and gemma3 cases, and the Llama-3.x-file oracle (observed fields trimmed)
ARCH_CASES_JSON = (DATA / "cases-qwen3-gemma3.json", DATA / "cases-llama3.json")
DUMPS = DATA / "sched-debug"
# the third oracle's gpt-oss cases (MXFP4 experts and an F32 variant), checked by tests/test_oracle_gptoss.py
GPTOSS_CASES_JSON = DATA / "cases-gptoss.json"
# the third oracle's Gemma 4 cases (31B- and 26B-A4B-shaped tiny models), tests/test_oracle_gemma4.py
GEMMA4_CASES_JSON = DATA / "cases-gemma4.json"
# the third oracle's hybrids (qwen35, qwen35moe, lfm2: recurrent state), checked by tests/test_oracle_hybrid.py
HYBRID_CASES_JSON = (DATA / "cases-qwen35.json", DATA / "cases-lfm2.json")
# the third oracle's deepseek2 (MLA) and glm4moe cases, checked by tests/test_oracle_mla.py
MLA_CASES_JSON = (DATA / "cases-deepseek2.json", DATA / "cases-glm4moe.json")


@cache
def cases() -> list[dict[str, Any]]:
    return json.loads(CASES_JSON.read_text())


def case(case_id: str) -> dict[str, Any]:
    for c in (*cases(), *arch_cases(), *gptoss_cases(), *gemma4_cases(), *hybrid_cases(), *mla_cases()):
        if c["id"] == case_id:
            return c
    raise KeyError(case_id)


@cache
def arch_cases() -> list[dict[str, Any]]:
    return [c for p in ARCH_CASES_JSON for c in json.loads(p.read_text())]


@cache
def hybrid_cases() -> list[dict[str, Any]]:
    return [c for p in HYBRID_CASES_JSON for c in json.loads(p.read_text())]


@cache
def mla_cases() -> list[dict[str, Any]]:
    return [c for p in MLA_CASES_JSON for c in json.loads(p.read_text())]


@cache
def gptoss_cases() -> list[dict[str, Any]]:
    return list(json.loads(GPTOSS_CASES_JSON.read_text()))


# what every architecture's case compares (test_oracle_archs.py, test_oracle_gptoss.py)
PLANNED_FIELDS = ("graph_nodes", "graph_nodes_tg", "graph_splits", "graph_splits_tg", "compute_buffers_bytes",
                  "kv_bytes", "kv_buffers_bytes", "model_buffers_bytes", "output_buffer_bytes", "n_copies",
                  "pipeline_parallel", "max_nodes", "n_tensors", "n_backends", "flash_attn_effective", "warnings")
KV_FIELDS = ("cache", "cells", "layers", "n_stream", "size_k_bytes", "size_v_bytes", "buffers")


def assert_planned_matches(got: dict[str, Any], obs: dict[str, Any]) -> None:
    """``toolkit.cases.plan_case``'s summary against llama.cpp's observation: every field, the layer
    placement (the oracle adds is_swa as a third column for iSWA models) and every KV cache on its own
    (cells per stream, layers, K and V bytes, buffers)."""
    assert obs["rc"] == 0
    assert "error" not in got, got.get("error")
    for f in PLANNED_FIELDS:
        assert got[f] == obs[f], (f, got[f], obs[f])
    assert [list(x) for x in got["layer_devices"]] == [list(x)[:2] for x in obs["layer_devices"]]
    assert got["kv_caches"] == [{k: kc[k] for k in KV_FIELDS} for kc in obs["kv_caches"]]


def graph_only_sizes(ctx: Any) -> dict[tuple[str, str], int]:
    """The oracle's ``graph_only_alloc_bytes`` measured as its patch measures them (ORACLE_GRAPH_SIZES):
    after the reserves, the pp graph and the tg graph each through ``graph_reserve(..., sizes)``
    (``ggml_backend_sched_reserve_size``, which resets the scheduler after the graph is built and so drops
    the backends the graph callback pinned), per (graph, backend name)."""
    rp = ctx.setup.resolved
    n_seqs, n_tokens = rp.n_seq_max, min(rp.n_ctx, rp.n_ubatch)
    out: dict[tuple[str, str], int] = {}
    for label, shape in (("pp", (n_tokens, n_seqs, min(n_tokens, rp.n_outputs_max))), ("tg", (n_seqs,) * 3)):
        ctx.graph_reserve(*shape, sizes=True)
        for be, size in zip(ctx.scheduler.backends, ctx.scheduler.graph_needed_sizes()):
            out[(label, be.name)] = size
    return out


@cache
def gemma4_cases() -> list[dict[str, Any]]:
    return list(json.loads(GEMMA4_CASES_JSON.read_text()))


_RESERVE = re.compile(r"graph_reserve: reserving a graph for ubatch with n_tokens =\s*(\d+), n_seqs =\s*(\d+), "
                      r"n_outputs =\s*(\d+)")
_SPLIT = re.compile(r"## SPLIT #(\d+): (\S+) # (\d+) inputs")
_INPUT = re.compile(r"\[(.{0,20}?) \(\s*(\d+[KM])\)\]")
_NODE = re.compile(r"node #\s*(\d+) \((.{10})\): (.{20}) \((.{5})\) \[(.{5}) (.{8})\] use=(\d+),c=(\d+):(.*)$")
_SRC = re.compile(r" (.{20}) \((.{5})\) \[(.{5}) (.{8})\]")


@dataclass
class DumpNode:
    index: int
    op: str
    name: str
    size: str
    backend: str
    srcs: list[tuple[str, str, str]]   # (name, size, backend)


@dataclass
class DumpSplit:
    index: int
    backend: str
    inputs: list[tuple[str, str]]      # (name, size)
    nodes: list[DumpNode] = field(default_factory=list)


@dataclass
class DumpReserve:
    n_tokens: int
    n_seqs: int
    n_outputs: int
    splits: list[DumpSplit] = field(default_factory=list)

    @property
    def nodes(self) -> list[DumpNode]:
        return [n for s in self.splits for n in s.nodes]


def parse_dump(path: Path) -> list[DumpReserve]:
    """Every reserve of a debug log (6 fused-op probes, pp, tg, pp), with its splits and node lines."""
    out: list[DumpReserve] = []
    cur: DumpReserve | None = None
    for line in path.read_text().splitlines():
        m = _RESERVE.search(line)
        if m:
            cur = DumpReserve(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            out.append(cur)
            continue
        if cur is None:
            continue
        if line.startswith("sched_reserve: ORACLE stage=pp2") or line.startswith("cmn"):
            cur = None
            continue
        _parse_line(cur, line)
    return out


def parse_splits(text: str) -> DumpReserve:
    """Our scheduler's ``dump()`` text, parsed like one reserve of a llama.cpp log."""
    r = DumpReserve(0, 0, 0)
    for line in text.splitlines():
        _parse_line(r, line)
    return r


def _parse_line(cur: DumpReserve, line: str) -> None:
    if True:
        m = _SPLIT.match(line)
        if m:
            ins = [(a.strip(), b) for a, b in _INPUT.findall(line)]
            cur.splits.append(DumpSplit(int(m.group(1)), m.group(2), ins))
            return
        m = _NODE.match(line)
        if m:
            srcs = [(a.strip(), b.strip(), c.strip()) for a, b, c, _ in _SRC.findall(m.group(9))]
            cur.splits[-1].nodes.append(DumpNode(int(m.group(1)), m.group(2).strip(), m.group(3).strip(),
                                                 m.group(4).strip(), m.group(5).strip(), srcs))


def fmt_size(n: int) -> str:
    """The dump's size column: whole MiB as ``%zuM`` from 1 MiB up, else whole KiB as ``%zuK``."""
    return f"{n // (1 << 20)}M" if n >= (1 << 20) else f"{n // 1024}K"


def debug_case_ids() -> list[str]:
    """The dumps of every case (first oracle, qwen3/gemma3, Llama-3.x files, gpt-oss, gemma4, the hybrids,
    deepseek2 and glm4moe) that has one."""
    ids = {c["id"] for c in (*cases(), *arch_cases(), *gptoss_cases(), *gemma4_cases(), *hybrid_cases(),
                             *mla_cases())}
    return sorted(i for i in (p.name[: -len(".txt")] for p in DUMPS.glob("*-DEBUG.txt")) if i in ids)


def recorded_max_nodes(model_name: str) -> int:
    """The max_nodes llama.cpp recorded for a model (``llama_context::graph_max_nodes``), the same on
    every case of that model in cases.json."""
    seen = {c["observed"]["max_nodes"] for c in cases()
            if c["model"]["name"] == model_name and c["observed"].get("max_nodes") is not None}
    assert len(seen) == 1, f"{model_name}: recorded max_nodes {sorted(seen)}"
    return seen.pop()
