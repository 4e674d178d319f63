"""ggml block quantization in JAX: Q8_0, Q4_0 and MXFP4 dequantized inside the compiled kernel.

Block layouts (ggml-common.h):
- Q8_0: 34 bytes per 32 elements: ``d`` (f16, little endian), then 32 int8 ``qs``; x = d * q.
- Q4_0: 18 bytes per 32 elements: ``d`` (f16), then 16 bytes of nibbles; byte j holds element j
  in its low nibble and element j+16 in its high nibble; x = d * (q - 8).
- MXFP4 (``block_mxfp4``): 17 bytes per 32 elements: ``e`` (an E8M0 exponent), then 16 bytes of
  nibbles as Q4_0's; x = ``kvalues_mxfp4[q]`` (E2M1 values doubled) times ``GGML_E8M0_TO_FP32_HALF(e)``
  = 2^(e-128), built from its bits (``0x00200000 << e`` below e = 2, ``(e - 1) << 23`` from there).

Weights stay quantized on their device (uint8 bytes in ggml layout); only the rows a kernel
reads are expanded, so a GET_ROWS of a Q8_0 embedding dequantizes n_tokens rows, not the table.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from toolkit.ggml.types import GGMLType

QK = 32  # elements per block for both Q8_0 and Q4_0


def _scale(blocks: jnp.ndarray) -> jnp.ndarray:
    """The f16 block scale from the first two bytes of each block, as f32."""
    return lax.bitcast_convert_type(blocks[..., 0:2], jnp.float16).astype(jnp.float32)


def dequant_q8_0(raw: jnp.ndarray) -> jnp.ndarray:
    """uint8 rows (..., nblocks*34) -> f32 rows (..., nblocks*32)."""
    lead = raw.shape[:-1]
    nblk = raw.shape[-1] // 34
    blocks = raw.reshape(*lead, nblk, 34)
    qs = lax.bitcast_convert_type(blocks[..., 2:], jnp.int8).astype(jnp.float32)
    return (qs * _scale(blocks)[..., None]).reshape(*lead, nblk * QK)


def dequant_q4_0(raw: jnp.ndarray) -> jnp.ndarray:
    """uint8 rows (..., nblocks*18) -> f32 rows (..., nblocks*32)."""
    lead = raw.shape[:-1]
    nblk = raw.shape[-1] // 18
    blocks = raw.reshape(*lead, nblk, 18)
    qs = blocks[..., 2:]
    lo = (qs & 0x0F).astype(jnp.int32) - 8
    hi = (qs >> 4).astype(jnp.int32) - 8
    q = jnp.concatenate([lo, hi], axis=-1).astype(jnp.float32)  # elements 0..15, then 16..31
    return (q * _scale(blocks)[..., None]).reshape(*lead, nblk * QK)


# kvalues_mxfp4 (ggml-common.h): the E2M1 values, doubled
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _e8m0_to_fp32_half(e: jnp.ndarray) -> jnp.ndarray:
    """``ggml_e8m0_to_fp32_half``: 2^(e-128) from its float32 bits (e = 0, 1 give denormals, which XLA's
    CPU flushes to zero: scales below 2^-126 that no quantizer of real weights writes)."""
    e32 = e.astype(jnp.uint32)
    bits = jnp.where(e32 < 2, jnp.uint32(0x00200000) << e32, (e32 - 1) << 23)
    return lax.bitcast_convert_type(bits, jnp.float32)


def dequant_mxfp4(raw: jnp.ndarray) -> jnp.ndarray:
    """uint8 rows (..., nblocks*17) -> f32 rows (..., nblocks*32) (``dequantize_row_mxfp4``)."""
    lead = raw.shape[:-1]
    nblk = raw.shape[-1] // 17
    blocks = raw.reshape(*lead, nblk, 17)
    qs = blocks[..., 1:]
    idx = jnp.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(jnp.int32)  # elements 0..15, then 16..31
    q = jnp.asarray(KVALUES_MXFP4, jnp.float32)[idx]
    return (q * _e8m0_to_fp32_half(blocks[..., 0])[..., None]).reshape(*lead, nblk * QK)


DEQUANT = {GGMLType.Q8_0: dequant_q8_0, GGMLType.Q4_0: dequant_q4_0, GGMLType.MXFP4: dequant_mxfp4}


def dequantize(raw: jnp.ndarray, type_: GGMLType) -> jnp.ndarray:
    """Rows of a quantized tensor (uint8, ggml layout) to f32; a clear error for other types."""
    try:
        fn = DEQUANT[type_]
    except KeyError:
        known = ", ".join(t.name for t in DEQUANT)
        raise NotImplementedError(f"the JAX runtime dequantizes {known}, not {type_.name}") from None
    return fn(raw)


def _roundf(x: jnp.ndarray) -> jnp.ndarray:
    """C's roundf: halves away from zero (jnp.round rounds halves to even)."""
    return jnp.sign(x) * jnp.floor(jnp.abs(x) + 0.5)


def _f16_bytes(d: jnp.ndarray) -> jnp.ndarray:
    return lax.bitcast_convert_type(d.astype(jnp.float16), jnp.uint8)  # (..., 2)


def quant_q8_0(x: jnp.ndarray) -> jnp.ndarray:
    """f32 rows (..., n) -> Q8_0 bytes (..., n/32*34), as ggml's quantize_row_q8_0_ref."""
    lead = x.shape[:-1]
    b = x.reshape(*lead, -1, QK).astype(jnp.float32)
    d = jnp.max(jnp.abs(b), axis=-1) / 127.0
    inv = jnp.where(d != 0.0, 1.0 / jnp.where(d != 0.0, d, 1.0), 0.0)
    q = _roundf(b * inv[..., None]).astype(jnp.int8)
    blocks = jnp.concatenate([_f16_bytes(d), lax.bitcast_convert_type(q, jnp.uint8)], axis=-1)
    return blocks.reshape(*lead, -1)


def quant_q4_0(x: jnp.ndarray) -> jnp.ndarray:
    """f32 rows (..., n) -> Q4_0 bytes (..., n/32*18), as ggml's quantize_row_q4_0_ref: d = (the value
    of largest magnitude) / -8, q = min(15, (int8)(x/d + 8.5)), low nibbles first."""
    lead = x.shape[:-1]
    b = x.reshape(*lead, -1, QK).astype(jnp.float32)
    mx = jnp.take_along_axis(b, jnp.argmax(jnp.abs(b), axis=-1)[..., None], axis=-1)[..., 0]
    d = mx / -8.0
    inv = jnp.where(d != 0.0, 1.0 / jnp.where(d != 0.0, d, 1.0), 0.0)
    q = jnp.minimum(15, jnp.trunc(b * inv[..., None] + 8.5).astype(jnp.int32)).astype(jnp.uint8)
    qs = q[..., :16] | (q[..., 16:] << 4)
    blocks = jnp.concatenate([_f16_bytes(d), qs], axis=-1)
    return blocks.reshape(*lead, -1)


QUANT = {GGMLType.Q8_0: quant_q8_0, GGMLType.Q4_0: quant_q4_0}


def quantize(x: jnp.ndarray, type_: GGMLType) -> jnp.ndarray:
    try:
        fn = QUANT[type_]
    except KeyError:
        known = ", ".join(t.name for t in QUANT)
        raise NotImplementedError(f"the JAX runtime quantizes {known}, not {type_.name}") from None
    return fn(x)
