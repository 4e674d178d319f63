"""The Gemma 4 presets at real size: each plans a context, and what follows from the published configs by
hand (``text_config`` of google/gemma-4-31B, google/gemma-4-26B-A4B and google/gemma-4-E4B's config.json)
holds: the tensors in the file, the parameter count, the KV bytes of both caches with flash attention on and
off and with ``--swa-full``, the layers KV sharing leaves in the caches; the picker offers the presets and
``fit`` prints a line for the MoE one. Every expected number below is written from the configs' raw values
(layers, heads, head sizes, window, KV-shared layers), not read from the toolkit."""

from __future__ import annotations

import re
from functools import cache

import pytest

from toolkit.context import Context
from toolkit.models import ContextParams, archs, presets

NAMES = ("gemma4_31b", "gemma4_26b_a4b", "gemma4_e4b")
N_CTX = 32768
F16 = 2  # bytes


@cache
def _ctx(name: str, fa: str = "on", swa_full: bool = False, n_ctx: int = N_CTX) -> Context:
    return Context(presets.get(name), ContextParams(n_ctx=n_ctx, n_ubatch=512, flash_attn=fa, swa_full=swa_full,
                                                    n_gpu_layers=0))  # type: ignore[arg-type]


def _kv(ctx: Context) -> dict[str, int]:
    ev = ctx.events[-1]
    return {g: sum(ev.memory[g].values()) for g in ("KV", "KV-SWA")}


# cells of an SWA cache: GGML_PAD(min(n_ctx, window + n_ubatch), 256)
SWA_1024 = 1536   # window 1024 (31B, 26B-A4B): 1024 + 512
SWA_512 = 1024    # window 512 (E4B): 512 + 512

# KV bytes at n_ctx 32768, F16: layers x cells x (K width + V width) x 2, per cache. With flash attention V is
# as wide as K (n_head_kv x head size of the layer); without it the transposed V is as wide as the widest
# layer's V on every layer: 31B 16 x 256 = 4096, 26B-A4B 8 x 256 = 2048, E4B 2 x 512 = 1024.
KV_BYTES = {
    # 31B: 10 full layers of 4 KV heads of 512, 50 SWA layers of 16 KV heads of 256
    ("gemma4_31b", "on"): {"KV": 10 * N_CTX * (2048 + 2048) * F16, "KV-SWA": 50 * SWA_1024 * (4096 + 4096) * F16},
    ("gemma4_31b", "off"): {"KV": 10 * N_CTX * (2048 + 4096) * F16, "KV-SWA": 50 * SWA_1024 * (4096 + 4096) * F16},
    # 26B-A4B: 5 full layers of 2 KV heads of 512, 25 SWA layers of 8 KV heads of 256
    ("gemma4_26b_a4b", "on"): {"KV": 5 * N_CTX * (1024 + 1024) * F16, "KV-SWA": 25 * SWA_1024 * (2048 + 2048) * F16},
    ("gemma4_26b_a4b", "off"): {"KV": 5 * N_CTX * (1024 + 2048) * F16, "KV-SWA": 25 * SWA_1024 * (2048 + 2048) * F16},
    # E4B: 2 KV heads everywhere; only layers 0..23 (42 - 18 shared) have a cache: 4 full (512), 20 SWA (256)
    ("gemma4_e4b", "on"): {"KV": 4 * N_CTX * (1024 + 1024) * F16, "KV-SWA": 20 * SWA_512 * (512 + 512) * F16},
    ("gemma4_e4b", "off"): {"KV": 4 * N_CTX * (1024 + 1024) * F16, "KV-SWA": 20 * SWA_512 * (512 + 1024) * F16},
}


@pytest.mark.parametrize(("name", "fa"), list(KV_BYTES))
def test_kv_bytes_of_both_caches(name: str, fa: str) -> None:
    ctx = _ctx(name, fa)
    assert ctx.events[-1].decision != "error"
    assert _kv(ctx) == KV_BYTES[(name, fa)]


def test_gemma4_31b_kv_values() -> None:
    """The same sums, spelled out: 2560 MiB full + 1200 MiB SWA with flash attention; 3840 + 1200 without."""
    assert {k: v >> 20 for k, v in _kv(_ctx("gemma4_31b")).items()} == {"KV": 2560, "KV-SWA": 1200}
    assert {k: v >> 20 for k, v in _kv(_ctx("gemma4_31b", "off")).items()} == {"KV": 3840, "KV-SWA": 1200}


@pytest.mark.parametrize(("name", "n_full", "full_width", "n_swa", "swa_width"), [
    ("gemma4_31b", 10, 2048, 50, 4096), ("gemma4_26b_a4b", 5, 1024, 25, 2048), ("gemma4_e4b", 4, 1024, 20, 512)])
def test_swa_full_gives_the_swa_cache_every_cell(name: str, n_full: int, full_width: int, n_swa: int,
                                                 swa_width: int) -> None:
    """``--swa-full`` at n_ctx 8192: the SWA cache holds every cell, like the full one (at 32768 the 31B's
    would need 25 GiB of host memory for the SWA cache alone)."""
    n_ctx = 8192
    assert _kv(_ctx(name, swa_full=True, n_ctx=n_ctx)) == {"KV": n_full * n_ctx * 2 * full_width * F16,
                                                           "KV-SWA": n_swa * n_ctx * 2 * swa_width * F16}


# tensors in the file: token_embd and output_norm (the output is tied), rope_freqs once; per layer attn_norm,
# Q, K, V, attn_output, Q and K norms, post_attention_norm, layer_output_scale, ffn_norm, gate, up, down,
# post_ffw_norm (14), less V on full layers with attention_k_eq_v; with experts 8 more (router and its scale,
# pre_ffw_norm_2, post_ffw_norm_1/2, gate_up_exps, down_exps and its scale); with per-layer embeddings 3 more
# in the input part (per_layer_token_embd, per_layer_model_proj, per_layer_proj_norm) and per layer (inp_gate,
# proj, post_norm); a KV-shared layer has no K, V or K norm.
N_FILE_TENSORS = {
    "gemma4_31b": 2 + 1 + 50 * 14 + 10 * 13,
    "gemma4_26b_a4b": 2 + 1 + 25 * (14 + 8) + 5 * (13 + 8),
    "gemma4_e4b": 2 + 1 + 3 + 24 * (14 + 3) + 18 * (14 - 3 + 3),
}


@pytest.mark.parametrize("name", NAMES)
def test_tensors_in_the_file_and_created(name: str) -> None:
    """The tied output is created as its own tensor (TENSOR_DUPLICATED), one more than the file holds."""
    hp = presets.get(name)
    assert len(archs.get(hp.arch).weights(hp)) == N_FILE_TENSORS[name]
    assert _ctx(name).setup.model.n_tensors == N_FILE_TENSORS[name] + 1


@pytest.mark.parametrize(("name", "billions"), [("gemma4_31b", 30.7), ("gemma4_26b_a4b", 25.2), ("gemma4_e4b", 7.5)])
def test_parameter_count(name: str, billions: float) -> None:
    """31B: 30.7 B parameters and 26B-A4B: 25.2 B in all, as Google publishes them for the text model. E4B by
    hand: 4.64 B in the embedding, the projection of the per-layer inputs and the layers, plus the per-layer
    embedding table of 262144 x 42 x 256 = 2.82 B."""
    hp = presets.get(name)
    n = 0
    for w in archs.get(hp.arch).weights(hp):
        k = 1
        for x in w.ne:
            k *= x
        n += k
    assert round(n / 1e9, 1) == billions


def test_e4b_kv_sharing_leaves_24_layers_in_the_caches() -> None:
    """num_kv_shared_layers 18 of 42: layers 24..41 read the cache of layer 22 (the last SWA layer before them)
    or 23 (the last full one); the full cache holds layers 5, 11, 17, 23, the SWA cache the other 20 of 0..23."""
    caches = {c.kind: c for c in _ctx("gemma4_e4b").setup.memory.caches}
    full = [5, 11, 17, 23]
    assert list(caches["non-SWA"].layers) == full
    assert list(caches["SWA"].layers) == [il for il in range(24) if il not in full]
    reuse = {**caches["non-SWA"].reuse, **caches["SWA"].reuse}
    assert reuse == {il: 23 if il % 6 == 5 else 22 for il in range(24, 42)}
    names = {w.name for w in archs.get("gemma4").weights(presets.gemma4_e4b())}
    assert {"blk.23.attn_k.weight", "blk.23.attn_v.weight", "blk.22.attn_v.weight"} <= names
    assert not {"blk.24.attn_k.weight", "blk.24.attn_v.weight", "blk.29.attn_v.weight", "blk.29.attn_k_norm.weight"
                } & names


def test_31b_full_layers_have_no_attn_v_and_rope_freqs_keeps_a_quarter() -> None:
    """attention_k_eq_v: the full layers' V is K's product; partial_rotary_factor 0.25 of 512: 64 of the
    256 frequency factors are 1, the rest 1e30."""
    hp = presets.gemma4_31b()
    names = {w.name for w in archs.get(hp.arch).weights(hp)}
    assert "blk.5.attn_v.weight" not in names and "blk.4.attn_v.weight" in names
    assert hp.rope_freqs is not None and hp.rope_freqs.count(1.0) == 64 and len(hp.rope_freqs) == 256


def test_the_picker_offers_them() -> None:
    from toolkit.ui.choices import MODEL_PRESETS, preset_of

    assert {k: MODEL_PRESETS[k] for k in ("Gemma-4-31B", "Gemma-4-26B-A4B", "Gemma-4-E4B")} == {
        "Gemma-4-31B": "gemma4_31b", "Gemma-4-26B-A4B": "gemma4_26b_a4b", "Gemma-4-E4B": "gemma4_e4b"}
    assert [preset_of(presets.get(n)) for n in NAMES] == list(NAMES)


def test_fit_moves_the_last_experts_of_26b_a4b_off_a_24g_device(capsys: pytest.CaptureFixture[str]) -> None:
    """``fit -m gemma4_26b_a4b --device sim:24G``: 25 GiB of Q8_0 weights do not fit; the context drops to
    --fit-ctx 4096, all 30 layers and the output go to the device (-ngl 31) and the experts of a trailing block
    of layers to the CPU, the last override naming block 30 (n_layer, which matches no tensor)."""
    from toolkit import cli

    assert cli.main(["fit", "-m", "gemma4_26b_a4b", "--device", "sim:24G"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith('-c 4096 -ngl 31 -ot "')
    blocks = [int(b) for b in re.findall(r"blk\\\.(\d+)\\\.", line)]
    assert blocks == list(range(blocks[0], 31)) and 0 < blocks[0] < 30
    assert all(p.endswith("=CPU") for p in line.split('"')[1].split(","))


@pytest.mark.parametrize(("name", "fa", "padded"), [
    ("gemma4_31b", "off", 10 * [(2048, 4096)]), ("gemma4_31b", "on", []),
    ("gemma4_e4b", "off", 20 * [(512, 1024)]), ("gemma4_26b_a4b", "off", 5 * [(1024, 2048)])])
def test_a_narrower_layer_pads_its_rows_into_the_transposed_v(name: str, fa: str, padded: list[tuple[int, int]]
                                                              ) -> None:
    """``llama_kv_cache::cpy_v`` without flash attention: a layer whose V is narrower than the cache's
    n_embd_v_gqa_max rows is padded (``ggml_pad``) before its elements are scattered: the 31B's and 26B-A4B's
    full layers, E4B's SWA layers that have a cache (KV-shared layers write nothing)."""
    ctx = _ctx(name, fa)
    g = ctx.setup.build_graph(ctx.events[-1].params.max_nodes, 512, 1, 512).graph
    pads = [n for n in g.nodes if n.op.value == "PAD"]
    assert [(n.src[0].ne[0], n.ne[0]) for n in pads] == padded
    assert all(n.ne[1] == 512 and n.op_params["rp0"] == n.ne[0] - n.src[0].ne[0] for n in pads)
