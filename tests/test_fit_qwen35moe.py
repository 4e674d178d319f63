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

from collections import Counter
from functools import cache
from typing import Any

import pytest
from fit_checks import check_fit_case, load_fit_cases

from toolkit.fit.cases import fit_case

FIT_CASES = load_fit_cases("fit-cases-qwen35moe.json")


@cache
def _fitted(cid: str) -> dict[str, Any]:
    return fit_case(FIT_CASES[cid])


def test_cases_present() -> None:
    assert Counter(c["model"]["name"] for c in FIT_CASES.values()) == {"tiny_qwen35moe_f32": 9,
                                                                       "tiny_qwen35moe_mtp_f32": 7}


@pytest.mark.parametrize("cid", list(FIT_CASES))
def test_fit_case(cid: str) -> None:
    check_fit_case(FIT_CASES[cid], _fitted(cid))


def test_the_mtp_block_moves_the_two_server_split() -> None:
    """The same two 1346 MiB servers: 7 + 2 of the plain model's 9 (8 layers + output), 6 + 3 with the MTP block."""
    plain = _fitted("fit-tiny_qwen35moe_f32-rpc2-1346_1346-default")["printed"]
    mtp = _fitted("fit-tiny_qwen35moe_mtp_f32-rpc2-1346_1346-default")["printed"]
    assert (plain, mtp) == ("-c 204544 -ngl 9 -ts 7,2", "-c 204544 -ngl 9 -ts 6,3")
