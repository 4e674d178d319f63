"""gpt-oss (``LLM_ARCH_OPENAI_MOE``) against llama.cpp: the third oracle's tiny model with MXFP4
experts (33 cases) and its F32 variant (5 cases), every field compared.

The cases (tests/data/cases-gptoss.json) were printed by llama.cpp 3f545be for the oracle's
``tiny_gptoss_mxfp4`` / ``tiny_gptoss_f32`` (4 layers, iSWA window 128 with period 2, heads 4/2 of 64,
attention sinks, biases on Q/K/V/O, the router and the experts, 8 experts with 4 used, YaRN). The
recorded command lines name the RPC servers 127.0.0.1:50062/50063 while every log line of the same
runs (and the debug dumps' ``# cmd``) shows the buffers of 127.0.0.1:50052/50053; the cases file
carries the ports of the log lines. The debug dumps of three of these cases are compared node by
node in tests/test_oracle.py.
"""

from __future__ import annotations

from collections import Counter
from functools import cache
from typing import Any

import pytest
from oracle_cases import assert_planned_matches, gptoss_cases, graph_only_sizes

from toolkit.cases import context_from_case, plan_case
from toolkit.models import archs

OVERRIDE_FIELDS = ("tensor", "type", "buft", "bytes")
CASES = {c["id"]: c for c in gptoss_cases()}
IDS = list(CASES)


@cache
def _planned(case_id: str) -> dict[str, Any]:
    return plan_case(CASES[case_id])


def test_cases_present() -> None:
    assert Counter(c["arch_key"] for c in CASES.values()) == {"gptoss": 33, "gptoss_f32": 5}
    assert all(c["model"]["arch"] == "gpt-oss" for c in CASES.values())


@pytest.mark.parametrize("case_id", IDS)
def test_case(case_id: str) -> None:
    """Graph nodes and splits (pp, tg), every compute buffer (zero-sized ones too), KV bytes per cache
    and per buffer, model and output buffers, n_copies, the pipeline flag, max_nodes, n_tensors,
    layer placement and the tensor overrides."""
    obs = CASES[case_id]["observed"]
    got = _planned(case_id)
    assert_planned_matches(got, obs)
    assert got["tensor_overrides"] == [{k: o[k] for k in OVERRIDE_FIELDS} for o in obs["tensor_overrides"]]


def test_mxfp4_experts_go_to_cpu_repack() -> None:
    """``ggml_repack_get_optimal_repack_type`` takes MXFP4 with AVX2 when ne[1] % 8 == 0: on the CPU every
    expert is in CPU_REPACK (4 layers x 3 x 8 experts x 128 x 128 x 17/32 bytes), the rest memory-mapped;
    the F32 variant has no repack buffer."""
    mx = _planned("cpu-gptoss-c1024-b2048-ub512-faon")["model_buffers_bytes"]
    assert mx["CPU_REPACK"] == 4 * 3 * 8 * 128 * 128 * 17 // 32 == 835584
    assert "CPU_REPACK" not in _planned("cpu-gptoss_f32-c1024-b2048-ub512-faon")["model_buffers_bytes"]


def test_expert_overrides_take_the_biases_along() -> None:
    """``-ot ffn_.*_exps=CPU`` and ``--n-cpu-moe`` match the experts' biases too: the MXFP4 matrices go
    to CPU_REPACK, the F32 biases (``ffn_*_exps.bias``, 2-D) to the CPU buffer."""
    got = _planned("rpc1-gptoss-ngl99-ncmoe1-oo1-c1024-b512-ub16-faon")["tensor_overrides"]
    assert [(o["tensor"], o["buft"]) for o in got] == [
        (f"blk.0.ffn_{p}_exps.{k}", b) for k, b in (("weight", "CPU_REPACK"), ("bias", "CPU"))
        for p in ("gate", "down", "up")]


def test_sinks_are_one_more_source_of_the_attention() -> None:
    """With flash attention the sinks are FLASH_ATTN_EXT's src[4]; without, the SOFT_MAX's src[2]."""
    for fa, op, idx in (("on", "FLASH_ATTN_EXT", 4), ("off", "SOFT_MAX", 2)):
        ctx = context_from_case(CASES[f"cpu-gptoss-c1024-b2048-ub512-fa{fa}"])
        g = ctx.setup.build_graph(8192, 1, 1, 1).graph
        nodes = [n for n in g.nodes if n.op.value == op and len(n.src) > idx and n.src[idx] is not None]
        assert [n.src[idx].name for n in nodes] == [f"blk.{il}.attn_sinks.weight" for il in range(4)]


@pytest.mark.parametrize("case_id", IDS)
def test_each_graph_alone(case_id: str) -> None:
    """What each graph needs on its own (the oracle's ``graph_only_alloc_bytes``), measured as the oracle's
    patch measures it (``ggml_backend_sched_reserve_size`` after the reserves: the callback's pins are
    dropped, which costs the 4-copy FORCEPP case 1 MiB more on the second server than its reserves). With
    flash attention the last layer's output ``t_h_nextn``, a graph output that is never freed, sits below
    the logits: the CPU's tg graph then needs 128000 bytes of logits above 1568 bytes, not above 1056."""
    c = CASES[case_id]
    only = {(g["graph"], g["backend"]): g["bytes"] for g in c["observed"]["graph_only_alloc_bytes"]}
    assert graph_only_sizes(context_from_case(c)) == only


def test_registered() -> None:
    assert "gpt-oss" in archs.names()
    assert archs.get("gpt-oss").rope_type == archs.ROPE_TYPE_NEOX


# ---- real-size presets ------------------------------------------------------------------------------

@pytest.mark.parametrize(("preset", "n_layer", "n_tensors", "weights_gib"), [
    ("gpt_oss_20b", 24, 459, 11.27), ("gpt_oss_120b", 36, 687, 59.02)])
def test_presets_at_real_size(preset: str, n_layer: int, n_tensors: int, weights_gib: float) -> None:
    """openai/gpt-oss-20b and -120b's config.json, typed as ggml-org's GGUFs (MXFP4 experts, Q8_0 matrices):
    3 + 19 tensors per layer, and for the 120b the 59.02 GiB llama-bench reports for ggml-org's file. The
    graph keeps the tiny model's node count per layer (56 with flash attention, 61 without) plus 5."""
    from toolkit.context import Context
    from toolkit.models import ContextParams, presets

    hp = presets.get(preset)
    assert (hp.n_layer, hp.arch) == (n_layer, "gpt-oss")
    assert round(sum(w.nbytes for w in archs.get(hp.arch).weights(hp)) / 2**30, 2) == weights_gib
    for fa, per_layer in (("on", 56), ("off", 61)):
        ctx = Context(hp, ContextParams(n_ctx=4096, flash_attn=fa, n_gpu_layers=0))  # type: ignore[arg-type]
        assert ctx.setup.model.n_tensors == n_tensors
        assert ctx.events[-1].params.max_nodes == 8 * n_tensors
        ev = ctx.events[-1]
        assert ev.graphs["pp"].n_nodes == ev.graphs["tg"].n_nodes == per_layer * n_layer + 5


def test_gpt_oss_120b_on_a_24g_device_keeps_its_layers_and_moves_experts() -> None:
    """``fit -m gpt_oss_120b --device sim:24G``: the context shrinks to --fit-ctx, every layer stays on the
    device (-ngl 37) and the experts of layers 13.. go to the CPU, layer 13 keeping its attention only."""
    from toolkit.args import parse_args
    from toolkit.fit import fit_params
    from toolkit.models import presets

    r = fit_params(presets.get("gpt_oss_120b"), parse_args(["-m", "gpt_oss_120b", "--device", "sim:24G"]))
    assert r.status == "success" and (r.fitted.c, r.fitted.ngl) == (4096, 37)
    assert r.fitted.ot[0] == (r"blk\.13\.ffn_(gate|up|gate_up|down).*", "CPU")
    moe = tuple((rf"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps", "CPU") for il in range(14, 37))
    assert r.fitted.ot[1:] == moe
    assert r.printed.startswith('-c 4096 -ngl 37 -ot "blk\\.13\\.ffn_(gate|up|gate_up|down).*=CPU,')


# ---- the GGUF reader --------------------------------------------------------------------------------

def test_gguf_of_the_oracle_recipe_reads_as_the_cases_model(tmp_path: Any) -> None:
    """The tiny model written as the oracle's generator writes it (no feed_forward_length) reads back as the
    cases' model: iSWA with period 2, YaRN, SOFTMAX_WEIGHT gating, MXFP4 experts, every tensor in place."""
    import json
    from pathlib import Path

    from gptoss_model import recipe_of, write_model

    from toolkit.models.gguf import hparams_from_gguf
    from toolkit.models.hparams import HParams

    entry = json.loads((Path(__file__).parent / "data" / "logits-gptoss.json").read_text())[0]
    path = str(tmp_path / "m.gguf")
    write_model(path, recipe_of(entry, n_vocab=512))
    hp = hparams_from_gguf(path)
    want = HParams.from_dict({**CASES["cpu-gptoss-c1024-b2048-ub512-faon"]["model"], "n_vocab": 512})
    assert (hp.swa, hp.moe, hp.rope_scaling, hp.n_ff(0)) == (want.swa, want.moe, want.rope_scaling, 128)
    assert [(w.name, w.ne, w.type) for w in archs.get(hp.arch).weights(hp)] == \
        [(w.name, w.ne, w.type) for w in archs.get(want.arch).weights(want)]


def test_a_file_with_tensors_its_architecture_does_not_create_is_refused(tmp_path: Any) -> None:
    """llama_model_loader::done_getting_tensors: a qwen3moe file that also carries a router bias has one
    tensor more than qwen3moe creates ("wrong number of tensors")."""
    import gguf
    import numpy as np

    from toolkit.errors import GGUFError
    from toolkit.jaxrt.gguf_io import write_gguf
    from toolkit.models.gguf import hparams_from_gguf
    from toolkit.models.hparams import HParams
    from toolkit.models.moe import MoEParams

    hp = HParams(n_layer=1, n_embd=64, n_head=4, n_head_kv=2, n_ff=64, n_vocab=64, arch="qwen3moe",
                 moe=MoEParams(n_expert=4, n_expert_used=2, n_ff_exp=32))
    write_gguf(tmp_path / "a.gguf", hp, seed=1)
    assert hparams_from_gguf(str(tmp_path / "a.gguf")).moe == hp.moe   # as written: read
    r = gguf.GGUFReader(str(tmp_path / "a.gguf"))
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), "qwen3moe")
    for f in r.fields.values():
        if not f.name.startswith("GGUF.") and f.name != "general.architecture":
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            w.add_key_value(f.name, f.contents(), f.types[0], sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.add_tensor("blk.0.ffn_gate_inp.bias", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="wrong number of tensors; expected 15, got 16"):
        hparams_from_gguf(str(tmp_path / "b.gguf"))
