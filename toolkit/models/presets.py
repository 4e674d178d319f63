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
