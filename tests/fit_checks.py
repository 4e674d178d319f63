"""The checks of a fit case against llama-fit-params and the real run that followed it (the third oracle's
fit cases, tests/data/fit-cases-*.json): the printed line, the fitted values, the fit's log lines (times
masked), every probe's compute buffers and context (KV, plus the recurrent state of a hybrid), the real
run's buffers and each device's use against its limit and margin."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
TOOK = re.compile(r"took [\d.]+ seconds")


def load_fit_cases(name: str) -> dict[str, dict[str, Any]]:
    """The cases of tests/data/<name>, by id."""
    return {c["id"]: c for c in json.loads((DATA / name).read_text())}


def mask(lines: list[str]) -> list[str]:
    return [TOOK.sub("took N seconds", line) for line in lines]


def check_fit_case(c: dict[str, Any], got: dict[str, Any]) -> None:
    """``got`` (toolkit.fit.cases.fit_case of c) against what llama.cpp printed and used."""
    assert "error" not in got, got.get("error")
    assert got["printed"] == c["fit"]["printed"]
    assert got["fitted"] == c["fit"]["fitted"]
    assert mask(got["log_lines"]) == mask(c["fit"]["fit_log_lines"])
    obs, real = c["run"]["observed"], got["real"]
    # a hybrid's context is its KV cache and its recurrent state: the probes record the KV cache only, the
    # state's bytes (set by n_seq_max alone) are the real run's
    rs = obs.get("rs_bytes", 0)
    assert len(got["probes"]) == len(c["fit"]["probes"])
    for g, w in zip(got["probes"], c["fit"]["probes"]):
        assert {x["buft"]: x["bytes"] for x in g["compute_buffer"]} == {x["buft"]: x["bytes"] for x in
                                                                        w["compute_buffer"]}
        assert sum(x["bytes"] for x in g["context"]) == sum(k["size_k_bytes"] + k["size_v_bytes"]
                                                            for k in w["kv"]) + rs
    assert real["compute_buffers_bytes"] == obs["compute_buffers_bytes"]
    assert real["context_buffers_bytes"] == dict(Counter(obs["kv_buffers_bytes"])
                                                 + Counter(obs.get("rs_buffers_bytes", {})))
    assert real["model_buffers_bytes"] == obs["model_buffers_bytes"]
    for d, chk in zip(real["devices"], c["run"]["device_check"]):
        assert d["real"]["total"] == chk["used_bytes"]
        assert (d["fits"], d["keeps_margin"]) == (chk["fits_limit"], chk["fits_limit_minus_margin"])
