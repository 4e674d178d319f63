"""Mixture-of-experts cases (real llama.cpp numbers, tests/data/cases-moe.json) against the context's.

Mixtral-style ``llama`` models and ``qwen3moe`` on the CPU, one and two RPC servers, with ``-ot``,
``--cpu-moe`` and ``--n-cpu-moe``, ubatch 16 and 512, op offload on and off. Every number compared
was printed by llama.cpp; nothing is keyed on a case id.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from oracle_cases import parse_dump, parse_splits

from toolkit.cases import context_from_case, plan_case

DATA = Path(__file__).resolve().parent / "data"
DUMPS = DATA / "sched-debug-moe"
FIELDS = ("graph_nodes", "graph_nodes_tg", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes",
          "kv_buffers_bytes", "n_copies", "pipeline_parallel", "model_buffers_bytes", "output_buffer_bytes",
          "max_nodes", "n_backends", "flash_attn_effective", "warnings", "tensor_overrides")


@cache
def _cases() -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in json.loads((DATA / "cases-moe.json").read_text())}


def _ids(arch: str) -> list[str]:
    return [i for i, c in _cases().items() if c["model"]["arch"] == arch]


def test_case_counts() -> None:
    by = {a: len(_ids(a)) for a in ("llama", "qwen3moe")}
    assert by == {"llama": 106, "qwen3moe": 45}
    modes = {c["cparams"]["moe_mode"] for c in _cases().values()}
    assert modes == {None, "ot_exps_cpu", "cmoe", "ncmoe1", "ncmoe2"}


@pytest.mark.parametrize("case_id", [*_ids("llama"), *_ids("qwen3moe")])
def test_moe_case(case_id: str) -> None:
    c = _cases()[case_id]
    obs = c["observed"]
    got = plan_case(c)
    assert obs["rc"] == 0
    assert "error" not in got, got.get("error")
    for f in FIELDS:
        assert got[f] == obs[f], (f, got[f], obs[f])
    assert [list(x) for x in got["layer_devices"]] == [list(x[:2]) for x in obs["layer_devices"]]
    # the model buffers in llama.cpp's order too
    assert list(got["model_buffers_bytes"]) == [b["buffer"] for b in obs["model_buffers"]]


def _dump_ids() -> list[str]:
    return sorted(p.name[: -len(".txt")] for p in DUMPS.glob("*-DEBUG.txt"))


@pytest.mark.parametrize("case_id", _dump_ids())
def test_moe_debug_dump_node_by_node(case_id: str) -> None:
    """GGML_SCHED_DEBUG=2 listing: split boundaries, backends and inputs (whole expert tensors copied
    to the RPC server and back), and per node its backend and its sources' backends."""
    ctx = context_from_case(_cases()[case_id])
    reserves = parse_dump(DUMPS / f"{case_id}.txt")
    assert len(reserves) >= 3
    for r in reserves:
        ctx.graph_reserve(r.n_tokens, r.n_seqs, r.n_outputs, split_only=True)
        ours = parse_splits(ctx.scheduler.dump())
        assert [(s.index, s.backend, s.inputs) for s in ours.splits] == \
            [(s.index, s.backend, s.inputs) for s in r.splits], r.n_tokens
        for so, st in zip(ours.splits, r.splits):
            assert [n.index for n in so.nodes] == [n.index for n in st.nodes]
            for a, b in zip(so.nodes, st.nodes):
                assert (a.op, a.name, a.size, a.backend) == (b.op, b.name, b.size, b.backend), (a, b)
                assert a.srcs == b.srcs, (a.index, a.srcs, b.srcs)


@pytest.mark.parametrize(("preset", "fa", "per_layer"), [
    ("mixtral_8x7b", "on", 47), ("mixtral_8x7b", "off", 52),       # k = 2: dense llama + 16
    ("qwen3_30b_a3b", "on", 63), ("qwen3_30b_a3b", "off", 68),     # k = 8: qwen3 + 16 + 2k - 4
])
def test_node_count_rule_at_real_sizes(preset: str, fa: str, per_layer: int) -> None:
    """The oracle's MoE counts (47/52 per layer for k = 2, 55/60 for qwen3moe with k = 4, i.e. 2 more per
    used expert) at real depths and expert counts, + 6 outside the layers."""
    from toolkit.context import Context
    from toolkit.models import ContextParams, presets

    hp = presets.get(preset)
    ev = Context(hp, ContextParams(n_ctx=4096, n_ubatch=512, flash_attn=fa, n_gpu_layers=0)).events[-1]  # type: ignore[arg-type]
    assert ev.graphs["pp"].n_nodes == ev.graphs["tg"].n_nodes == per_layer * hp.n_layer + 6
    assert hp.moe is not None and hp.moe.nodes_per_layer == 16 + 2 * hp.moe.n_expert_used
