"""The real-size deepseek2 and glm4moe presets (DeepSeek-V3, GLM-4.7-Flash, GLM-4.5-Air, from their published
config.json): their tensors, the MLA cache, the graph's node count per layer against the tiny models', and
the fit on the devices people run them on."""

from __future__ import annotations

import math

import pytest

from toolkit.args import parse_args
from toolkit.context import Context
from toolkit.fit import fit_params
from toolkit.models import ContextParams, archs, presets


def _params_b(name: str) -> float:
    hp = presets.get(name)
    return sum(math.prod(w.ne) for w in archs.get(hp.arch).weights(hp) if not w.skip) / 1e9


@pytest.mark.parametrize(("name", "params_b", "n_tensors", "weights_gib"), [
    ("deepseek_v3", 671.0, 1086, 352.56), ("glm4_7_flash", 29.9, 844, 15.83), ("glm4_5_air", 106.9, 780, 56.06)])
def test_presets_at_real_size(name: str, params_b: float, n_tensors: int, weights_gib: float) -> None:
    """DeepSeek-V3 is the 671B of its model card (the MTP block left out, as the converter does); GLM-4.7-Flash
    30B; GLM-4.5-Air 106B without its NextN block, whose tensors are in the file but never loaded."""
    hp = presets.get(name)
    ws = archs.get(hp.arch).weights(hp)
    assert round(_params_b(name), 1) == params_b
    assert sum(not w.skip for w in ws) == n_tensors
    assert round(sum(w.nbytes for w in ws if not w.skip) / 2**30, 2) == weights_gib


def test_deepseek_v3_graph_and_cache() -> None:
    """Per token and layer the MLA cache holds 512 + 64 F16 values of one head (70272 bytes per token over 61
    layers) and no V; the graph has the tiny model's nodes per layer with flash attention (llama.cpp's dump
    of the tiny model: 45 for a dense layer, 82 for a MoE layer with 2 experts used, 6 around the layers) over
    3 dense and 58 MoE layers, each of those with 2 x 6 nodes more for 8 experts used (a VIEW and an ADD per
    expert)."""
    ctx = Context(presets.get("deepseek_v3"), ContextParams(n_ctx=4096, flash_attn="on", n_gpu_layers=0))
    (kv,) = ctx.setup.memory.caches
    assert not kv.has_v and kv.k_bytes == 4096 * 61 * 576 * 2
    tiny = Context(presets.get("tiny_deepseek2"), ContextParams(n_ctx=256, flash_attn="on", n_gpu_layers=0))
    assert tiny.events[-1].graphs["pp"].n_nodes == 6 + 45 + 3 * 82 == 297
    assert ctx.events[-1].graphs["pp"].n_nodes == 6 + 3 * 45 + 58 * (82 + 2 * 6) == 5593


def test_deepseek_v3_on_eight_80g_devices_keeps_the_full_context() -> None:
    """``fit -m deepseek_v3 --device sim:80G x 8``: every layer and the 163840-token context fit (the MLA cache
    is 11 GiB at full context); fit answers at once."""
    r = fit_params(presets.get("deepseek_v3"), parse_args(["-m", "deepseek_v3", "--device", ",".join(["sim:80G"] * 8)]))
    assert r.status == "success" and r.printed == "-c 163840 -ngl -1"
    assert max(r.used) < 80 * 2**30 - 2**30


def test_glm4_5_air_on_one_24g_device_moves_experts_to_the_cpu() -> None:
    """``fit -m glm4_5_air --device sim:24G``: the context drops to --fit-ctx, every layer stays on the device
    (-ngl 47: the 46 layers and the NextN block, which counts for -ngl) and the experts of the later layers go
    to the CPU, one layer keeping its gate and up."""
    r = fit_params(presets.get("glm4_5_air"), parse_args(["-m", "glm4_5_air", "--device", "sim:24G"]))
    assert r.status == "success" and (r.fitted.c, r.fitted.ngl) == (4096, 47)
    first, *moe = r.fitted.ot
    assert first == (r"blk\.16\.ffn_down.*", "CPU")
    assert moe == [(rf"blk\.{il}\.ffn_(up|down|gate_up|gate)_(ch|)exps", "CPU") for il in range(17, 47)]
    assert r.used[0] <= 23 * 2**30
