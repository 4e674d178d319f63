"""toolkit.fit for gpt-oss against the third oracle's fit cases (tests/data/fit-cases-gptoss.json):
llama-fit-params on the tiny MXFP4 model with one or two memory-limited RPC servers, then
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
FIT_CASES = {c["id"]: c for c in json.loads((DATA / "fit-cases-gptoss.json").read_text())}
TOOK = re.compile(r"took [\d.]+ seconds")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def _mask(lines: list[str]) -> list[str]:
    return [TOOK.sub("took N seconds", line) for line in lines]


def test_cases_present() -> None:
    assert len(FIT_CASES) == 7 and all(c["model"]["arch"] == "gpt-oss" for c in FIT_CASES.values())


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
