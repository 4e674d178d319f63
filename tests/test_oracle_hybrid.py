"""The hybrids against llama.cpp: Qwen3.5 / Qwen3.6 (``qwen35``, ``qwen35moe``) and LFM2 (``lfm2``), the third
oracle's tiny models (28 + 31 + 7 + 28 cases), every field compared, the recurrent state's bytes included.

The cases (tests/data/cases-qwen35.json) were printed by llama.cpp 3f545be for ``tiny_qwen35_f32`` and
``tiny_qwen35moe_f32`` (8 layers, full attention at 3 and 7, the others a gated delta net with conv 4, state
32, 2 groups, 4 V heads; heads 4/2 of 64, IMROPE over 16 dimensions; qwen35moe: 8 experts, 2 used, and a
sigmoid-gated shared expert). ``tiny_qwen35moe_mtp_f32`` is the same trunk plus the NextN/MTP block the
converter appends (``block_count`` 9, ``nextn_predict_layers`` 1), run without MTP: the block's 20 tensors are
skipped (logged as unused), it takes a place in ``-ngl`` and holds no KV, state or weight. As for gpt-oss, the
recorded command lines named the RPC servers 127.0.0.1:50062/50063 while every log line of the same runs shows
127.0.0.1:50052/50053; the cases file carries the ports of the log lines. ``tiny_lfm2_f32``: 6 layers,
attention at 2 and 5 (head_count_kv 0 on the others, short convolutions with l_cache 3), heads 4/2, QK norms,
tied output. The debug dumps of thirteen of these cases are compared node by node in tests/test_oracle.py.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from oracle_cases import hybrid_cases

from toolkit.cases import context_from_case, plan_case
from toolkit.models import archs

FIELDS = ("graph_nodes", "graph_nodes_tg", "graph_splits", "graph_splits_tg", "compute_buffers_bytes", "kv_bytes",
          "kv_buffers_bytes", "model_buffers_bytes", "output_buffer_bytes", "n_copies", "pipeline_parallel",
          "max_nodes", "n_tensors", "n_backends", "flash_attn_effective", "warnings", "rs_buffers_bytes", "rs_bytes",
          "rs", "rs_layer_devices")
# llama.cpp aborts after the reserve on two RPC servers at -ngl 99 (the oracle's finding: the RPC server fails
# to create graph node 6); every reserve number of those runs is real
ABORTED = "rpc2-lfm2-ngl99-"
KV_FIELDS = ("cache", "cells", "layers", "n_stream", "size_k_bytes", "size_v_bytes", "buffers")
OVERRIDE_FIELDS = ("tensor", "type", "buft", "bytes")
CASES = {c["id"]: c for c in hybrid_cases()}


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(CASES[case_id])


def test_cases_present() -> None:
    assert Counter(c["arch_key"] for c in CASES.values()) == {"qwen35": 28, "qwen35moe": 31, "qwen35moe_mtp": 7,
                                                              "lfm2": 28}


@pytest.mark.parametrize("case_id", list(CASES))
def test_case(case_id: str) -> None:
    """Graph nodes and splits (pp, tg), every compute buffer (zero-sized ones too), KV bytes per cache and
    per buffer, the recurrent state's bytes per buffer and its layers' devices, model and output buffers,
    n_copies, the pipeline flag, max_nodes, n_tensors, layer placement and the tensor overrides."""
    obs = CASES[case_id]["observed"]
    assert (obs["rc"] != 0) == case_id.startswith(ABORTED)
    got = _planned(case_id)
    assert "error" not in got, got.get("error")
    for f in FIELDS:
        assert got[f] == obs[f], (f, got[f], obs[f])
    assert [list(x) for x in got["layer_devices"]] == [list(x)[:2] for x in obs["layer_devices"]]
    assert got["kv_caches"] == [{k: kc[k] for k in KV_FIELDS} for kc in obs["kv_caches"]]
    assert got["tensor_overrides"] == [{k: o[k] for k in OVERRIDE_FIELDS} for o in obs["tensor_overrides"]]


def test_recurrent_state_grows_with_sequences_not_context() -> None:
    """6 recurrent layers x (768 + 4096) F32 values per sequence: 116736 bytes at -np 1 and twice that at
    -np 2, whatever n_ctx (llama.cpp's RS lines; the -np 4 case is not in this share)."""
    by_np: dict[int, set[int]] = {}
    for c in CASES.values():
        if c["arch_key"] == "qwen35moe" and c["id"].startswith("cpu-"):
            by_np.setdefault(c["cparams"]["n_seq_max"], set()).add(_planned(c["id"])["rs_bytes"])
    assert by_np == {1: {116736}, 2: {233472}}


def test_rs_group_in_the_events() -> None:
    """The recurrent state is a memory group of its own ("RS") beside "KV" in the reserve events."""
    ev = context_from_case(CASES["cpu-qwen35moe-c1024-b2048-ub512-faon"]).events[-1]
    assert ev.memory["RS"] == {"CPU": 116736}
    assert ev.memory["KV"] == {"CPU": 1048576}


def test_registered() -> None:
    assert {"qwen35", "qwen35moe"} <= set(archs.names())
    assert archs.get("qwen35moe").rope_type == 40


def test_the_mtp_block_is_skipped_and_still_counts_for_ngl() -> None:
    """llama.cpp warns once per tensor of the NextN/MTP block (``TENSOR_SKIP``) and counts 149 tensors, as for
    the model without it; ``-ngl 2`` offloads block 8 and the output layer, and only ``output.weight`` lands on
    the server (16384512 bytes), the KV cache staying on the CPU."""
    cid = "rpc1-qwen35moe_mtp-ngl2-oo1-c1024-b2048-ub512-faon"
    got, obs = _planned(cid), CASES[cid]["observed"]
    unused = [w for w in got["warnings"] if w.startswith("model has unused tensor blk.8.")]
    assert len(unused) == 20 and unused == obs["warnings"]
    assert got["n_tensors"] == obs["n_tensors"] == 149
    assert [list(x) for x in got["layer_devices"]][-3:] == [[7, "CPU"], [8, "RPC0"], [9, "RPC0"]]
    assert got["model_buffers_bytes"]["RPC0[127.0.0.1:50052]"] == 16384512
    ctx = context_from_case(CASES[cid])
    assert not [n for n in ctx.setup.model.tensors if n.startswith("blk.8.")]
    plain = _planned("rpc1-qwen35moe-ngl0-oo1-c1024-b2048-ub512-faon")
    assert _planned("rpc1-qwen35moe_mtp-ngl0-oo1-c1024-b2048-ub512-faon")["kv_caches"] == plain["kv_caches"]
    assert _planned("rpc1-qwen35moe_mtp-ngl0-oo1-c1024-b2048-ub512-faon")["rs"] == plain["rs"]


def test_lfm2_state_has_no_s_part() -> None:
    """LFM2's short convolution keeps ``n_embd * (l_cache - 1)`` = 256 values per layer and sequence and a
    zero-sized S state: 4 layers x 1024 bytes at -np 1."""
    got = _planned("cpu-lfm2-c4096-b2048-ub512-faon")
    assert got["rs"]["n_embd_r"] == 256 and got["rs"]["n_embd_s"] == 0 and got["rs_bytes"] == 4096


def test_lfm2_two_servers_have_five_splits() -> None:
    """build_rs expands layer 4's state ops (on the second server) before layer 3's own nodes (on the first),
    so llama.cpp's scheduler cuts two more splits: 5, not 3."""
    assert _planned("rpc2-lfm2-ngl99-sm_layer-ts1_1-c1024-b2048-ub512-faon")["graph_splits"] == 5


def test_a_gguf_with_an_mtp_block_reads_back(tmp_path: Path) -> None:
    """A file written with the MTP block (block_count 9, nextn_predict_layers 1, the block's 20 tensors: a
    full-attention MoE block plus nextn.eh_proj / enorm / hnorm / shared_head_norm, make_gguf3's list) reads
    back as the same hyperparameters, 169 tensors in the file, and plans as the measured case."""
    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models.gguf import hparams_from_gguf
    from toolkit.models.gguf_file import open_gguf
    from toolkit.models.hparams import HParams

    c = CASES["cpu-qwen35moe_mtp-c1024-b2048-ub512-faoff"]
    hp = HParams.from_dict(c["model"])
    assert (hp.n_layer, hp.n_layer_all, hp.n_layer_nextn) == (8, 9, 1)
    path = tmp_path / "mtp.gguf"
    write_gguf(path, hp)
    f = open_gguf(path)
    assert len(f.tensors) == c["model"]["n_tensors_in_file"] == 169
    assert sorted(n for n in f.tensors if n.startswith("blk.8.nextn.")) == [
        "blk.8.nextn.eh_proj.weight", "blk.8.nextn.enorm.weight", "blk.8.nextn.hnorm.weight",
        "blk.8.nextn.shared_head_norm.weight"]
    back = hparams_from_gguf(f)
    assert (back.n_layer, back.n_layer_all) == (8, 9)
    assert back.recurrent == hp.recurrent and not back.is_recr(8)
    got = plan_case({**c, "model": {**back.to_dict(), "name": c["model"]["name"]}})
    assert (got["n_tensors"], got["warnings"]) == (149, c["observed"]["warnings"])
