"""deepseek2 (``LLM_ARCH_DEEPSEEK2``: MLA) and glm4moe (``LLM_ARCH_GLM4_MOE``) against llama.cpp: the third
oracle's tiny models (29 and 32 cases), every field compared.

The cases (tests/data/cases-deepseek2.json, cases-glm4moe.json) were printed by llama.cpp 3f545be for
the oracle's ``tiny_deepseek2_f32`` (4 layers, 1 dense leading layer, MLA with q_lora 64, kv_lora 64,
rope 16, nope 32, v_head 32, split ``attn_k_b``/``attn_v_b``, 4 heads and 1 KV head, 8 experts with 2
used, 1 shared, sigmoid gating with ``exp_probs_b``, weights norm and scale 2.5, 4 expert groups with
2 used, YaRN factor 4) and ``tiny_glm4moe_f32`` (4 layers plus 1 NextN block, 1 dense leading layer,
heads 4/2 of 64, partial RoPE 32, Q/K/V biases, 8 experts with 2 used, 1 shared, sigmoid +
``exp_probs_b``). As in cases-gptoss.json, the command lines' RPC ports (50062/50063) are replaced by the
ports every log line shows (50052/50053). The debug dumps of six of these cases are compared node by
node in tests/test_oracle.py.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import pytest
from oracle_cases import assert_planned_matches, graph_only_sizes, mla_cases

from toolkit.cases import context_from_case, plan_case
from toolkit.models import archs

OVERRIDE_FIELDS = ("tensor", "type", "buft", "bytes")
CASES = {c["id"]: c for c in mla_cases()}
IDS = list(CASES)


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(CASES[case_id])


def test_cases_present() -> None:
    assert Counter(c["model"]["arch"] for c in CASES.values()) == {"deepseek2": 29, "glm4moe": 32}


@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id: str) -> None:
    """Graph nodes and splits (pp, tg), every compute buffer, KV bytes per cache and per buffer (MLA: V 0
    bytes), model and output buffers, n_copies, the pipeline flag, max_nodes, n_tensors, the warnings
    (YaRN's factor, the mmap warning only when an override moved a tensor), layer placement, overrides, the
    model buffers as load_tensors prints them."""
    obs = CASES[case_id]["observed"]
    got = _planned(case_id)
    assert_planned_matches(got, obs)
    assert got["tensor_overrides"] == [{k: o[k] for k in OVERRIDE_FIELDS} for o in obs["tensor_overrides"]]
    assert [list(x) for x in got["model_buffer_lines"]] == [[b["buffer"], b["bytes"]] for b in obs["model_buffers"]]
    assert obs["errors"] == []


@pytest.mark.parametrize("case_id", IDS)
def test_each_graph_alone(case_id: str) -> None:
    """What each graph needs on its own (the oracle's ``graph_only_alloc_bytes``), measured as the oracle
    measures it: ``ggml_backend_sched_reserve_size`` drops the callback's pins, so on two servers with every
    layer offloaded the first layer of the second server reads ``norm-<il>`` from the first server and the
    second server needs 1600 (deepseek2) or 1632 (glm4moe) bytes per token more than after the reserves."""
    c = CASES[case_id]
    only = {(g["graph"], g["backend"]): g["bytes"] for g in c["observed"]["graph_only_alloc_bytes"]}
    assert graph_only_sizes(context_from_case(c)) == only


def test_mla_cache_is_k_only() -> None:
    """``has_v = !is_mla``: one K tensor per layer of kv_lora_rank + n_rot = 80 F16 values per cell and one
    head, no V tensor (655360 bytes over 4 layers at 1024 cells), fa on and off."""
    for fa in ("on", "off"):
        ctx = context_from_case(CASES[f"cpu-deepseek2-c1024-b2048-ub512-fa{fa}"])
        (kv,) = ctx.setup.memory.caches
        assert not kv.has_v and [t.ne for t in kv.tensors] == [(80, 1024, 1, 1)] * 4
        assert kv.k_bytes == 4 * 80 * 1024 * 2 == 655360 and kv.v_bytes == 0


def test_v_mla_decompresses_after_the_attention() -> None:
    """With flash attention ``wv_b`` multiplies FLASH_ATTN_EXT's permuted result (``fattn_mla``); without,
    the KQV product (``kqv_mla``); V is a view of the cached K in both."""
    for fa, name in (("on", "fattn_mla"), ("off", "kqv_mla")):
        ctx = context_from_case(CASES[f"cpu-deepseek2-c1024-b2048-ub512-fa{fa}"])
        g = ctx.setup.build_graph(8192, 4, 1, 4).graph
        mla = [n for n in g.nodes if n.name in {f"{name}-{il}" for il in range(4)}]
        assert [n.src[0].name for n in mla] == [f"blk.{il}.attn_v_b.weight" for il in range(4)]
        assert not any(n.name.startswith("cache_v") for n in g.nodes)


def test_expert_groups_add_their_nodes() -> None:
    """Group-limited routing (4 groups, 2 used): ARGSORT top 2 per group, GET_ROWS, SUM_ROWS, ARGSORT of the
    group scores (``ffn_moe_group_topk``), GET_ROWS, FILL of -inf, SET_ROWS: 7 nodes more per MoE layer than
    without groups; the dense leading layer has none."""
    ctx = context_from_case(CASES["cpu-deepseek2-c1024-b2048-ub512-faon"])
    g = ctx.setup.build_graph(8192, 4, 1, 4).graph
    assert sum(n.op.value == "FILL" for n in g.nodes) == 3
    masked = [n for n in g.nodes if n.name.startswith("ffn_moe_probs_masked-")]
    assert [n.name for n in masked] == [f"ffn_moe_probs_masked-{il}" for il in (1, 2, 3)]


def test_glm4moe_nextn_block_counts_for_placement_and_the_cache_only() -> None:
    """The NextN block (blk.4) is TENSOR_SKIP (not loaded, 21 'unused tensor' warnings) and not in the graph,
    but ``-ngl 2`` offloads it with the output layer and its KV cache share lands on that device."""
    got = _planned("rpc1-glm4moe-ngl2-oo0-c1024-b2048-ub512-faon")
    assert got["kv_caches"][0]["layers"] == 5
    assert sum("unused tensor blk.4." in w for w in got["warnings"]) == 21
    ctx = context_from_case(CASES["rpc1-glm4moe-ngl2-oo0-c1024-b2048-ub512-faon"])
    assert not any(n.name.endswith("-4") for n in ctx.setup.build_graph(8192, 4, 1, 4).graph.nodes)


def test_registered() -> None:
    assert {"deepseek2", "glm4moe"} <= set(archs.names())
    assert archs.get("deepseek2").rope_type == archs.ROPE_TYPE_NORM
    assert archs.get("glm4moe").rope_type == archs.ROPE_TYPE_NEOX


# ---- the GGUF reader ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny_deepseek2", "tiny_glm4moe"])
def test_a_written_gguf_reads_back_as_the_preset(name: str, tmp_path: Any) -> None:
    """``load_arch_hparams`` over the keys ``gguf_keys`` writes: MLA's sizes, the routing (sigmoid, the
    selection bias, groups, norm, scale, dense lead, shared experts), YaRN (deepseek2's log multiplier
    written as the converter's 0.1, read as 1) and the NextN block."""
    import dataclasses

    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models import presets
    from toolkit.models.gguf import hparams_from_gguf

    want = dataclasses.replace(presets.get(name), n_vocab=64)
    path = tmp_path / "m.gguf"
    write_gguf(path, want, seed=1)
    got = hparams_from_gguf(str(path))
    for f in ("arch", "n_layer", "n_layer_nextn", "moe", "mla", "rope_scaling", "qk_norm", "n_embd_head_k",
              "n_embd_head_v", "n_rot"):
        assert getattr(got, f) == getattr(want, f), f


def test_what_load_arch_tensors_refuses(tmp_path: Any) -> None:
    """A deepseek2 file without the MLA head sizes (the legacy attn_kv_b layout) and a glm4moe file with
    M-RoPE sections are refused by name; so are MLA sizes that do not give the cached head."""
    import dataclasses

    import gguf
    import numpy as np

    from toolkit.errors import ToolkitError, UnsupportedFeature
    from toolkit.models import presets
    from toolkit.models.gguf import hparams_from_gguf

    for arch, key, feature in (("deepseek2", "block_count", "deepseek2 without MLA"),
                               ("glm4moe", "rope.dimension_sections", "glm4moe M-RoPE")):
        w = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
        for k, v in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 128),
                     ("attention.head_count", 4), ("expert_count", 4), ("expert_used_count", 2),
                     ("expert_feed_forward_length", 32), ("attention.kv_lora_rank", 32)):
            w.add_uint32(f"{arch}.{k}", v)
        if key == "rope.dimension_sections":
            w.add_array(f"{arch}.{key}", [8, 8, 0, 0])
        w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(UnsupportedFeature) as e:
            hparams_from_gguf(str(tmp_path / f"{arch}.gguf"))
        assert e.value.feature == feature
    bad = dataclasses.replace(presets.get("tiny_deepseek2"), n_embd_head_k_=64)
    with pytest.raises(ToolkitError, match="kv_lora_rank \\+ n_rot = 80"):
        archs.checked(bad)
