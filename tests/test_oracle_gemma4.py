"""Gemma 4 (``LLM_ARCH_GEMMA4``) against llama.cpp: the third oracle's two tiny models, every field compared.

The cases (tests/data/cases-gemma4.json) were printed by llama.cpp 3f545be for ``tiny_gemma4_f32`` (28 cases:
the Gemma-4-31B structure, 6 layers with the window pattern [T,T,T,T,T,F]; SWA layers with heads of 32 and 2
KV heads, the full layer with heads of 64, 1 KV head and no ``attn_v`` (V = K); ``rope_freqs`` on the full
layer, the layer output scale, a final logit softcap of 30, tied output) and ``tiny_gemma4moe_f32`` (31 cases:
the 26B-A4B structure, the same plus on every layer a routed MoE of 8 experts, 2 used, beside the dense MLP,
with a router scale, merged ``ffn_gate_up_exps`` and a per-expert ``ffn_down_exps.scale``). The model dicts
carry the hyperparameters llama.cpp's print_info lists for the oracle's recipe; the recorded command lines
name the RPC servers 127.0.0.1:50062/50063 while every log line shows 50052/50053, and the cases file carries
the ports of the log lines.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import gguf
import pytest
from oracle_cases import assert_planned_matches, gemma4_cases, graph_only_sizes

from toolkit.cases import context_from_case, plan_case
from toolkit.models import archs
from toolkit.models.gguf import hparams_from_gguf
from toolkit.models.hparams import HParams

OVERRIDE_FIELDS = ("tensor", "type", "buft", "bytes")
CASES = {c["id"]: c for c in gemma4_cases()}
IDS = list(CASES)


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(CASES[case_id])


def test_cases_present() -> None:
    assert Counter(c["arch_key"] for c in CASES.values()) == {"gemma4": 28, "gemma4moe": 31}
    assert all(c["model"]["arch"] == "gemma4" for c in CASES.values())


@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id: str) -> None:
    """Graph nodes and splits (pp, tg), every compute buffer (zero-sized ones too), KV bytes per cache
    and per buffer, model and output buffers, n_copies, the pipeline flag, max_nodes, n_tensors,
    layer placement and the tensor overrides in llama.cpp's order."""
    obs = CASES[case_id]["observed"]
    got = _planned(case_id)
    assert_planned_matches(got, obs)
    assert got["tensor_overrides"] == [{k: o[k] for k in OVERRIDE_FIELDS} for o in obs["tensor_overrides"]]


@pytest.mark.parametrize("case_id", IDS)
def test_each_graph_alone(case_id: str) -> None:
    """What each graph needs on its own (the oracle's ``graph_only_alloc_bytes``), measured as the oracle's
    patch measures it: ``ggml_backend_sched_reserve_size`` after the reserves drops the callback's pins, so on
    two servers with flash attention the second server's graph alone needs less than after the reserves."""
    c = CASES[case_id]
    only = {(g["graph"], g["backend"]): g["bytes"] for g in c["observed"]["graph_only_alloc_bytes"]}
    assert graph_only_sizes(context_from_case(c)) == only


def test_per_layer_head_geometry_sizes_the_kv() -> None:
    """The full layer: 1 KV head of 64 (K and V = K both stored); the SWA layers: 2 heads of 32, at 768 cells
    (min(n_ctx, 128 + 512) padded to 256)."""
    kv = {k["cache"]: k for k in _planned("cpu-gemma4-c1024-b2048-ub512-faoff")["kv_caches"]}
    assert kv["non-SWA"]["size_k_bytes"] == kv["non-SWA"]["size_v_bytes"] == 1 * 1 * 64 * 1024 * 2
    assert kv["SWA"]["size_k_bytes"] == kv["SWA"]["size_v_bytes"] == 5 * 2 * 32 * 768 * 2


def test_the_tied_output_is_its_own_tensor() -> None:
    """``load_arch_tensors`` creates the output (``token_embd`` with TENSOR_DUPLICATED) before ``token_embd``,
    so nothing is reused: 86 tensors in the file, 87 created, also with everything on the CPU."""
    assert _planned("cpu-gemma4-c256-b2048-ub512-faon")["n_tensors"] == 87


def test_full_layers_read_rope_freqs_and_have_no_attn_v() -> None:
    hp = HParams.from_dict(CASES["cpu-gemma4-c256-b2048-ub512-faon"]["model"])
    names = [w.name for w in archs.get("gemma4").weights(hp)]
    assert "blk.5.attn_v.weight" not in names and "blk.4.attn_v.weight" in names
    assert names.index("rope_freqs.weight") == names.index("blk.5.layer_output_scale.weight") + 1
    assert [hp.n_rot_at(il) for il in range(6)] == [32] * 5 + [64]
    ctx = context_from_case(CASES["cpu-gemma4-c256-b2048-ub512-faon"])
    ropes = [n for n in ctx.setup.build_graph(256, 1, 1, 1).graph.nodes if n.op.value == "ROPE"]
    assert [(n.src[2].name if len(n.src) > 2 and n.src[2] is not None else None) for n in ropes] == \
        [None] * 10 + ["rope_freqs.weight"] * 2


def test_kv_sharing_reads_an_earlier_layers_cache() -> None:
    """``layer_reuse_cb``: with 2 shared layers of 6, layers 4 (SWA) and 5 (full) read the caches of layers 2
    (``n_layer_kv_from_start - 2``) and 3 (``- 1``); the caches hold 4 layers. No measured case pins this
    (the oracle's models share nothing)."""
    import dataclasses

    from toolkit.models.memory import layer_reuse

    hp = HParams.from_dict(CASES["cpu-gemma4-c256-b2048-ub512-faon"]["model"])
    sw = dataclasses.replace(hp.swa, layers=(True, True, True, False, True, False))  # type: ignore[arg-type]
    shared = dataclasses.replace(hp, swa=sw, n_kv_shared=2)
    assert layer_reuse(shared) == {4: 2, 5: 3}
    assert not shared.has_kv(4) and shared.has_kv(3)
    names = [w.name for w in archs.get("gemma4").weights(shared)]
    assert "blk.4.attn_k.weight" not in names and "blk.3.attn_k.weight" in names


def test_registered() -> None:
    assert "gemma4" in archs.names()
    assert archs.get("gemma4").rope_type == archs.ROPE_TYPE_NEOX


@pytest.mark.parametrize("arch_key", ["gemma4", "gemma4moe"])
def test_a_gguf_file_reads_back_the_same_model(tmp_path: Path, arch_key: str) -> None:
    """llama_model_gemma4::load_arch_hparams through the toolkit's reader: the per-layer sliding-window
    flags, the SWA head sizes, shared KV layers, per-layer embeddings and the softcap come back from a
    GGUF written by the gguf package; a full layer without attn_v reads as V = K."""
    from toolkit.jaxrt.gguf_io import write_gguf

    case = next(c for c in CASES.values() if c["arch_key"] == arch_key)
    hp = HParams.from_dict(case["model"])
    path = tmp_path / "m.gguf"
    write_gguf(path, hp)
    back = hparams_from_gguf(path)
    assert back == replace(hp, name=back.name)
    assert back.swa is not None and back.swa.layers == hp.swa.layers and not back.attn_v_full
    r = gguf.GGUFReader(str(path))
    assert list(r.fields["gemma4.attention.sliding_window_pattern"].contents()) == list(hp.swa.layers)


def test_merged_gate_up_experts_are_read_only_for_an_architecture_that_builds_them() -> None:
    from toolkit.errors import UnsupportedFeature
    from toolkit.models import moe

    keys = {"llama.expert_count": 4, "llama.expert_used_count": 2}
    names = ["blk.0.ffn_gate_up_exps.weight", "blk.0.ffn_down_exps.weight"]
    with pytest.raises(UnsupportedFeature, match="merged gate/up experts"):
        moe.from_gguf(keys.get, "llama", names)
    p = moe.from_gguf(keys.get, "llama", names, archs.get("gemma4").moe_tensors)
    assert p is not None and (p.n_expert, p.n_expert_used) == (4, 2)
