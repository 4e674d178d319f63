"""Model shapes to plan with: the oracle's tiny and small models, and real-model-shaped ones.

The shaped presets (Llama-3-8B/70B, Llama-3.1-8B, Llama-3.2-1B, Qwen3-8B, Gemma-3-12B/27B, and after
them Mixtral-8x7B, Qwen3-30B-A3B, gpt-oss-20b/120b, Gemma-4-31B, Gemma-4-26B-A4B, Gemma-4-E4B,
Qwen3.6-35B-A3B, Qwen3.6-27B, DeepSeek-V3, GLM-4.7-Flash, GLM-4.5-Air)
only take the hyperparameters of the public models (no weights): they are for planning
buffers and splits at realistic sizes.
"""

from __future__ import annotations

import math

from toolkit.errors import ParameterError
from toolkit.ggml.types import GGMLType
from toolkit.models.hparams import HParams, MLAParams, RopeScaling, SWAParams
from toolkit.models.moe import MoEParams
from toolkit.models.ssm import RecurrentParams, interval_layers


def llama3_rope_freqs(head_dim: int, base: float = 500000.0, factor: float = 8.0, low_freq_factor: float = 1.0,
                      high_freq_factor: float = 4.0, original_max_position_embeddings: int = 8192
                      ) -> tuple[float, ...]:
    """``rope_freqs.weight`` of rope scaling type llama3, as convert_hf_to_gguf writes it (float32)."""
    import numpy as np
    f32 = np.float32
    freqs = f32(1.0) / (f32(base) ** (np.arange(0, head_dim, 2, dtype=np.float32) / f32(head_dim)))
    low_wavelen = original_max_position_embeddings / low_freq_factor
    high_wavelen = original_max_position_embeddings / high_freq_factor
    out: list[float] = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(float(f32(factor)))
        else:
            smooth = (f32(original_max_position_embeddings) / wavelen - f32(low_freq_factor)) / f32(
                high_freq_factor - low_freq_factor)
            out.append(float(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth)))
    return tuple(out)


def tiny(dtype: str | GGMLType = "f32", *, tied: bool = False) -> HParams:
    """The oracle's ``tiny_f32``: 2 layers, n_embd 64, 4 heads (2 KV), n_ff 128."""
    return HParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, dtype=GGMLType.parse(dtype),
                        tied=tied, name=f"tiny_{GGMLType.parse(dtype).lower}" + ("_tied" if tied else ""))


def small(dtype: str | GGMLType = "f32") -> HParams:
    """The oracle's ``small_f32``: 4 layers, n_embd 256, 8 heads, n_ff 688."""
    t = GGMLType.parse(dtype)
    # 688 is not a multiple of 32: a block-quantized ffn_down is stored F16 (HParams.tensor_type)
    return HParams(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=688, dtype=t, name=f"small_{t.lower}")


def med(dtype: str | GGMLType = "f32") -> HParams:
    """The oracle's ``med_f32``: 8 layers, n_embd 512, 8 heads (4 KV), n_ff 1376."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1376, dtype=t, name=f"med_{t.lower}")


def llama3_8b(dtype: str | GGMLType = "f16") -> HParams:
    """Llama-3-8B-shaped: 32 layers, n_embd 4096, 32 heads (8 KV), n_ff 14336, vocab 128256."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                        n_ctx_train=8192, rope_freq_base=500000.0, dtype=t, name=f"llama3-8b_{t.lower}")


def llama3_70b(dtype: str | GGMLType = "q4_0") -> HParams:
    """Llama-3-70B-shaped: 80 layers, n_embd 8192, 64 heads (8 KV), n_ff 28672, vocab 128256."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256,
                        n_ctx_train=8192, rope_freq_base=500000.0, dtype=t, name=f"llama3-70b_{t.lower}")


def llama3_1_8b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Llama-3.1-8B: 32 layers, n_embd 4096, 32 heads (8 KV), n_ff 14336, vocab 128256, 128K context,
    llama3 rope scaling (``rope_freqs.weight``)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                        n_ctx_train=131072, rope_freq_base=500000.0, dtype=t, rope_freqs=llama3_rope_freqs(128),
                        name=f"llama3.1-8b_{t.lower}")


def llama3_2_1b(dtype: str | GGMLType = "q8_0") -> HParams:
    """Llama-3.2-1B: 16 layers, n_embd 2048, 32 heads (8 KV), n_ff 8192, tied output, llama3 rope scaling
    (factor 32)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_vocab=128256,
                        n_ctx_train=131072, rope_freq_base=500000.0, dtype=t, tied=True,
                        rope_freqs=llama3_rope_freqs(64, factor=32.0), name=f"llama3.2-1b_{t.lower}")


def qwen3_8b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Qwen3-8B: 36 layers, n_embd 4096, 32 heads (8 KV) of 128, n_ff 12288, vocab 151936, QK-norm."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, n_ff=12288, n_vocab=151936,
                        n_ctx_train=40960, n_embd_head_k_=128, n_embd_head_v_=128, rope_freq_base=1000000.0,
                        eps=1e-6, dtype=t, arch="qwen3", name=f"qwen3-8b_{t.lower}")


def gemma3_12b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Gemma-3-12B: 48 layers, n_embd 3840, 16 heads (8 KV) of 256, n_ff 15360, vocab 262144, tied output,
    sliding window 1024 on 5 of every 6 layers (iSWA), rope base 1e6 (SWA layers 1e4)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=48, n_embd=3840, n_head=16, n_head_kv=8, n_ff=15360, n_vocab=262144,
                        n_ctx_train=131072, n_embd_head_k_=256, n_embd_head_v_=256, rope_freq_base=1000000.0,
                        eps=1e-6, dtype=t, tied=True, arch="gemma3", swa=SWAParams(1024, 6, 10000.0),
                        name=f"gemma3-12b_{t.lower}")


def gemma3_27b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Gemma-3-27B: 62 layers, n_embd 5376, 32 heads (16 KV) of 128, n_ff 21504, vocab 262144, tied output,
    sliding window 1024 on 5 of every 6 layers (iSWA); Q is scaled by 1/sqrt(n_embd/n_head)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=62, n_embd=5376, n_head=32, n_head_kv=16, n_ff=21504, n_vocab=262144,
                        n_ctx_train=131072, n_embd_head_k_=128, n_embd_head_v_=128, rope_freq_base=1000000.0,
                        eps=1e-6, dtype=t, tied=True, arch="gemma3", swa=SWAParams(1024, 6, 10000.0),
                        name=f"gemma3-27b_{t.lower}")


PRESETS = {"tiny": tiny, "small": small, "med": med, "llama3_8b": llama3_8b, "llama3_70b": llama3_70b,
           "llama3_1_8b": llama3_1_8b, "llama3_2_1b": llama3_2_1b, "qwen3_8b": qwen3_8b,
           "gemma3_12b": gemma3_12b, "gemma3_27b": gemma3_27b}


# what a model picker shows for each preset (label -> name), in the order to offer them
PRESET_LABELS: dict[str, str] = {
    "tiny": "tiny", "small": "small", "med": "med", "Llama-3-8B-shaped": "llama3_8b", "70B-shaped": "llama3_70b",
    "Llama-3.1-8B": "llama3_1_8b", "Llama-3.2-1B": "llama3_2_1b", "Qwen3-8B": "qwen3_8b",
    "Gemma-3-12B": "gemma3_12b", "Gemma-3-27B": "gemma3_27b",
}


def get(name: str) -> HParams:
    """A preset by name (``tiny``, ``small``, ``med``, ``llama3_8b``, ``llama3_70b``, ``llama3_1_8b``,
    ``llama3_2_1b``, ``qwen3_8b``, ``gemma3_12b``, ``gemma3_27b``, ``mixtral_8x7b``, ``qwen3_30b_a3b``,
    ``gpt_oss_20b``, ``gpt_oss_120b``, ``gemma4_31b``, ``gemma4_26b_a4b``, ``gemma4_e4b``, ``tiny_deepseek2``,
    ``tiny_glm4moe``, ``deepseek_v3``, ``glm4_7_flash``, ``glm4_5_air``);
    ``name:type`` gives it another weight type (``qwen3_30b_a3b:q8_0``).

    >>> get("qwen3_30b_a3b:q8_0").name
    'qwen3-30b-a3b_q8_0'
    """
    base, sep, dtype = name.partition(":")
    fn = PRESETS.get(base)
    if fn is None:
        raise ParameterError("model", name, "a preset name (" + ", ".join(PRESETS) + "), optionally with "
                             ":type (qwen3_30b_a3b:q8_0), or a GGUF path", "unknown model preset")
    if not sep:
        return fn()
    if not dtype:
        raise ParameterError("model", name, "a ggml type after the colon, such as q8_0", "no type given")
    return fn(dtype)


def spec(name: str, hparams: HParams) -> str:
    """How :func:`get` (and ``-m``) spells preset ``name`` with ``hparams``' weight type: the name, with
    ``:type`` when that is not the preset's own type."""
    base = name.partition(":")[0]
    own = get(base).dtype
    return base if hparams.dtype is own else f"{base}:{hparams.dtype.lower}"


def mixtral_8x7b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Mixtral-8x7B-shaped (``llama`` with experts): 32 layers, n_embd 4096, 32 heads (8 KV), 8 experts of
    n_ff 14336, 2 used per token, vocab 32000, rope base 1e6 (the router stays F32)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32000,
                        n_ctx_train=32768, rope_freq_base=1000000.0, dtype=t, name=f"mixtral-8x7b_{t.lower}",
                        moe=MoEParams(n_expert=8, n_expert_used=2))


PRESETS["mixtral_8x7b"] = mixtral_8x7b


def qwen3_30b_a3b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Qwen3-30B-A3B-shaped (``qwen3moe``): 48 layers, n_embd 2048, 32 heads (4 KV) of 128, QK-norm,
    128 experts of n_ff 768 with 8 used per token, vocab 151936, rope base 1e6."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=6144, n_vocab=151936,
                        n_ctx_train=40960, n_embd_head_k_=128, n_embd_head_v_=128, rope_freq_base=1000000.0,
                        eps=1e-6, dtype=t, arch="qwen3moe", name=f"qwen3-30b-a3b_{t.lower}",
                        moe=MoEParams(n_expert=128, n_expert_used=8, n_ff_exp=768))


PRESETS["qwen3_30b_a3b"] = qwen3_30b_a3b

PRESET_LABELS.update({"Mixtral-8x7B": "mixtral_8x7b", "Qwen3-30B-A3B": "qwen3_30b_a3b"})


def _gpt_oss(n_layer: int, n_expert: int, dtype: str | GGMLType, name: str) -> HParams:
    """The shape both published gpt-oss configs share (``config.json`` of openai/gpt-oss-20b and
    openai/gpt-oss-120b): n_embd 2880, 64 heads (8 KV) of 64, experts of intermediate_size 2880 with 4 used
    per token, vocab 201088, 128K context, sliding window 128 on every other layer (layer_types
    sliding/full, starting sliding), rope_theta 150000 with YaRN factor 32 over 4096, rms_norm_eps 1e-5.
    The weights are typed as ggml-org's gpt-oss GGUFs: the experts MXFP4 (as OpenAI released them), the
    other matrices ``dtype`` (Q8_0 there), the router, biases, sinks and norms F32."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=n_layer, n_embd=2880, n_head=64, n_head_kv=8, n_ff=2880, n_vocab=201088,
                   n_ctx_train=131072, n_embd_head_k_=64, n_embd_head_v_=64, rope_freq_base=150000.0, eps=1e-5,
                   dtype=t, tensor_types={"_exps.weight": GGMLType.MXFP4}, arch="gpt-oss", name=f"{name}_{t.lower}",
                   swa=SWAParams(128, 2), moe=MoEParams(n_expert=n_expert, n_expert_used=4, n_ff_exp=2880,
                                                        gating="softmax_weight"),
                   rope_scaling=RopeScaling("yarn", 32.0, 4096))


def gpt_oss_20b(dtype: str | GGMLType = "q8_0") -> HParams:
    """gpt-oss-20b-shaped (openai/gpt-oss-20b's config.json): 24 layers, 32 experts (see :func:`_gpt_oss`)."""
    return _gpt_oss(24, 32, dtype, "gpt-oss-20b")


def gpt_oss_120b(dtype: str | GGMLType = "q8_0") -> HParams:
    """gpt-oss-120b-shaped (openai/gpt-oss-120b's config.json): 36 layers, 128 experts (see :func:`_gpt_oss`);
    its weights are 59.02 GiB, as llama-bench reports ggml-org's gpt-oss-120b-mxfp4 file."""
    return _gpt_oss(36, 128, dtype, "gpt-oss-120b")


PRESETS["gpt_oss_20b"] = gpt_oss_20b
PRESETS["gpt_oss_120b"] = gpt_oss_120b
PRESET_LABELS.update({"gpt-oss-20b": "gpt_oss_20b", "gpt-oss-120b": "gpt_oss_120b"})


def gemma4_rope_freqs(head_dim: int, partial_rotary_factor: float) -> tuple[float, ...]:
    """``rope_freqs.weight`` of Gemma 4's full-attention layers ("proportional" RoPE), as
    convert_hf_to_gguf's ``Gemma4Model.generate_extra_tensors`` writes it: ``head_dim * factor / 2`` ones,
    then 1e30 for the unrotated pairs (ggml's NEOX rope then leaves them in place)."""
    n_rot = int(head_dim * partial_rotary_factor / 2)
    return (1.0,) * n_rot + (1e30,) * (head_dim // 2 - n_rot)


def _gemma4(dtype: str | GGMLType, name: str, *, n_layer: int, n_embd: int, n_head: int, n_head_kv_swa: int,
            n_head_kv_full: int, n_ff: int, window: int, n_ctx_train: int, attn_v_full: bool,
            moe: MoEParams | None = None, n_kv_shared: int = 0, n_embd_per_layer: int = 0) -> HParams:
    """What the published Gemma 4 configs share (``text_config`` of google/gemma-4-*'s config.json), written
    as convert_hf_to_gguf's ``Gemma4Model.set_gguf_parameters`` does: ``layer_types`` five sliding layers then
    one full, repeated (``attention.sliding_window_pattern``); SWA layers with heads of ``head_dim`` 256 and
    ``num_key_value_heads``, full layers with heads of ``global_head_dim`` 512 and ``num_global_key_value_heads``
    (with ``num_global_key_value_heads`` set, ``attention.head_count_kv`` is a per-layer array; ``key_length``
    512, ``key_length_swa`` 256); ``n_ctx_train`` is ``max_position_embeddings``;
    ``rope.dimension_count`` 512 with ``rope_freqs`` for the full layers' partial_rotary_factor 0.25
    (:func:`gemma4_rope_freqs`), ``rope.dimension_count_swa`` 256; rope_theta 1e6 (sliding layers 1e4),
    rms_norm_eps 1e-6, final_logit_softcapping 30, vocab 262144 (``vocab_size``; the token list is assumed
    as long), tied output. ``attention_k_eq_v`` true means no ``attn_v`` on the full layers (``attn_v_full``
    False)."""
    t = GGMLType.parse(dtype)
    swa_layers = tuple(il % 6 < 5 for il in range(n_layer))
    return HParams(n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                   n_head_kv=tuple(n_head_kv_swa if s else n_head_kv_full for s in swa_layers), n_ff=n_ff,
                   n_vocab=262144, n_ctx_train=n_ctx_train, n_embd_head_k_=512, n_embd_head_v_=512,
                   rope_freq_base=1000000.0, eps=1e-6, dtype=t, tied=True, arch="gemma4", name=f"{name}_{t.lower}",
                   rope_freqs=gemma4_rope_freqs(512, 0.25),
                   swa=SWAParams(window, rope_freq_base=10000.0, layers=swa_layers, n_embd_head_k=256,
                                 n_embd_head_v=256, n_rot=256),
                   moe=moe, n_kv_shared=n_kv_shared, n_embd_per_layer=n_embd_per_layer,
                   final_logit_softcapping=30.0, attn_v_full=attn_v_full)


def gemma4_31b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Gemma-4-31B (google/gemma-4-31B's config.json), dense: 60 layers, n_embd 5376, 32 heads, SWA layers 16
    KV heads of 256 with a window of 1024, full layers 4 KV heads of 512 and V = K (attention_k_eq_v),
    n_ff 21504, 256K context (see :func:`_gemma4`)."""
    return _gemma4(dtype, "gemma4-31b", n_layer=60, n_embd=5376, n_head=32, n_head_kv_swa=16, n_head_kv_full=4,
                   n_ff=21504, window=1024, n_ctx_train=262144, attn_v_full=False)


def gemma4_26b_a4b(dtype: str | GGMLType = "q8_0") -> HParams:
    """Gemma-4-26B-A4B (google/gemma-4-26B-A4B's config.json): 30 layers, n_embd 2816, 16 heads, SWA layers 8
    KV heads of 256 with a window of 1024, full layers 2 KV heads of 512 and V = K; on every layer the dense
    MLP (intermediate_size 2112) beside 128 experts of moe_intermediate_size 704 with 8 used per token (the
    router stays F32), 256K context (see :func:`_gemma4`). Q8_0 by default: 2112 and 704 are whole Q8_0
    blocks (32) but not Q4_K blocks (256)."""
    return _gemma4(dtype, "gemma4-26b-a4b", n_layer=30, n_embd=2816, n_head=16, n_head_kv_swa=8, n_head_kv_full=2,
                   n_ff=2112, window=1024, n_ctx_train=262144, attn_v_full=False,
                   moe=MoEParams(n_expert=128, n_expert_used=8, n_ff_exp=704))


def gemma4_e4b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Gemma-4-E4B (google/gemma-4-E4B's config.json): 42 layers, n_embd 2560, 8 heads and 2 KV heads on every
    layer (num_global_key_value_heads unset), of 256 with a window of 512 on SWA layers and of 512 with their
    own ``attn_v`` on full layers (attention_k_eq_v false), n_ff 10240 (use_double_wide_mlp false), per-layer
    embeddings of 256 (hidden_size_per_layer_input), the last 18 layers reading earlier layers' caches
    (num_kv_shared_layers), 128K context (see :func:`_gemma4`)."""
    return _gemma4(dtype, "gemma4-e4b", n_layer=42, n_embd=2560, n_head=8, n_head_kv_swa=2, n_head_kv_full=2,
                   n_ff=10240, window=512, n_ctx_train=131072, attn_v_full=True, n_kv_shared=18,
                   n_embd_per_layer=256)


PRESETS.update({"gemma4_31b": gemma4_31b, "gemma4_26b_a4b": gemma4_26b_a4b, "gemma4_e4b": gemma4_e4b})
PRESET_LABELS.update({"Gemma-4-31B": "gemma4_31b", "Gemma-4-26B-A4B": "gemma4_26b_a4b", "Gemma-4-E4B": "gemma4_e4b"})


# ---- Qwen3.6 (qwen35moe / qwen35: gated delta net hybrids) --------------------------------------------------

def _qwen36(arch: str, dtype: str | GGMLType, name: str, *, n_layer: int, n_embd: int, n_head: int,
            n_head_kv: int, n_v_heads: int, n_ff: int, moe: MoEParams | None = None) -> HParams:
    """What the Qwen3.6 text configs share (the ``text_config`` of Qwen/Qwen3.6-35B-A3B's and Qwen/Qwen3.6-27B's
    config.json, read from copies of their model cards; not checked against Qwen's own files): every fourth layer
    is gated attention (``full_attention_interval`` 4) with heads of 256 and a partial rotary of 64 dimensions
    (mrope sections 11/11/10), the others a gated delta net with 16 K heads and ``n_v_heads`` V heads of 128
    (``ssm.group_count`` 16, ``ssm.time_step_rank`` = V heads, ``ssm.inner_size`` = 128 per V head,
    ``ssm.state_size`` 128, ``ssm.conv_kernel`` 4), vocab 248320, 262144 context, rope_theta 1e7, rms_norm_eps
    1e-6, an untied output. No NextN/MTP block: a file with one plans with its own ``nextn_predict_layers``."""
    t = GGMLType.parse(dtype)
    rp = RecurrentParams(interval_layers(n_layer, 4), d_conv=4, d_inner=128 * n_v_heads, d_state=128,
                         dt_rank=n_v_heads, n_group=16)
    return HParams(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff, n_vocab=248320,
                   n_ctx_train=262144, n_embd_head_k_=256, n_embd_head_v_=256, n_rot_=64, rope_freq_base=1e7,
                   eps=1e-6, dtype=t, arch=arch, name=f"{name}_{t.lower}", moe=moe, recurrent=rp,
                   rope_sections=(11, 11, 10, 0))


def qwen3_6_35b_a3b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Qwen3.6-35B-A3B-shaped (``qwen35moe``, see :func:`_qwen36`): 40 layers (30 recurrent), n_embd 2048,
    16 heads (2 KV), 32 V heads in the delta net, 256 experts of 512 with 8 used and a shared expert of 512."""
    return _qwen36("qwen35moe", dtype, "qwen3.6-35b-a3b", n_layer=40, n_embd=2048, n_head=16, n_head_kv=2,
                   n_v_heads=32, n_ff=512, moe=MoEParams(n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512))


def qwen3_6_27b(dtype: str | GGMLType = "q4_k") -> HParams:
    """Qwen3.6-27B-shaped (``qwen35``, see :func:`_qwen36`): 64 layers (48 recurrent), n_embd 5120, 24 heads
    (4 KV), 48 V heads in the delta net, a dense FFN of 17408. llama.cpp's log of a Qwen3.6-27B run with two
    sequences (its PR #23792) prints ``llama_memory_recurrent: size = 299.25 MiB (2 cells, 64 layers, 2 seqs
    0 rs_seq), R (f32): 11.25 MiB, S (f32): 288.00 MiB`` and ``max_nodes = 27232`` (851 tensors): this
    preset gives the same."""
    return _qwen36("qwen35", dtype, "qwen3.6-27b", n_layer=64, n_embd=5120, n_head=24, n_head_kv=4, n_v_heads=48,
                   n_ff=17408)


PRESETS.update({"qwen3_6_35b_a3b": qwen3_6_35b_a3b, "qwen3_6_27b": qwen3_6_27b})
PRESET_LABELS.update({"Qwen3.6-35B-A3B": "qwen3_6_35b_a3b", "Qwen3.6-27B": "qwen3_6_27b"})

# ---- deepseek2 (MLA) and glm4moe --------------------------------------------------------------------------

def tiny_deepseek2(dtype: str | GGMLType = "f32") -> HParams:
    """The oracle's ``tiny_deepseek2_f32``: 4 layers (the first dense, n_ff 256), n_embd 128, 4 heads with
    MLA (q_lora 64, kv_lora 64, rope 16, nope 32, v_head 32: one cached KV head of 64 + 16), 8 experts of 64
    with 2 used, 1 shared, sigmoid gating with ``exp_probs_b``, weights norm and scale 2.5, 4 expert groups
    with 2 used, YaRN factor 4 over 4096 (log multiplier 0.1 in the file, 1 once read), vocab 32000."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=4, n_embd=128, n_head=4, n_head_kv=1, n_ff=256, n_ctx_train=16384, n_embd_head_k_=80,
                   n_embd_head_v_=64, n_rot_=16, eps=1e-6, dtype=t, arch="deepseek2", name=f"tiny_deepseek2_{t.lower}",
                   mla=MLAParams(64, 64, 48, 32), rope_scaling=RopeScaling("yarn", 4.0, 4096, 1.0, 1.0),
                   moe=MoEParams(8, 2, 64, weights_scale=2.5, gating="sigmoid", n_expert_shared=1, weights_norm=True,
                                 n_expert_groups=4, n_group_used=2, n_layer_dense_lead=1, exp_probs_b=True))


def tiny_glm4moe(dtype: str | GGMLType = "f32") -> HParams:
    """The oracle's ``tiny_glm4moe_f32``: 4 layers (the first dense, n_ff 256) and 1 NextN block, n_embd 128,
    4 heads (2 KV) of 64 with Q/K/V biases and partial NEOX RoPE 32, rope base 1e6, 8 experts of 64 with 2
    used, 1 shared, sigmoid gating with ``exp_probs_b``, weights norm, vocab 32000."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=4, n_embd=128, n_head=4, n_head_kv=2, n_ff=256, n_ctx_train=131072, n_embd_head_k_=64,
                   n_embd_head_v_=64, n_rot_=32,
                   rope_freq_base=1000000.0, dtype=t, arch="glm4moe", name=f"tiny_glm4moe_{t.lower}", n_layer_nextn=1,
                   moe=MoEParams(8, 2, 64, weights_scale=1.0, gating="sigmoid", n_expert_shared=1, weights_norm=True,
                                 n_layer_dense_lead=1, exp_probs_b=True))


def deepseek_v3(dtype: str | GGMLType = "q4_k") -> HParams:
    """DeepSeek-V3-shaped (deepseek-ai/DeepSeek-V3's config.json, 671B): 61 layers (the first 3 dense,
    intermediate_size 18432), hidden_size 7168, 128 heads with MLA (q_lora_rank 1536, kv_lora_rank 512,
    qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128: one cached head of 512 + 64), 256 routed experts
    of moe_intermediate_size 2048 with 8 used, 1 shared, sigmoid scoring with the selection bias, 8 groups of
    which 4 are used (n_group, topk_group), norm_topk_prob, routed_scaling_factor 2.5, vocab 129280, 160K
    context (YaRN factor 40 over 4096, mscale_all_dim 1: the converter writes 0.1, read as 1), rope_theta 1e4,
    rms_norm_eps 1e-6. Written as convert_hf_to_gguf writes it: without the MTP block (num_nextn_predict_layers
    1 in the config). ``attn_k_b``'s rows of 128 are no whole Q4_K block: stored F16."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=61, n_embd=7168, n_head=128, n_head_kv=1, n_ff=18432, n_vocab=129280, n_ctx_train=163840,
                   n_embd_head_k_=576, n_embd_head_v_=512, n_rot_=64, eps=1e-6, dtype=t, arch="deepseek2",
                   name=f"deepseek-v3_{t.lower}", mla=MLAParams(1536, 512, 192, 128),
                   rope_scaling=RopeScaling("yarn", 40.0, 4096, 1.0, 1.0),
                   moe=MoEParams(256, 8, 2048, weights_scale=2.5, gating="sigmoid", n_expert_shared=1,
                                 weights_norm=True, n_expert_groups=8, n_group_used=4, n_layer_dense_lead=3,
                                 exp_probs_b=True))


def glm4_7_flash(dtype: str | GGMLType = "q4_k") -> HParams:
    """GLM-4.7-Flash-shaped (zai-org/GLM-4.7-Flash's config.json, a ``deepseek2`` file: 30B-A3B): 47 layers (the
    first dense, intermediate_size 10240) plus the NextN block, hidden_size 2048, 20 heads with MLA (q_lora_rank
    768, kv_lora_rank 512, qk_nope_head_dim 192, qk_rope_head_dim 64, v_head_dim 256), 64 routed experts of
    moe_intermediate_size 1536 with 4 used, 1 shared, sigmoid scoring with the selection bias (no groups),
    norm_topk_prob, routed_scaling_factor 1.8, vocab 154880, max_position_embeddings 202752, rope_theta 1e6,
    rms_norm_eps 1e-5. ``attn_k_b``'s rows of 192 are no whole Q4_K block: stored F16."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=47, n_embd=2048, n_head=20, n_head_kv=1, n_ff=10240, n_vocab=154880, n_ctx_train=202752,
                   n_embd_head_k_=576, n_embd_head_v_=512, n_rot_=64, rope_freq_base=1000000.0, eps=1e-5, dtype=t,
                   arch="deepseek2", name=f"glm-4.7-flash_{t.lower}", n_layer_nextn=1,
                   mla=MLAParams(768, 512, 256, 256),
                   moe=MoEParams(64, 4, 1536, weights_scale=1.8, gating="sigmoid", n_expert_shared=1,
                                 weights_norm=True, n_layer_dense_lead=1, exp_probs_b=True))


def glm4_5_air(dtype: str | GGMLType = "q4_0") -> HParams:
    """GLM-4.5-Air-shaped (zai-org/GLM-4.5-Air's config.json, ``glm4moe``: 106B-A12B): 46 layers (the first
    dense, intermediate_size 10944) plus the NextN block, hidden_size 4096, 96 heads (8 KV) of 128 with Q/K/V
    biases and no Q/K norms, partial_rotary_factor 0.5 (64 of 128 rotated), 128 routed experts of
    moe_intermediate_size 1408 with 8 used, 1 shared, sigmoid scoring with the selection bias, norm_topk_prob,
    routed_scaling_factor 1, vocab 151552, 128K context, rope_theta 1e6, rms_norm_eps 1e-5. Q4_0 by default:
    1408 and 10944 are whole Q4_0 blocks (32) but not Q4_K blocks (256)."""
    t = GGMLType.parse(dtype)
    return HParams(n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, n_ff=10944, n_vocab=151552, n_ctx_train=131072,
                   n_embd_head_k_=128, n_embd_head_v_=128, n_rot_=64, rope_freq_base=1000000.0, eps=1e-5, dtype=t,
                   arch="glm4moe", name=f"glm-4.5-air_{t.lower}", n_layer_nextn=1,
                   moe=MoEParams(128, 8, 1408, weights_scale=1.0, gating="sigmoid", n_expert_shared=1,
                                 weights_norm=True, n_layer_dense_lead=1, exp_probs_b=True))


PRESETS.update({"tiny_deepseek2": tiny_deepseek2, "tiny_glm4moe": tiny_glm4moe, "deepseek_v3": deepseek_v3,
                "glm4_7_flash": glm4_7_flash, "glm4_5_air": glm4_5_air})
PRESET_LABELS.update({"tiny deepseek2 (MLA)": "tiny_deepseek2", "tiny glm4moe": "tiny_glm4moe",
                      "DeepSeek-V3": "deepseek_v3", "GLM-4.7-Flash": "glm4_7_flash", "GLM-4.5-Air": "glm4_5_air"})
assert set(PRESET_LABELS.values()) == set(PRESETS)
