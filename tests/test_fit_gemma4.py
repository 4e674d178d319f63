"""toolkit.fit for Gemma 4 against the third oracle's fit cases (tests/data/fit-cases-gemma4.json):
llama-fit-params on the tiny dense and MoE models with one or two memory-limited RPC servers, then
llama-completion with the printed line. The checks are tests/test_fit.py's: the printed line, the
fit's log lines, every probe's compute buffers and KV, and the real run's buffers and device use."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from toolkit.fit.cases import fit_case

DATA = Path(__file__).resolve().parent / "data"
FIT_CASES = {c["id"]: c for c in json.loads((DATA / "fit-cases-gemma4.json").read_text())}
TOOK = re.compile(r"took [\d.]+ seconds")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def _mask(lines: list[str]) -> list[str]:
    return [TOOK.sub("took N seconds", line) for line in lines]


def test_cases_present() -> None:
    assert len(FIT_CASES) == 16 and all(c["model"]["arch"] == "gemma4" for c in FIT_CASES.values())


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
        assert sum(x["bytes"] for x in g["context"]) == sum(k["size_k_bytes"] + k["size_v_bytes"] for k in w["kv"])
    obs, real = c["run"]["observed"], got["real"]
    assert real["compute_buffers_bytes"] == obs["compute_buffers_bytes"]
    assert real["context_buffers_bytes"] == obs["kv_buffers_bytes"]
    assert real["model_buffers_bytes"] == obs["model_buffers_bytes"]
    for d, chk in zip(real["devices"], c["run"]["device_check"]):
        assert d["real"]["total"] == chk["used_bytes"]
        assert (d["fits"], d["keeps_margin"]) == (chk["fits_limit"], chk["fits_limit_minus_margin"])


def test_the_two_server_override_names_a_block_that_does_not_exist() -> None:
    """On two servers llama-fit-params prints ``-ot "blk\\.6\\.ffn_down.*=RPC0[...]"`` for the 6-layer MoE
    model: block 6 is the output layer's index (n_layer), which has no ffn_down, so the override matches no
    tensor and has no effect (the run places nothing by it)."""
    from toolkit.models import archs
    from toolkit.models.hparams import HParams

    for cid in ("fit-tiny_gemma4moe_f32-rpc2-1230_1230-default", "fit-tiny_gemma4moe_f32-rpc2-1144_1144-default"):
        c = FIT_CASES[cid]
        assert _fitted(cid)["printed"] == c["fit"]["printed"]
        assert '-ot "blk\\.6\\.ffn_down.*=RPC0[127.0.0.1:50063]"' in c["fit"]["printed"]
        hp = HParams.from_dict(c["model"])
        assert hp.n_layer == 6
        assert not [w.name for w in archs.get(hp.arch).weights(hp) if re.search(r"blk\.6\.ffn_down.*", w.name)]
