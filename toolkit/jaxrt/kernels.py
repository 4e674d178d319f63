"""ggml ops as JAX functions, with ggml's semantics (ggml-cpu/ops.cpp is the reference).

Values are logical arrays in numpy order ``(ne3, ne2, ne1, ne0)``. :data:`KERNELS` is the table
op -> :class:`~toolkit.jaxrt.operands.Kernel`, one entry per op the runtime runs (the MoE ops of
:mod:`toolkit.jaxrt.kernels_moe` included); an op without an entry raises
:class:`~toolkit.errors.UnsupportedFeature` naming it. :class:`Env` holds the flat storage of every
base tensor and evaluates nodes in graph order: view ops cost nothing (a later read goes through the
view's strides), the nodes that overwrite the tensor they view (:func:`writes_into_view`: SET_ROWS,
CPY, CLAMP, and SCALE made by ``ggml_scale_inplace``) return a new version of that base's storage, every
other node makes a new base.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from toolkit.errors import UnsupportedFeature
from toolkit.ggml.tensor import GluOp, Op, Tensor, UnaryOp, is_view_op
from toolkit.ggml.types import GGMLType
from toolkit.jaxrt import layout
from toolkit.jaxrt.kernels_gptoss import GPTOSS_KERNELS, sinks_denominator, swiglu_oai
from toolkit.jaxrt.kernels_moe import MOE_KERNELS
from toolkit.jaxrt.kernels_recurrent import (
    RECURRENT_KERNELS,
    ROPE_TYPE_MROPE,
    mrope_pair_positions,
    rope_sections,
    softplus,
)
from toolkit.jaxrt.operands import (
    CPU_NUMERICS,
    Kernel,
    Numerics,
    Reader,
    opt_src,
    param_enum,
    param_f32,
    param_flag,
    param_i32,
    shape_of,
    src,
)
from toolkit.jaxrt.quant import dequantize

HIGHEST = jax.lax.Precision.HIGHEST
GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654


def as_f32(x: jnp.ndarray, type_: GGMLType) -> jnp.ndarray:
    """A logical value as f32: dequantized rows for a quantized type (toolkit.jaxrt.quant), a cast otherwise."""
    if type_.is_quantized:
        return dequantize(x, type_)
    return x.astype(jnp.float32)


def tile_to(b: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
    """ggml's repeat rule: b is *tiled* (index i % ne_b) to shape, dim by dim."""
    reps = tuple(n // m for n, m in zip(shape, b.shape))
    if all(r == 1 or m == 1 for r, m in zip(reps, b.shape)):
        return jnp.broadcast_to(b, shape)
    return jnp.tile(b, reps)


# ---- matmul and attention ---------------------------------------------------------------

def mul_mat(a: jnp.ndarray, b: jnp.ndarray) -> jnp.ndarray:
    """result[i3, i2, j, i] = dot(a[i3 // r3, i2 // r2, i, :], b[i3, i2, j, :]) (ggml_mul_mat).

    The broadcast rows of b are folded into one batched matmul per (i3, i2) of a, with both
    batch dims leading, which is the form XLA's dot emitters run fastest."""
    a3, a2, m, k = a.shape
    b3, b2, n, _ = b.shape
    r3, r2 = b3 // a3, b2 // a2
    if a3 == a2 == 1:  # a 2-D weight: one plain matmul over all of b's rows
        out = jnp.matmul(b.reshape(b3 * b2 * n, k), a[0, 0].T, precision=HIGHEST)
        return out.reshape(b3, b2, n, m)
    bb = b.reshape(a3, r3, a2, r2, n, k)
    if r3 * r2 > 1:
        bb = jnp.transpose(bb, (0, 2, 1, 3, 4, 5))
    out = jnp.matmul(bb.reshape(a3, a2, r3 * r2 * n, k), jnp.swapaxes(a, -1, -2), precision=HIGHEST)
    out = out.reshape(a3, a2, r3, r2, n, m)
    if r3 * r2 > 1:
        out = jnp.transpose(out, (0, 2, 1, 3, 4, 5))
    return out.reshape(b3, b2, n, m)


# ggml-cpu's vec_dot_type of the float types (type_traits_cpu): ggml_compute_forward_mul_mat converts
# src1 to it (from_float) before the dot products, so a product with an F16 tensor (an F16 weight, the
# F16 KV cache's K and V) sees src1 rounded to F16; F32 and the quantized types keep src1 in f32 here
VEC_DOT_FLOAT = {GGMLType.F16: jnp.float16, GGMLType.BF16: jnp.bfloat16}


def mul_mat_src1(b: jnp.ndarray, a_type: GGMLType) -> jnp.ndarray:
    """src1 of a MUL_MAT as ggml_compute_forward_mul_mat multiplies it: in src0's float vec_dot_type."""
    dt = VEC_DOT_FLOAT.get(a_type)
    return b if dt is None else b.astype(dt).astype(jnp.float32)


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """Per-head mask slopes (1 when max_bias is 0), as ggml's soft_max / flash_attn compute them."""
    if max_bias <= 0.0:
        return np.ones(n_head, np.float32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    return np.array([m0 ** (h + 1) if h < n_head_log2 else m1 ** (2 * (h - n_head_log2) + 1)
                     for h in range(n_head)], np.float32)


def _mask_for(mask: jnp.ndarray, ne3: int, ne2: int, ne1: int) -> jnp.ndarray:
    """Mask rows 0..ne1-1, broadcast over dims 2 and 3 by i % ne_mask (ggml soft_max, flash_attn)."""
    m = mask[:, :, :ne1, :]
    for axis, n in ((1, ne2), (0, ne3)):
        if m.shape[axis] != n and m.shape[axis] != 1:
            m = jnp.take(m, np.arange(n) % m.shape[axis], axis=axis)
    return m  # size-1 dims broadcast


def _add_mask(x: jnp.ndarray, mask: jnp.ndarray, max_bias: float) -> jnp.ndarray:
    m = _mask_for(mask.astype(jnp.float32), *x.shape[:3])
    if max_bias > 0.0:
        m = jnp.asarray(alibi_slopes(x.shape[1], max_bias))[None, :, None, None] * m
    return x + m


def soft_max_ext(a: jnp.ndarray, mask: jnp.ndarray | None, scale: float, max_bias: float,
                 sinks: jnp.ndarray | None = None) -> jnp.ndarray:
    """``ggml_soft_max_ext`` over a (S, H, T, n_kv); ``sinks`` (per head, ``ggml_soft_max_add_sinks``)
    join the denominator."""
    x = a * scale
    if mask is not None:
        x = _add_mask(x, mask, max_bias)
    if sinks is None:
        return jax.nn.softmax(x, axis=-1)
    p, denom = sinks_denominator(x, sinks, 1)
    return p / denom


def flash_attn_ext(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray | None,
    scale: float, max_bias: float, logit_softcap: float, sinks: jnp.ndarray | None = None,
) -> jnp.ndarray:
    """q (S, H, n_q, D), k (Sk, Hk, n_kv, D), v (Sk, Hk, n_kv, Dv) -> (S, n_q, H, Dv) (ggml ne [Dv, H, n_q, S]);
    ``sinks`` (per head, ``ggml_flash_attn_ext_add_sinks``) join the denominator."""
    s3, h, nq, d = q.shape
    k3, hk, nkv, _ = k.shape
    rk3, rk2 = s3 // k3, h // hk
    # fold the query heads sharing a KV head (GQA) into rows: one batched matmul per KV head
    qq = jnp.transpose(q.reshape(k3, rk3, hk, rk2, nq, d), (0, 2, 1, 3, 4, 5)).reshape(k3, hk, rk3 * rk2 * nq, d)
    if logit_softcap != 0.0:
        scale = scale / logit_softcap
    s = jnp.matmul(qq, jnp.swapaxes(k, -1, -2), precision=HIGHEST) * scale
    s = jnp.transpose(s.reshape(k3, hk, rk3, rk2, nq, nkv), (0, 2, 1, 3, 4, 5)).reshape(s3, h, nq, nkv)
    if logit_softcap != 0.0:
        s = logit_softcap * jnp.tanh(s)
    if mask is not None:
        s = _add_mask(s, mask, max_bias)
    p, denom = sinks_denominator(s, sinks, 1)
    # a fully masked row gives 0, as ggml's S == 0 guard does
    p = p / jnp.where(denom == 0.0, 1.0, denom)
    pp = jnp.transpose(p.reshape(k3, rk3, hk, rk2, nq, nkv), (0, 2, 1, 3, 4, 5)).reshape(k3, hk, rk3 * rk2 * nq, nkv)
    out = jnp.matmul(pp, v, precision=HIGHEST).reshape(k3, hk, rk3, rk2, nq, v.shape[-1])
    out = jnp.transpose(out, (0, 2, 1, 3, 4, 5)).reshape(s3, h, nq, v.shape[-1])
    return jnp.transpose(out, (0, 2, 1, 3))


# ---- rope ---------------------------------------------------------------------------------

def _yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def rope(a: jnp.ndarray, pos: jnp.ndarray, freq_factors: jnp.ndarray | None, node: Tensor) -> jnp.ndarray:
    """ggml_rope_ext: a (ne3, T, H, D) with positions per ne2 index; mode 0 rotates (x[2i], x[2i+1]),
    NEOX (mode & 2) rotates (x[i], x[i + n_dims/2]); theta_i = pos * base^(-2i/n_dims), YaRN when ext_factor.
    ggml_rope_multi (op param ``sections``): four positions per token, pair i's from its section
    (kernels_recurrent.mrope_pair_positions), rotated as NEOX."""
    n_dims = param_i32(node, "n_dims")
    mode = param_i32(node, "mode", 0)
    base = param_f32(node, "freq_base", 10000.0)
    freq_scale = param_f32(node, "freq_scale", 1.0)
    ext_factor = param_f32(node, "ext_factor", 0.0)
    mscale = param_f32(node, "attn_factor", 1.0)
    half = n_dims // 2
    i0 = np.arange(half, dtype=np.float32) * 2
    sections = rope_sections(node)
    pair_pos = (pos.astype(jnp.float32)[:, None] if sections is None
                else mrope_pair_positions(pos, sections, mode, a.shape[1], half))
    theta_extrap = pair_pos * jnp.asarray(base ** (-i0 / n_dims), jnp.float32)[None, :]
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.reshape(-1)[:half][None, :]
    theta = freq_scale * theta_extrap
    if ext_factor != 0.0:
        n_ctx_orig = param_i32(node, "n_ctx_orig", 0)
        lo = max(0.0, math.floor(_yarn_corr_dim(n_dims, n_ctx_orig, param_f32(node, "beta_fast", 32.0), base)))
        hi = min(n_dims - 1.0, math.ceil(_yarn_corr_dim(n_dims, n_ctx_orig, param_f32(node, "beta_slow", 1.0), base)))
        y = (np.arange(half) - lo) / max(0.001, hi - lo)
        ramp = jnp.asarray((1 - np.clip(y, 0, 1)) * ext_factor, jnp.float32)
        theta = theta * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    cos = (jnp.cos(theta) * mscale)[None, :, None, :]
    sin = (jnp.sin(theta) * mscale)[None, :, None, :]
    x = a.astype(jnp.float32)
    rot, rest = x[..., :n_dims], x[..., n_dims:]
    if mode & 2 or mode & ROPE_TYPE_MROPE:  # GGML_ROPE_TYPE_NEOX; M-RoPE and IMROPE rotate the same pairs
        x0, x1 = rot[..., :half], rot[..., half:]
        out = jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    else:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(rot.shape)
    return jnp.concatenate([out, rest], axis=-1)


# ---- element-wise -------------------------------------------------------------------------

def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """``ggml_gelu_f32``: the tanh-approximated GELU in f32."""
    return 0.5 * x * (1.0 + jnp.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


def gelu_f16_table(x: jnp.ndarray) -> jnp.ndarray:
    """ggml-cpu's GELU of an f32 value (``ggml_vec_gelu_f32`` / ``ggml_vec_geglu_f32`` under
    ``GGML_GELU_FP16``): 0 at or below -10, x at or above 10, and between them
    ``ggml_table_gelu_f16`` at x rounded to f16, i.e. ``ggml_gelu_f32`` of that f16 value stored as
    f16 (``ggml_cpu_init`` fills the table so). The entry is computed where it is read, which gives
    the table's values without its 65536 entries."""
    mid = gelu(x.astype(jnp.float16).astype(jnp.float32)).astype(jnp.float16).astype(x.dtype)
    return jnp.where(x <= -10.0, jnp.zeros_like(x), jnp.where(x >= 10.0, x, mid))


def _gelu_of(r: Reader) -> Callable[[jnp.ndarray], jnp.ndarray]:
    return gelu_f16_table if r.numerics.gelu_f16_table else gelu


UNARY: dict[UnaryOp, Callable[[jnp.ndarray], jnp.ndarray]] = {
    UnaryOp.ABS: jnp.abs, UnaryOp.NEG: jnp.negative, UnaryOp.TANH: jnp.tanh, UnaryOp.RELU: jax.nn.relu,
    UnaryOp.SIGMOID: jax.nn.sigmoid, UnaryOp.GELU: gelu, UnaryOp.SILU: jax.nn.silu, UnaryOp.EXP: jnp.exp,
    UnaryOp.SOFTPLUS: softplus,
}
GLU_ACT: dict[GluOp, Callable[[jnp.ndarray], jnp.ndarray]] = {
    GluOp.SWIGLU: jax.nn.silu, GluOp.GEGLU: gelu, GluOp.REGLU: jax.nn.relu,
}
# GLU kinds that are not act(x0) * x1: f(node, x0, x1)
GLU_PAIR: dict[GluOp, Callable[[Tensor, jnp.ndarray, jnp.ndarray], jnp.ndarray]] = {
    GluOp.SWIGLU_OAI: lambda n, x0, x1: swiglu_oai(x0, x1, param_f32(n, "alpha"), param_f32(n, "limit")),
}


def rms_norm(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def norm(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    xc = x - jnp.mean(x, axis=-1, keepdims=True)
    return xc * jax.lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + eps)


def get_rows(raw: jnp.ndarray, a_type: GGMLType, ids: jnp.ndarray) -> jnp.ndarray:
    """Rows of a picked per (i12, i11) batch: result[i12, i11, i10] = a[i12, i11, ids[i12, i11, i10]].

    The raw rows are gathered before dequantizing, so only the picked rows are expanded."""
    b2, b1, n = ids.shape[1], ids.shape[2], ids.shape[3]
    i3 = np.arange(b2)[:, None, None]
    i2 = np.arange(b1)[None, :, None]
    rows = raw[i3, i2, ids[0].astype(jnp.int32)]
    if a_type is GGMLType.I32:
        return rows
    return as_f32(rows, a_type).reshape(b2, b1, n, -1)


# ---- the kernel table ----------------------------------------------------------------------
# One entry per ggml op the runtime runs: ``Kernel(fn)``, where ``fn(node, reader)`` returns the
# node's logical value (see toolkit.jaxrt.operands). Adding an op is adding its entry.

def _f32(i: int) -> Callable[[Tensor, Reader], jnp.ndarray]:
    """The f32 value of source slot i."""
    return lambda n, r: r.read_f32(src(n, i))


def _opt_f32(n: Tensor, r: Reader, i: int) -> jnp.ndarray | None:
    s = opt_src(n, i)
    return r.read_f32(s) if s is not None else None


def _map(fn: Callable[[jnp.ndarray], jnp.ndarray]) -> Kernel:
    """An element-wise op of source 0."""
    return Kernel(lambda n, r: fn(r.read_f32(src(n, 0))))


def _binary(fn: Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]) -> Kernel:
    """ADD, SUB, MUL, DIV: source 1 tiled to source 0's shape (ggml_can_repeat)."""
    def k(n: Tensor, r: Reader) -> jnp.ndarray:
        a = r.read_f32(src(n, 0))
        return fn(a, tile_to(r.read_f32(src(n, 1)), a.shape))
    return Kernel(k)


def _unsupported(node: Tensor, what: str) -> UnsupportedFeature:
    return UnsupportedFeature(
        f"op {what}", f"the JAX runtime has no kernel for {what} (node {node.name!r}); "
        "toolkit.jaxrt.kernels.KERNELS lists the ops it runs")


def _unary(n: Tensor, r: Reader) -> jnp.ndarray:
    op = param_enum(n, "unary", UnaryOp)
    fn = _gelu_of(r) if op is UnaryOp.GELU else UNARY.get(op)
    if fn is None:
        raise _unsupported(n, n.op_desc())
    return fn(r.read_f32(src(n, 0)))


def _glu(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_glu / ggml_glu_split: act(x0) * x1 (or a GLU_PAIR kind), the halves of source 0 or sources 0 and 1."""
    kind = param_enum(n, "glu", GluOp)
    act, pair = GLU_ACT.get(kind), GLU_PAIR.get(kind)
    if act is None and pair is None:
        raise _unsupported(n, n.op_desc())
    a = r.read_f32(src(n, 0))
    b = _opt_f32(n, r, 1)
    if b is not None:
        x0, x1 = a, b
    else:
        nc = a.shape[-1] // 2
        x0, x1 = a[..., :nc], a[..., nc:]
    if param_flag(n, "swapped"):
        x0, x1 = x1, x0
    if pair is not None:
        return pair(n, x0, x1)
    assert act is not None
    if kind is GluOp.GEGLU:
        act = _gelu_of(r)
    return act(x0) * x1


def _cont(n: Tensor, r: Reader) -> jnp.ndarray:
    """CONT, DUP: source 0 in its own type (I32 stays I32) reshaped to the node's contiguous shape."""
    a = src(n, 0)
    x = r.read(a)
    return (x if a.type is GGMLType.I32 else as_f32(x, a.type)).reshape(shape_of(n))


def _mul_mat(n: Tensor, r: Reader) -> jnp.ndarray:
    a = src(n, 0)
    return mul_mat(r.read_f32(a), mul_mat_src1(r.read_f32(src(n, 1)), a.type))


def _get_rows(n: Tensor, r: Reader) -> jnp.ndarray:
    a = src(n, 0)
    return get_rows(r.read(a), a.type, r.read(src(n, 1)))


def _rope(n: Tensor, r: Reader) -> jnp.ndarray:
    return rope(r.read_f32(src(n, 0)), r.read(src(n, 1)).reshape(-1), _opt_f32(n, r, 2), n)


def _soft_max(n: Tensor, r: Reader) -> jnp.ndarray:
    return soft_max_ext(r.read_f32(src(n, 0)), _opt_f32(n, r, 1), param_f32(n, "scale"),
                        param_f32(n, "max_bias", 0.0), _opt_f32(n, r, 2))


def _flash_attn_ext(n: Tensor, r: Reader) -> jnp.ndarray:
    return flash_attn_ext(r.read_f32(src(n, 0)), r.read_f32(src(n, 1)), r.read_f32(src(n, 2)), _opt_f32(n, r, 3),
                          param_f32(n, "scale"), param_f32(n, "max_bias", 0.0), param_f32(n, "logit_softcap", 0.0),
                          _opt_f32(n, r, 4))


def _diag_mask_inf(n: Tensor, r: Reader) -> jnp.ndarray:
    shape = shape_of(n)
    n_past = param_i32(n, "n_past")
    cols = np.arange(shape[3])[None, :]
    rows = np.arange(shape[2])[:, None]
    return jnp.where(jnp.asarray(cols > n_past + rows), -jnp.inf, r.read_f32(src(n, 0)))


# ops whose node is a view of an existing tensor that they overwrite: fn returns that base's new storage

def _set_rows(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_set_rows(dst, rows, ids): sources (rows, ids, dst); the rows land in dst at the ids."""
    return layout.write_rows(r.flat(src(n, 2)), n, r.read_f32(src(n, 0)), r.read(src(n, 1))[0])


def _cpy(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_cpy(a, b): a's values, converted to b's type, written through the view of b."""
    return layout.write(r.flat(src(n, 1)), n, r.read_f32(src(n, 0)).reshape(shape_of(n)))


def _clamp(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_clamp returns a view of a: the clipped values are written in place."""
    a = src(n, 0)
    return layout.write(r.flat(a), n, jnp.clip(r.read_f32(a), param_f32(n, "min"), param_f32(n, "max")))


def _pad(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_pad_ext (not circular): zeros ``lp<i>`` before and ``rp<i>`` after dimension i."""
    widths = [(param_i32(n, f"lp{i}"), param_i32(n, f"rp{i}")) for i in (3, 2, 1, 0)]
    if param_i32(n, "circular"):
        raise _unsupported(n, "PAD (circular)")
    return jnp.pad(r.read_f32(src(n, 0)), widths)


def _scale(n: Tensor, r: Reader) -> jnp.ndarray:
    """ggml_scale: ``a * s + b``; ``ggml_scale_inplace`` (the node a view of a) writes it into a, as a
    hybrid's ``build_rs`` clears the state of cell ``rs_z``."""
    a = src(n, 0)
    out = r.read_f32(a) * param_f32(n, "s") + param_f32(n, "b", 0.0)
    return layout.write(r.flat(a), n, out) if n.view_src is not None else out


KERNELS: dict[Op, Kernel] = {
    Op.ADD: _binary(jnp.add), Op.SUB: _binary(jnp.subtract), Op.MUL: _binary(jnp.multiply),
    Op.DIV: _binary(jnp.divide),
    Op.ADD1: Kernel(lambda n, r: r.read_f32(src(n, 0)) + r.read_f32(src(n, 1)).reshape(())),
    Op.MUL_MAT: Kernel(_mul_mat),
    Op.RMS_NORM: Kernel(lambda n, r: rms_norm(r.read_f32(src(n, 0)), param_f32(n, "eps"))),
    Op.NORM: Kernel(lambda n, r: norm(r.read_f32(src(n, 0)), param_f32(n, "eps"))),
    Op.SCALE: Kernel(_scale, writes_view_src=True),
    Op.GET_ROWS: Kernel(_get_rows),
    Op.ROPE: Kernel(_rope),
    Op.SOFT_MAX: Kernel(_soft_max),
    Op.FLASH_ATTN_EXT: Kernel(_flash_attn_ext),
    Op.GLU: Kernel(_glu),
    Op.UNARY: Kernel(_unary),
    Op.CONT: Kernel(_cont), Op.DUP: Kernel(_cont),
    Op.SQR: _map(jnp.square), Op.SQRT: _map(jnp.sqrt), Op.LOG: _map(jnp.log),
    Op.SIN: _map(jnp.sin), Op.COS: _map(jnp.cos),
    Op.SUM: Kernel(lambda n, r: jnp.sum(r.read_f32(src(n, 0))).reshape(shape_of(n))),
    Op.SUM_ROWS: _map(lambda x: jnp.sum(x, axis=-1, keepdims=True)),
    Op.MEAN: _map(lambda x: jnp.mean(x, axis=-1, keepdims=True)),
    Op.ARGMAX: Kernel(lambda n, r: jnp.argmax(r.read_f32(src(n, 0)), axis=-1).astype(jnp.int32).reshape(shape_of(n))),
    Op.REPEAT: Kernel(lambda n, r: tile_to(r.read_f32(src(n, 0)), shape_of(n))),
    Op.CONCAT: Kernel(lambda n, r: jnp.concatenate([r.read_f32(src(n, 0)), r.read_f32(src(n, 1))],
                                                   axis=3 - param_i32(n, "dim"))),
    Op.FILL: Kernel(lambda n, r: jnp.full(shape_of(n), param_f32(n, "c"), jnp.float32)),
    Op.DIAG_MASK_INF: Kernel(_diag_mask_inf),
    Op.PAD: Kernel(_pad),
    Op.SET_ROWS: Kernel(_set_rows, writes_view_src=True),
    Op.CPY: Kernel(_cpy, writes_view_src=True),
    Op.CLAMP: Kernel(_clamp, writes_view_src=True),
    **MOE_KERNELS,
    **GPTOSS_KERNELS,
    **RECURRENT_KERNELS,
}

# the ops whose nodes may write into a tensor they did not create (toolkit.jaxrt.compile)
VIEW_SRC_WRITERS = frozenset(op for op, k in KERNELS.items() if k.writes_view_src)


def writes_into_view(node: Tensor) -> bool:
    """Whether ``node`` overwrites the tensor it views: an op of :data:`VIEW_SRC_WRITERS` whose node is a
    view (``ggml_scale`` makes a new tensor, ``ggml_scale_inplace`` a view of its source)."""
    return node.op in VIEW_SRC_WRITERS and node.view_src is not None


def kernel_for(node: Tensor) -> Kernel:
    """The table's kernel for ``node``'s op; an op without one raises UnsupportedFeature naming it."""
    k = KERNELS.get(node.op)
    if k is None:
        raise _unsupported(node, node.op_desc())
    return k


# ---- the evaluator -----------------------------------------------------------------------

class Env:
    """Flat storage of base tensors; ``eval(node)`` runs one ggml node functionally (a :class:`Reader`)."""

    def __init__(self, values: dict[Tensor, jnp.ndarray] | None = None, numerics: Numerics = CPU_NUMERICS) -> None:
        self.values: dict[Tensor, jnp.ndarray] = dict(values or {})
        self.numerics = numerics
        self.written: list[Tensor] = []  # bases created or updated, in order

    def flat(self, t: Tensor) -> jnp.ndarray:
        base = t.view_src if t.view_src is not None else t
        try:
            return self.values[base]
        except KeyError:
            raise KeyError(f"no value for {base.name!r} (needed by a read of {t.name!r})") from None

    def read(self, t: Tensor) -> jnp.ndarray:
        return layout.read(self.flat(t), t)

    def read_f32(self, t: Tensor) -> jnp.ndarray:
        return as_f32(self.read(t), t.type)

    def _set(self, base: Tensor, flat: jnp.ndarray) -> None:
        self.values[base] = flat
        self.written.append(base)

    def eval(self, node: Tensor) -> None:
        if is_view_op(node.op) or node.op is Op.NONE:
            return  # views are read through their strides when used (ggml_view_tensor)
        k = kernel_for(node)
        if node.nelements == 0:  # an empty op (a hybrid's s_copy_extra rows with every state in the ubatch)
            if not writes_into_view(node):  # writes nothing into its view's base
                self._set(node, jnp.zeros(0, layout.storage_dtype(node.type)))
            return
        out = k.fn(node, self)
        if node.view_src is not None and writes_into_view(node):
            self._set(node.view_src, out)
        else:
            self._set(node, out.astype(layout.storage_dtype(node.type)).reshape(-1))


def eval_nodes(nodes: list[Tensor], values: dict[Tensor, jnp.ndarray], numerics: Numerics = CPU_NUMERICS) -> Env:
    """Evaluate nodes in order over the given base storage (a convenience for tests)."""
    env = Env(values, numerics)
    for n in nodes:
        env.eval(n)
    return env
