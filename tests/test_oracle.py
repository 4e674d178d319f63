"""Every oracle case (real llama.cpp numbers, tests/data/cases.json) against the context's, field by field.

Nothing here is keyed on a case id or a model name: each case's model and cparams go through the
same general rules, and every number compared was printed by llama.cpp.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from oracle_cases import DUMPS, case, cases, debug_case_ids, parse_dump, parse_splits

from toolkit.cases import context_from_case, plan_case

FIELDS = ("graph_nodes", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes", "n_copies",
          "pipeline_parallel", "model_buffers_bytes", "output_buffer_bytes", "kv_buffers_bytes", "max_nodes",
          "n_backends", "flash_attn_effective")
IDS = [c["id"] for c in cases()]


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(case(case_id))


def test_all_170_cases_present() -> None:
    assert len(IDS) == 170 and len(set(IDS)) == 170


@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id: str) -> None:
    obs = case(case_id)["observed"]
    got = _planned(case_id)
    if obs["rc"] != 0:
        # llama.cpp refused the context: the same error, no numbers
        assert "error" in got
        assert f"llama_init_from_model: {got['error']}" == obs["errors"][0]
        return
    assert "error" not in got, got.get("error")
    for f in FIELDS:
        assert got[f] == obs[f], (f, got[f], obs[f])
    assert got["graph_nodes_tg"] == obs["graph_nodes_tg"]
    assert [list(x) for x in got["layer_devices"]] == [list(x) for x in obs["layer_devices"]]
    assert got["warnings"] == obs["warnings"] == []


@pytest.mark.parametrize("case_id", debug_case_ids())
def test_debug_dump_node_by_node(case_id: str) -> None:
    """Our scheduler's GGML_SCHED_DEBUG=2 listing equals llama.cpp's for every reserve of the log:
    split boundaries and backends, split inputs, and per node the backend of the node and its sources."""
    ctx = context_from_case(case(case_id))
    for r in parse_dump(DUMPS / f"{case_id}.txt"):
        ctx.graph_reserve(r.n_tokens, r.n_seqs, r.n_outputs, split_only=True)
        ours = parse_splits(ctx.scheduler.dump())
        assert [(s.index, s.backend, s.inputs) for s in ours.splits] == \
            [(s.index, s.backend, s.inputs) for s in r.splits], r.n_tokens
        for so, st in zip(ours.splits, r.splits):
            assert [n.index for n in so.nodes] == [n.index for n in st.nodes]
            for a, b in zip(so.nodes, st.nodes):
                assert (a.op, a.name, a.size, a.backend) == (b.op, b.name, b.size, b.backend), (a, b)
                assert a.srcs == b.srcs, (a.index, a.srcs, b.srcs)
