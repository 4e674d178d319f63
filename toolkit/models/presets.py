"""Model shapes to plan with: the oracle's tiny and small models, and Llama-3-8B/70B-shaped ones.

The shaped presets only take the hyperparameters of the public models (no weights): they
are for planning buffers and splits at realistic sizes.
"""

from __future__ import annotations

from toolkit.ggml.types import GGMLType
from toolkit.models.hparams import LlamaHParams


def tiny(dtype: str | GGMLType = "f32", *, tied: bool = False) -> LlamaHParams:
    """The oracle's ``tiny_f32``: 2 layers, n_embd 64, 4 heads (2 KV), n_ff 128."""
    return LlamaHParams(n_layer=2, n_embd=64, n_head=4, n_head_kv=2, n_ff=128, dtype=GGMLType.parse(dtype),
                        tied=tied, name=f"tiny_{GGMLType.parse(dtype).lower}" + ("_tied" if tied else ""))


def small(dtype: str | GGMLType = "f32") -> LlamaHParams:
    """The oracle's ``small_f32``: 4 layers, n_embd 256, 8 heads, n_ff 688."""
    t = GGMLType.parse(dtype)
    # 688 is not a multiple of 32: a block-quantized ffn_down is stored F16 (LlamaHParams.tensor_type)
    return LlamaHParams(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=688, dtype=t, name=f"small_{t.lower}")


def med(dtype: str | GGMLType = "f32") -> LlamaHParams:
    """The oracle's ``med_f32``: 8 layers, n_embd 512, 8 heads (4 KV), n_ff 1376."""
    t = GGMLType.parse(dtype)
    return LlamaHParams(n_layer=8, n_embd=512, n_head=8, n_head_kv=4, n_ff=1376, dtype=t, name=f"med_{t.lower}")


def llama3_8b(dtype: str | GGMLType = "f16") -> LlamaHParams:
    """Llama-3-8B-shaped: 32 layers, n_embd 4096, 32 heads (8 KV), n_ff 14336, vocab 128256."""
    t = GGMLType.parse(dtype)
    return LlamaHParams(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
                        n_ctx_train=8192, rope_freq_base=500000.0, dtype=t, name=f"llama3-8b_{t.lower}")


def llama3_70b(dtype: str | GGMLType = "q4_0") -> LlamaHParams:
    """Llama-3-70B-shaped: 80 layers, n_embd 8192, 64 heads (8 KV), n_ff 28672, vocab 128256."""
    t = GGMLType.parse(dtype)
    return LlamaHParams(n_layer=80, n_embd=8192, n_head=64, n_head_kv=8, n_ff=28672, n_vocab=128256,
                        n_ctx_train=8192, rope_freq_base=500000.0, dtype=t, name=f"llama3-70b_{t.lower}")


PRESETS = {"tiny": tiny, "small": small, "med": med, "llama3_8b": llama3_8b, "llama3_70b": llama3_70b}


def get(name: str) -> LlamaHParams:
    """A preset by name (``tiny``, ``small``, ``med``, ``llama3_8b``, ``llama3_70b``)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(PRESETS)}") from None


def mixtral_8x7b(dtype: str | GGMLType = "q4_k") -> LlamaHParams:
    """Mixtral-8x7B-shaped (``llama`` with experts): 32 layers, n_embd 4096, 32 heads (8 KV), 8 experts of
    n_ff 14336, 2 used per token, vocab 32000, rope base 1e6 (the router stays F32)."""
    from toolkit.models.moe import MoEParams  # noqa: PLC0415 - the MoE block is optional to dense users

    t = GGMLType.parse(dtype)
    return LlamaHParams(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=32000,
                        n_ctx_train=32768, rope_freq_base=1000000.0, dtype=t, name=f"mixtral-8x7b_{t.lower}",
                        moe=MoEParams(n_expert=8, n_expert_used=2))


PRESETS["mixtral_8x7b"] = mixtral_8x7b
