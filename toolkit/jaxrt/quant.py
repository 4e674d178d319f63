"""ggml block quantization in JAX: every weight type the runtime runs, dequantized inside the compiled kernel.

Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 blocks hold 32 elements, NVFP4 and Q2_0 64, Q1_0 128; the
K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, the ternary TQ1_0 and TQ2_0 and the grid types IQ2_XXS,
IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M hold QK_K = 256 in sub-blocks of 16 or 32 with their own
scales. The grid types' tables (iq2xxs_grid .. iq1s_grid and ksigns_iq2xs of ggml-common.h) are taken at
import from the ``gguf`` package's gguf/quants.py, which builds them for its own dequantization. Each kernel
follows its ``dequantize_row_*`` (ggml-quants.c) over the block struct of ggml-common.h, vectorized:
the raw bytes are reshaped to (..., n_blocks, type_size) and the fields read with bit operations.

The first three layouts (ggml-common.h):
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
import numpy as np
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


# ---- the other 32-element blocks (dequantize_row_q4_1, _q5_0, _q5_1, _iq4_nl) -------------------

def _blocks(raw: jnp.ndarray, type_size: int) -> tuple[tuple[int, ...], int, jnp.ndarray]:
    """uint8 rows (..., nblocks*type_size) -> (leading dims, nblocks, blocks (..., nblocks, type_size))."""
    lead = raw.shape[:-1]
    nblk = raw.shape[-1] // type_size
    return lead, nblk, raw.reshape(*lead, nblk, type_size)


def _f16_at(blocks: jnp.ndarray, off: int) -> jnp.ndarray:
    """The ggml_half at byte ``off`` of each block, as f32 (GGML_FP16_TO_FP32), with a trailing axis of 1."""
    return lax.bitcast_convert_type(blocks[..., off:off + 2], jnp.float16).astype(jnp.float32)[..., None]


def _nibbles(qs: jnp.ndarray) -> jnp.ndarray:
    """(..., 16) bytes -> (..., 32) values: the low nibbles (elements 0..15), then the high ones (16..31)."""
    return jnp.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bits(b: jnp.ndarray, width: int = 1) -> jnp.ndarray:
    """(..., m, n) bytes -> (..., m, 8 // width, n): field k of width bits of byte j at [..., k, j]."""
    shifts = jnp.arange(0, 8, width, dtype=jnp.uint8)[:, None]
    return (b[..., None, :] >> shifts) & ((1 << width) - 1)


def _qh32(qh: jnp.ndarray) -> jnp.ndarray:
    """block_q5_0's ``qh`` (4 bytes, a little-endian uint32) -> (..., 32): bit e is element e's fifth bit."""
    return _bits(qh[..., None, :])[..., 0, :, :].swapaxes(-1, -2).reshape(*qh.shape[:-1], 32)


def dequant_q4_1(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q4_1``: block_q4_1 = d, m (f16), 16 bytes of nibbles; x = q*d + m."""
    lead, nblk, b = _blocks(raw, 20)
    q = _nibbles(b[..., 4:]).astype(jnp.float32)
    return (_f16_at(b, 0) * q + _f16_at(b, 2)).reshape(*lead, nblk * QK)


def dequant_q5_0(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q5_0``: block_q5_0 = d (f16), qh (the 32 fifth bits), 16 bytes of nibbles;
    x = d * ((nibble | fifth bit << 4) - 16)."""
    lead, nblk, b = _blocks(raw, 22)
    q = (_nibbles(b[..., 6:]) | (_qh32(b[..., 2:6]) << 4)).astype(jnp.int32) - 16
    return (_f16_at(b, 0) * q.astype(jnp.float32)).reshape(*lead, nblk * QK)


def dequant_q5_1(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q5_1``: block_q5_1 = d, m (f16), qh, 16 bytes of nibbles; x = q*d + m."""
    lead, nblk, b = _blocks(raw, 24)
    q = (_nibbles(b[..., 8:]) | (_qh32(b[..., 4:8]) << 4)).astype(jnp.float32)
    return (_f16_at(b, 0) * q + _f16_at(b, 2)).reshape(*lead, nblk * QK)


# kvalues_iq4nl (ggml-common.h): the 16 non-linear levels of IQ4_NL and IQ4_XS
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def dequant_iq4_nl(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq4_nl``: block_iq4_nl = d (f16), 16 bytes of nibbles as Q4_0's; x = d * kvalues_iq4nl[q]."""
    lead, nblk, b = _blocks(raw, 18)
    q = jnp.asarray(KVALUES_IQ4NL, jnp.float32)[_nibbles(b[..., 2:]).astype(jnp.int32)]
    return (_f16_at(b, 0) * q).reshape(*lead, nblk * QK)


# ---- K-quants: super-blocks of QK_K = 256 elements (dequantize_row_q2_K .. _q6_K, _iq4_xs) -------
# Every product below is exact in f32 (an f16 times small integers) but the last, which rounds once,
# so the order of the multiplications does not change a result.

QK_K = 256


def _per_sub(scale: jnp.ndarray, q: jnp.ndarray) -> jnp.ndarray:
    """(..., n_sub) scales times (..., 256) values, the sub-block of element e being e // (256 / n_sub)."""
    n_sub = scale.shape[-1]
    return (scale[..., None] * q.reshape(*q.shape[:-1], n_sub, QK_K // n_sub)).reshape(q.shape)


def _crumbs(qs: jnp.ndarray) -> jnp.ndarray:
    """Q2_K/Q3_K's ``qs`` (64 bytes) -> (..., 256) 2-bit values: element 128n + 32j + l is bits 2j..2j+1 of
    byte 32n + l (the shift loop of dequantize_row_q2_K)."""
    lead = qs.shape[:-1]
    return _bits(qs.reshape(*lead, 2, 32), 2).reshape(*lead, QK_K)


def dequant_q2_K(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q2_K``: block_q2_K = 16 scale bytes (low nibble: scale, high: min), qs, d, dmin (f16);
    x = d*sc * q - dmin*m per sub-block of 16."""
    lead, nblk, b = _blocks(raw, 84)
    sc = b[..., :16]
    dl = _f16_at(b, 80) * (sc & 0x0F).astype(jnp.float32)
    ml = _f16_at(b, 82) * (sc >> 4).astype(jnp.float32)
    q = _crumbs(b[..., 16:80]).astype(jnp.float32)
    return (_per_sub(dl, q) - jnp.repeat(ml, 16, axis=-1)).reshape(*lead, nblk * QK_K)


def _scales_q3_K(s: jnp.ndarray) -> jnp.ndarray:
    """block_q3_K's 12 scale bytes -> 16 signed 6-bit scales (the aux/kmask shuffle of dequantize_row_q3_K):
    scale i has the low (i < 8) or high nibble of byte i % 8, and bits 2(i // 4).. of byte 8 + i % 4."""
    lo = jnp.concatenate([s[..., :8] & 0x0F, s[..., :8] >> 4], axis=-1)
    hi = _bits(s[..., None, 8:12], 2).reshape(*s.shape[:-1], 16)
    return (lo | (hi << 4)).astype(jnp.int32) - 32


def dequant_q3_K(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q3_K``: block_q3_K = hmask (32 bytes), qs (64), scales (12), d (f16);
    x = d * (scale - 32) * (q - (hmask bit ? 0 : 4)); element 32k + l's hmask bit is bit k of byte l."""
    lead, nblk, b = _blocks(raw, 110)
    hbit = _bits(b[..., None, :32]).reshape(*lead, nblk, QK_K)
    q = _crumbs(b[..., 32:96]).astype(jnp.int32) - jnp.where(hbit != 0, 0, 4)
    dl = _f16_at(b, 108) * _scales_q3_K(b[..., 96:108]).astype(jnp.float32)
    return _per_sub(dl, q.astype(jnp.float32)).reshape(*lead, nblk * QK_K)


def _scale_min_k4(s: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """``get_scale_min_k4`` for j = 0..7 at once: the 6-bit (scale, min) pairs of block_q4_K's 12 bytes."""
    d, m, md = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = jnp.concatenate([d & 63, (md & 0x0F) | ((d >> 6) << 4)], axis=-1)
    mn = jnp.concatenate([m & 63, (md >> 4) | ((m >> 6) << 4)], axis=-1)
    return sc.astype(jnp.float32), mn.astype(jnp.float32)


def _k4_values(qs: jnp.ndarray) -> jnp.ndarray:
    """Q4_K/Q5_K's ``qs`` (128 bytes) -> (..., 256): element 64j + l is the low nibble of byte 32j + l,
    element 64j + 32 + l its high nibble."""
    lead = qs.shape[:-1]
    return _bits(qs.reshape(*lead, 4, 32), 4).reshape(*lead, QK_K)


def _dequant_k4(b: jnp.ndarray, q: jnp.ndarray) -> jnp.ndarray:
    """x = d*sc * q - dmin*m per sub-block of 32 (block_q4_K and block_q5_K start with d, dmin, scales)."""
    sc, mn = _scale_min_k4(b[..., 4:16])
    return _per_sub(_f16_at(b, 0) * sc, q) - jnp.repeat(_f16_at(b, 2) * mn, 32, axis=-1)


def dequant_q4_K(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q4_K``: block_q4_K = d, dmin (f16), scales (12), qs (128)."""
    lead, nblk, b = _blocks(raw, 144)
    return _dequant_k4(b, _k4_values(b[..., 16:]).astype(jnp.float32)).reshape(*lead, nblk * QK_K)


def dequant_q5_K(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q5_K``: block_q5_K = d, dmin (f16), scales (12), qh (32), qs (128); element 32k + l
    adds 16 when bit k of qh[l] is set."""
    lead, nblk, b = _blocks(raw, 176)
    hbit = _bits(b[..., None, 16:48]).reshape(*lead, nblk, QK_K)
    q = (_k4_values(b[..., 48:]) | (hbit << 4)).astype(jnp.float32)
    return _dequant_k4(b, q).reshape(*lead, nblk * QK_K)


def dequant_q6_K(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q6_K``: block_q6_K = ql (128), qh (64), 16 int8 scales, d (f16). In each half n of
    128 elements, element 32k + l takes nibble k // 2 of ql[64n + 32(k % 2) + l] and bits 2k.. of
    qh[32n + l]; x = d * scale[e // 16] * (q - 32)."""
    lead, nblk, b = _blocks(raw, 210)
    ql = _bits(b[..., :128].reshape(*lead, nblk, 2, 64), 4).reshape(*lead, nblk, QK_K)
    qh = _bits(b[..., 128:192].reshape(*lead, nblk, 2, 32), 2).reshape(*lead, nblk, QK_K)
    q = (ql | (qh << 4)).astype(jnp.int32) - 32
    sc = lax.bitcast_convert_type(b[..., 192:208], jnp.int8).astype(jnp.float32)
    return _per_sub(_f16_at(b, 208) * sc, q.astype(jnp.float32)).reshape(*lead, nblk * QK_K)


def dequant_iq4_xs(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq4_xs``: block_iq4_xs = d (f16), scales_h (uint16), scales_l (4), qs (128); sub-block
    ib of 32 has ls = nibble ib % 2 of scales_l[ib / 2] | bits 2ib.. of scales_h << 4, its 16 bytes of qs
    are nibbles as Q4_0's, and x = d * (ls - 32) * kvalues_iq4nl[q]."""
    lead, nblk, b = _blocks(raw, 136)
    sh = _bits(b[..., None, 2:4], 2).swapaxes(-1, -2).reshape(*lead, nblk, 8)  # 2-bit fields of a little-endian u16
    sl = _bits(b[..., None, 4:8], 4).swapaxes(-1, -2).reshape(*lead, nblk, 8)
    ls = (sl | (sh << 4)).astype(jnp.int32) - 32
    idx = _nibbles(b[..., 8:].reshape(*lead, nblk, 8, 16)).astype(jnp.int32)
    q = jnp.asarray(KVALUES_IQ4NL, jnp.float32)[idx].reshape(*lead, nblk, QK_K)
    return _per_sub(_f16_at(b, 0) * ls.astype(jnp.float32), q).reshape(*lead, nblk * QK_K)


# ---- ternary, IQ1/IQ2/IQ3 grids, NVFP4, Q1_0, Q2_0 -----------------------------------------------
# The IQ grids (iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid of ggml-common.h)
# and ksigns_iq2xs are data tables, taken at import from the ``gguf`` package, whose gguf/quants.py
# builds them for its own dequantization (``IQ2_XXS.ksigns`` and each class's ``init_grid()`` /
# ``grid``: the grid's values as f32, one row of 8 or 4 per index).

def _gguf_grid(name: str) -> np.ndarray:
    """ggml-common.h's grid of the gguf.quants class ``name``: (n_index, 8 or 4) f32 values."""
    from gguf import quants as gq

    cls = getattr(gq, name)
    cls.init_grid()
    return np.asarray(cls.grid, np.float32).reshape(cls.grid_shape)


def _ksigns_bits() -> np.ndarray:
    """ksigns_iq2xs (128 sign bytes: 7 sign bits and their parity) as (128, 8) factors +-1 (kmask_iq2xs
    picks bit j for element j)."""
    from gguf import quants as gq

    ks = np.frombuffer(gq.IQ2_XXS.ksigns, dtype=np.uint8)
    bits = (ks[:, None] >> np.arange(8, dtype=np.uint8)) & 1
    return np.where(bits != 0, -1.0, 1.0).astype(np.float32)


IQ2XXS_GRID = _gguf_grid("IQ2_XXS")   # (256, 8)
IQ2XS_GRID = _gguf_grid("IQ2_XS")     # (512, 8)
IQ2S_GRID = _gguf_grid("IQ2_S")       # (1024, 8)
IQ3XXS_GRID = _gguf_grid("IQ3_XXS")   # (256, 4)
IQ3S_GRID = _gguf_grid("IQ3_S")       # (512, 4)
IQ1S_GRID = _gguf_grid("IQ1_S")       # (2048, 8), values -1, 0, 1 (iq1s_grid's int8 bytes)
KSIGNS = _ksigns_bits()               # (128, 8)
IQ1S_DELTA = 0.125


def _u16(b: jnp.ndarray) -> jnp.ndarray:
    """(..., 2n) bytes -> (..., n) little-endian uint16 values, as uint32."""
    w = b.reshape(*b.shape[:-1], -1, 2).astype(jnp.uint32)
    return w[..., 0] | (w[..., 1] << 8)


def _u32(b: jnp.ndarray) -> jnp.ndarray:
    """(..., 4n) bytes -> (..., n) little-endian uint32 values."""
    w = b.reshape(*b.shape[:-1], -1, 4).astype(jnp.uint32)
    return w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)


def _lookup(table: np.ndarray, idx: jnp.ndarray) -> jnp.ndarray:
    """Rows of ``table`` at integer ``idx`` (..., m) -> (..., m * table row length)."""
    rows = jnp.take(jnp.asarray(table), idx.astype(jnp.int32), axis=0)
    return rows.reshape(*idx.shape[:-1], idx.shape[-1] * table.shape[-1])


def _sign_bits(b: jnp.ndarray) -> jnp.ndarray:
    """(..., n) sign bytes -> (..., 8n) factors: element 8k + j is -1 where bit j of byte k is set."""
    return jnp.where(_bits(b[..., None, :]).swapaxes(-1, -2) != 0, -1.0, 1.0).reshape(
        *b.shape[:-1], 8 * b.shape[-1]).astype(jnp.float32)


def _pow3_trits(b: jnp.ndarray, n: int) -> jnp.ndarray:
    """TQ1_0's base-3 digits: (..., m) bytes -> (..., n, m), digit k of byte q being ((uint8)(q * 3^k) * 3) >> 8."""
    pow3 = jnp.asarray([1, 3, 9, 27, 81][:n], jnp.uint32)[:, None]
    q = (b[..., None, :].astype(jnp.uint32) * pow3) & 0xFF
    return ((q * 3) >> 8).astype(jnp.int32)


def dequant_tq1_0(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_tq1_0``: block_tq1_0 = qs (48), qh (4), d (f16); five trits a byte in qs (elements
    0..159 from its first 32 bytes, digit n of byte m being element 32n + m; 160..239 from the next 16), four
    in qh (element 240 + 4n + j); x = (trit - 1) * d."""
    lead, nblk, b = _blocks(raw, 54)
    t = jnp.concatenate([_pow3_trits(b[..., :32], 5).reshape(*lead, nblk, 160),
                         _pow3_trits(b[..., 32:48], 5).reshape(*lead, nblk, 80),
                         _pow3_trits(b[..., 48:52], 4).reshape(*lead, nblk, 16)], axis=-1)
    return ((t - 1).astype(jnp.float32) * _f16_at(b, 52)).reshape(*lead, nblk * QK_K)


def dequant_tq2_0(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_tq2_0``: block_tq2_0 = qs (64), d (f16); 2-bit values laid out as Q2_K's;
    x = (q - 1) * d."""
    lead, nblk, b = _blocks(raw, 66)
    q = _crumbs(b[..., :64]).astype(jnp.int32) - 1
    return (q.astype(jnp.float32) * _f16_at(b, 64)).reshape(*lead, nblk * QK_K)


def dequant_iq2_xxs(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq2_xxs``: block_iq2_xxs = d (f16), 8 groups of 8 bytes per 32 elements: 4 grid
    indices (bytes), then a uint32 of four 7-bit ksigns indices and a 4-bit scale (bits 28..31);
    x = d * (0.5 + scale) * 0.25 * iq2xxs_grid[index][j] * sign."""
    lead, nblk, b = _blocks(raw, 66)
    g = b[..., 2:].reshape(*lead, nblk, 8, 8)
    aux = _u32(g[..., 4:])[..., 0]                                      # (..., 8)
    grid = _lookup(IQ2XXS_GRID, g[..., :4])                             # (..., 8, 32)
    sidx = (aux[..., None] >> jnp.asarray([0, 7, 14, 21], jnp.uint32)) & 127
    signs = _lookup(KSIGNS, sidx)
    db = _f16_at(b, 0) * (0.5 + (aux >> 28).astype(jnp.float32)) * 0.25
    return (db[..., None] * grid * signs).reshape(*lead, nblk * QK_K)


def _db_nibbles(b: jnp.ndarray, d: jnp.ndarray) -> jnp.ndarray:
    """IQ2_XS/IQ2_S's 8 scale bytes -> (..., 16) sub-block scales d * (0.5 + nibble) * 0.25 (low nibble first)."""
    s = jnp.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:-1], 16)
    return d * (0.5 + s.astype(jnp.float32)) * 0.25


def dequant_iq2_xs(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq2_xs``: block_iq2_xs = d (f16), 32 uint16 qs (9-bit iq2xs_grid index, 7-bit ksigns
    index), 8 scale bytes (two nibbles each, one per 16 elements); x = db * grid[j] * sign."""
    lead, nblk, b = _blocks(raw, 74)
    q = _u16(b[..., 2:66])                                              # (..., 32)
    vals = _lookup(IQ2XS_GRID, q & 511) * _lookup(KSIGNS, q >> 9)
    db = _db_nibbles(b[..., 66:74], _f16_at(b, 0))
    return _per_sub(db, vals).reshape(*lead, nblk * QK_K)


def dequant_iq2_s(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq2_s``: block_iq2_s = d (f16), qs (32 index bytes, then 32 sign bytes), qh (8),
    scales (8); group g of 8 elements has index qs[g] | bits 2(g % 4).. of qh[g / 4] << 8 into iq2s_grid."""
    lead, nblk, b = _blocks(raw, 82)
    hi = _bits(b[..., None, 66:74], 2).swapaxes(-1, -2).reshape(*lead, nblk, 32).astype(jnp.uint32)
    idx = b[..., 2:34].astype(jnp.uint32) | (hi << 8)
    grid = _lookup(IQ2S_GRID, idx)
    db = _db_nibbles(b[..., 74:82], _f16_at(b, 0))
    return (_per_sub(db, grid) * _sign_bits(b[..., 34:66])).reshape(*lead, nblk * QK_K)


def dequant_iq3_xxs(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq3_xxs``: block_iq3_xxs = d (f16), qs (64 iq3xxs_grid indices, 4 elements each),
    then 8 uint32 per 32 elements: four 7-bit ksigns indices and a scale (bits 28..31);
    x = d * (0.5 + scale) * 0.5 * grid * sign."""
    lead, nblk, b = _blocks(raw, 98)
    grid = _lookup(IQ3XXS_GRID, b[..., 2:66].reshape(*lead, nblk, 8, 8))    # (..., 8, 32)
    aux = _u32(b[..., 66:98])                                             # (..., 8)
    sidx = (aux[..., None] >> jnp.asarray([0, 7, 14, 21], jnp.uint32)) & 127
    db = _f16_at(b, 0) * (0.5 + (aux >> 28).astype(jnp.float32)) * 0.5
    return (db[..., None] * grid * _lookup(KSIGNS, sidx)).reshape(*lead, nblk * QK_K)


def dequant_iq3_s(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq3_s``: block_iq3_s = d (f16), qs (64), qh (8), signs (32), scales (4); index k is
    qs[k] | bit k % 8 of qh[k / 8] << 8 into iq3s_grid (4 elements), element e's sign bit e % 8 of signs[e / 8],
    and x = d * (1 + 2 * nibble) * grid * sign per 32 elements."""
    lead, nblk, b = _blocks(raw, 110)
    hi = _bits(b[..., None, 66:74]).swapaxes(-1, -2).reshape(*lead, nblk, 64).astype(jnp.uint32)
    grid = _lookup(IQ3S_GRID, b[..., 2:66].astype(jnp.uint32) | (hi << 8))
    s = jnp.stack([b[..., 106:110] & 0x0F, b[..., 106:110] >> 4], axis=-1).reshape(*lead, nblk, 8)
    db = _f16_at(b, 0) * (1 + 2 * s.astype(jnp.int32)).astype(jnp.float32)
    return (_per_sub(db, grid) * _sign_bits(b[..., 74:106])).reshape(*lead, nblk * QK_K)


def _iq1_values(qs: jnp.ndarray, hi: jnp.ndarray, neg: jnp.ndarray) -> jnp.ndarray:
    """IQ1_S/IQ1_M: iq1s_grid[qs | hi << 8] + (neg ? -IQ1S_DELTA : IQ1S_DELTA), groups of 8 -> (..., 256)."""
    grid = _lookup(IQ1S_GRID, qs.astype(jnp.uint32) | (hi.astype(jnp.uint32) << 8))
    delta = jnp.where(neg, -IQ1S_DELTA, IQ1S_DELTA).astype(jnp.float32)
    return grid + jnp.repeat(delta, 8, axis=-1)


def dequant_iq1_s(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq1_s``: block_iq1_s = d (f16), qs (32), qh (8 uint16, one per 32 elements: 3 index
    bits per group of 8, a 3-bit scale in bits 12..14, the delta's sign in bit 15);
    x = d * (2 * scale + 1) * (grid + delta)."""
    lead, nblk, b = _blocks(raw, 50)
    qh = _u16(b[..., 34:50])                                            # (..., 8)
    hi = ((qh[..., None] >> jnp.asarray([0, 3, 6, 9], jnp.uint32)) & 7).reshape(*lead, nblk, 32)
    neg = jnp.repeat((qh & 0x8000) != 0, 4, axis=-1)
    dl = _f16_at(b, 0) * (2 * ((qh >> 12) & 7) + 1).astype(jnp.float32)
    return _per_sub(dl, _iq1_values(b[..., 2:34], hi, neg)).reshape(*lead, nblk * QK_K)


def dequant_iq1_m(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_iq1_m``: block_iq1_m = qs (32), qh (16: a nibble per group of 8, 3 index bits and the
    delta's sign), scales (4 uint16: four 3-bit scales, one per 16 elements, and 4 bits of the f16 super-block
    scale in bits 12..15 of each, iq1m_scale_t); x = d * (2 * scale + 1) * (grid + delta)."""
    lead, nblk, b = _blocks(raw, 56)
    nib = jnp.stack([b[..., 32:48] & 0x0F, b[..., 32:48] >> 4], axis=-1).reshape(*lead, nblk, 32)
    sc = _u16(b[..., 48:56])                                            # (..., 4)
    dbits = ((sc[..., 0] >> 12) | ((sc[..., 1] >> 8) & 0x00F0) | ((sc[..., 2] >> 4) & 0x0F00)
             | (sc[..., 3] & 0xF000)).astype(jnp.uint16)
    d = lax.bitcast_convert_type(dbits, jnp.float16).astype(jnp.float32)[..., None]
    s = ((sc[..., None] >> jnp.asarray([0, 3, 6, 9], jnp.uint32)) & 7).reshape(*lead, nblk, 16)
    dl = d * (2 * s + 1).astype(jnp.float32)
    vals = _iq1_values(b[..., :32], nib & 7, (nib & 8) != 0)
    return _per_sub(dl, vals).reshape(*lead, nblk * QK_K)


QK_NVFP4 = 64


def _ue4m3_to_fp32(x: jnp.ndarray) -> jnp.ndarray:
    """``ggml_ue4m3_to_fp32`` (the 0.5 of the doubled kvalues included): bit 7 ignored, 0 and 0x7F give 0,
    exponent 0 gives man * 2^-10, else (1 + man/8) * 2^(exp - 8), built from its f32 bits."""
    x32 = x.astype(jnp.uint32)
    e, m = (x32 >> 3) & 0xF, x32 & 7
    normal = lax.bitcast_convert_type(((e + 119) << 23) | (m << 20), jnp.float32)
    v = jnp.where(e == 0, m.astype(jnp.float32) * (2.0 ** -10), normal)
    return jnp.where((x32 == 0) | (x32 == 0x7F), 0.0, v).astype(jnp.float32)


def dequant_nvfp4(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_nvfp4``: block_nvfp4 = d (4 UE4M3 scales, one per 16 elements), qs (32 bytes: 8 per
    sub-block, element j < 8 the low nibble of byte j, 8 + j its high nibble); x = kvalues_mxfp4[q] * d."""
    lead, nblk, b = _blocks(raw, 36)
    idx = _nibbles(b[..., 4:].reshape(*lead, nblk, 4, 8)).astype(jnp.int32)    # (..., 4, 16)
    q = jnp.asarray(KVALUES_MXFP4, jnp.float32)[idx]
    return (q * _ue4m3_to_fp32(b[..., :4])[..., None]).reshape(*lead, nblk * QK_NVFP4)


def dequant_q1_0(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q1_0``: block_q1_0 = d (f16), qs (16 bytes, element j bit j % 8 of byte j / 8);
    x = bit ? d : -d."""
    lead, nblk, b = _blocks(raw, 18)
    bit = _bits(b[..., None, 2:]).swapaxes(-1, -2).reshape(*lead, nblk, 128)
    d = _f16_at(b, 0)
    return jnp.where(bit != 0, d, -d).reshape(*lead, nblk * 128)


def dequant_q2_0(raw: jnp.ndarray) -> jnp.ndarray:
    """``dequantize_row_q2_0``: block_q2_0 = d (f16), qs (16 bytes, element j bits 2(j % 4).. of byte j / 4);
    x = (q - 1) * d."""
    lead, nblk, b = _blocks(raw, 18)
    q = _bits(b[..., None, 2:], 2).swapaxes(-1, -2).reshape(*lead, nblk, 64).astype(jnp.int32) - 1
    return (q.astype(jnp.float32) * _f16_at(b, 0)).reshape(*lead, nblk * 64)


DEQUANT = {GGMLType.Q8_0: dequant_q8_0, GGMLType.Q4_0: dequant_q4_0, GGMLType.MXFP4: dequant_mxfp4,
           GGMLType.Q4_1: dequant_q4_1, GGMLType.Q5_0: dequant_q5_0, GGMLType.Q5_1: dequant_q5_1,
           GGMLType.Q2_K: dequant_q2_K, GGMLType.Q3_K: dequant_q3_K, GGMLType.Q4_K: dequant_q4_K,
           GGMLType.Q5_K: dequant_q5_K, GGMLType.Q6_K: dequant_q6_K, GGMLType.IQ4_NL: dequant_iq4_nl,
           GGMLType.IQ4_XS: dequant_iq4_xs,
           GGMLType.TQ1_0: dequant_tq1_0, GGMLType.TQ2_0: dequant_tq2_0,
           GGMLType.IQ2_XXS: dequant_iq2_xxs, GGMLType.IQ2_XS: dequant_iq2_xs, GGMLType.IQ2_S: dequant_iq2_s,
           GGMLType.IQ3_XXS: dequant_iq3_xxs, GGMLType.IQ3_S: dequant_iq3_s, GGMLType.IQ1_S: dequant_iq1_s,
           GGMLType.IQ1_M: dequant_iq1_m, GGMLType.NVFP4: dequant_nvfp4, GGMLType.Q1_0: dequant_q1_0,
           GGMLType.Q2_0: dequant_q2_0}


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
