"""toolkit.fit for gpt-oss against the third oracle's fit cases (tests/data/fit-cases-gptoss.json):
llama-fit-params on the tiny MXFP4 model with one or two memory-limited RPC servers, then
llama-completion with the printed line. The checks are tests/test_fit.py's: the printed line, the
fit's log lines, every probe's compute buffers and KV, and the real run's buffers and device use."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from fit_checks import check_fit_case, load_fit_cases

from toolkit.fit.cases import fit_case

FIT_CASES = load_fit_cases("fit-cases-gptoss.json")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def test_cases_present() -> None:
    assert len(FIT_CASES) == 7 and all(c["model"]["arch"] == "gpt-oss" for c in FIT_CASES.values())


@pytest.mark.parametrize("cid", list(FIT_CASES))
def test_fit_case(cid: str) -> None:
    check_fit_case(FIT_CASES[cid], _fitted(cid))
