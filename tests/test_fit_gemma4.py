"""toolkit.fit for Gemma 4 against the third oracle's fit cases (tests/data/fit-cases-gemma4.json):
llama-fit-params on the tiny dense and MoE models with one or two memory-limited RPC servers, then
llama-completion with the printed line. The checks are tests/test_fit.py's: the printed line, the
fit's log lines, every probe's compute buffers and KV, and the real run's buffers and device use."""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import pytest
from fit_checks import check_fit_case, load_fit_cases

from toolkit.fit.cases import fit_case

FIT_CASES = load_fit_cases("fit-cases-gemma4.json")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def test_cases_present() -> None:
    assert len(FIT_CASES) == 16 and all(c["model"]["arch"] == "gemma4" for c in FIT_CASES.values())


@pytest.mark.parametrize("cid", list(FIT_CASES))
def test_fit_case(cid: str) -> None:
    check_fit_case(FIT_CASES[cid], _fitted(cid))


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
