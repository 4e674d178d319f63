"""toolkit.fit for qwen35moe against the third oracle's fit cases (tests/data/fit-cases-qwen35moe.json):
llama-fit-params on the tiny hybrid MoE model, with and without its NextN/MTP block, on one and two
memory-limited RPC servers, then llama-completion with the printed line. The checks are tests/test_fit.py's:
the printed line, the fit's log lines, every probe's compute buffers and context, and the real run's buffers
and device use. The context is the KV cache and the recurrent state (``llama_memory_hybrid``): the probes
record the KV cache only, and the state's bytes are the real run's (they depend on ``n_seq_max`` alone).

Without MTP, ``common_get_device_memory_data`` counts ``llama_model_n_layer`` layers (the trunk, 8), while the
model places layers over ``n_layer_all`` (9, the skipped MTP block included): the same two-server limit that
gives the plain model ``-ngl 9 -ts 7,2`` gives the MTP model ``-ngl 9 -ts 6,3``."""

from __future__ import annotations

import json
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from toolkit.fit.cases import fit_case

DATA = Path(__file__).resolve().parent / "data"
FIT_CASES = {c["id"]: c for c in json.loads((DATA / "fit-cases-qwen35moe.json").read_text())}
TOOK = re.compile(r"took [\d.]+ seconds")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def _mask(lines: list[str]) -> list[str]:
    return [TOOK.sub("took N seconds", line) for line in lines]


def test_cases_present() -> None:
    assert Counter(c["model"]["name"] for c in FIT_CASES.values()) == {"tiny_qwen35moe_f32": 9,
                                                                       "tiny_qwen35moe_mtp_f32": 7}


@pytest.mark.parametrize("cid", list(FIT_CASES))
def test_fit_case(cid: str) -> None:
    c, got = FIT_CASES[cid], _fitted(cid)
    assert "error" not in got, got.get("error")
    assert got["printed"] == c["fit"]["printed"]
    assert got["fitted"] == c["fit"]["fitted"]
    assert _mask(got["log_lines"]) == _mask(c["fit"]["fit_log_lines"])
    assert len(got["probes"]) == len(c["fit"]["probes"])
    for g, w in zip(got["probes"], c["fit"]["probes"]):
        assert {x["buft"]: x["bytes"] for x in g["compute_buffer"]} == {x["buft"]: x["bytes"] for x in
                                                                        w["compute_buffer"]}
        assert sum(x["bytes"] for x in g["context"]) == sum(k["size_k_bytes"] + k["size_v_bytes"] for k in w["kv"]) \
            + c["run"]["observed"]["rs_bytes"]
    obs, real = c["run"]["observed"], got["real"]
    assert real["compute_buffers_bytes"] == obs["compute_buffers_bytes"]
    assert real["context_buffers_bytes"] == dict(Counter(obs["kv_buffers_bytes"]) + Counter(obs["rs_buffers_bytes"]))
    assert real["model_buffers_bytes"] == obs["model_buffers_bytes"]
    for d, chk in zip(real["devices"], c["run"]["device_check"]):
        assert d["real"]["total"] == chk["used_bytes"]
        assert (d["fits"], d["keeps_margin"]) == (chk["fits_limit"], chk["fits_limit_minus_margin"])


def test_the_mtp_block_moves_the_two_server_split() -> None:
    """The same two 1346 MiB servers: 7 + 2 of the plain model's 9 (8 layers + output), 6 + 3 with the MTP block."""
    plain = _fitted("fit-tiny_qwen35moe_f32-rpc2-1346_1346-default")["printed"]
    mtp = _fitted("fit-tiny_qwen35moe_mtp_f32-rpc2-1346_1346-default")["printed"]
    assert (plain, mtp) == ("-c 204544 -ngl 9 -ts 7,2", "-c 204544 -ngl 9 -ts 6,3")
