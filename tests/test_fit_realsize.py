"""Memory fitting on real-size shapes (tests/data/realsize-fit-cases.json): ``llama-fit-params`` on sparse
GGUFs of the Llama-3.1-8B and Qwen3-30B-A3B shapes (Q8_0 matrices, F32 norms, a 32000-token vocabulary)
against one or two RPC servers. The toolkit prints the same line, logs the same fit and measures every
probe as llama.cpp did: the pp-only compute buffers, the KV cache and the copies.

The cases describe each model by the generator's recipe (:func:`toolkit.fit.cases.model_description`
reads it); :mod:`tests.test_gguf_write` writes the same files and fits one of them from the file itself.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from fit_checks import load_fit_cases, mask

from toolkit.fit.cases import fit_case

CASES = load_fit_cases("realsize-fit-cases.json")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(CASES[cid], real=False)


def test_the_cases_cover_both_shapes_and_every_kind_of_answer() -> None:
    ids = list(CASES)
    assert len(ids) == 18
    assert {CASES[i]["model"]["arch"] for i in ids} == {"llama", "qwen3moe"}
    printed = [CASES[i]["fit"]["printed"] for i in ids]
    assert any("-ot" in p for p in printed) and any("-ts" in p for p in printed) and "" in printed


@pytest.mark.parametrize("cid", list(CASES))
def test_printed_line_and_log(cid: str) -> None:
    c, got = CASES[cid], _fitted(cid)
    assert got["printed"] == c["fit"]["printed"]
    assert mask(got["log_lines"]) == mask(c["fit"]["fit_log_lines"])


@pytest.mark.parametrize("cid", list(CASES))
def test_every_probe(cid: str) -> None:
    want, got = CASES[cid]["fit"]["probes"], _fitted(cid)["probes"]
    assert len(got) == len(want) == CASES[cid]["fit"]["n_probes"]
    for g, w in zip(got, want):
        assert {x["buft"]: x["bytes"] for x in g["compute_buffer"]} == {x["buft"]: x["bytes"] for x in
                                                                        w["compute_buffer"]}
        assert sum(x["bytes"] for x in g["context"]) == sum(k["size_k_bytes"] + k["size_v_bytes"] for k in w["kv"])
        assert g["n_copies"] == w["summary"]["n_copies"]
