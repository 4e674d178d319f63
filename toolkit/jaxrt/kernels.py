"""ggml ops as JAX functions, with ggml's semantics (ggml-cpu/ops.cpp is the reference).

Values are logical arrays in numpy order ``(ne3, ne2, ne1, ne0)``. :class:`Env` holds the
flat storage of every base tensor and evaluates nodes in graph order: view ops cost nothing
(a later read goes through the view's strides), in-place ops (SET_ROWS, CPY, CLAMP) return a
new version of their base's storage, every other op makes a new base.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from toolkit.ggml.tensor import MAX_SRC, GluOp, Op, Tensor, UnaryOp, is_view_op
from toolkit.ggml.types import GGMLType
from toolkit.jaxrt import layout
from toolkit.jaxrt.kernels_moe import MOE_KERNELS
from toolkit.jaxrt.quant import dequantize

HIGHEST = jax.lax.Precision.HIGHEST
GELU_COEF_A = 0.044715
SQRT_2_OVER_PI = 0.7978845608028654


def as_f32(x: jnp.ndarray, type_: GGMLType) -> jnp.ndarray:
    """A logical value as f32: dequantized rows for Q8_0/Q4_0, a cast otherwise."""
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


def soft_max_ext(a: jnp.ndarray, mask: jnp.ndarray | None, scale: float, max_bias: float) -> jnp.ndarray:
    x = a * scale
    if mask is not None:
        x = _add_mask(x, mask, max_bias)
    return jax.nn.softmax(x, axis=-1)


def flash_attn_ext(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray | None,
    scale: float, max_bias: float, logit_softcap: float,
) -> jnp.ndarray:
    """q (S, H, n_q, D), k (Sk, Hk, n_kv, D), v (Sk, Hk, n_kv, Dv) -> (S, n_q, H, Dv) (ggml ne [Dv, H, n_q, S])."""
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
    mx = jnp.max(s, axis=-1, keepdims=True)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    p = jnp.exp(s - mx)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    # a fully masked row gives 0, as ggml's S == 0 guard does
    p = p / jnp.where(denom == 0.0, 1.0, denom)
    pp = jnp.transpose(p.reshape(k3, rk3, hk, rk2, nq, nkv), (0, 2, 1, 3, 4, 5)).reshape(k3, hk, rk3 * rk2 * nq, nkv)
    out = jnp.matmul(pp, v, precision=HIGHEST).reshape(k3, hk, rk3, rk2, nq, v.shape[-1])
    out = jnp.transpose(out, (0, 2, 1, 3, 4, 5)).reshape(s3, h, nq, v.shape[-1])
    return jnp.transpose(out, (0, 2, 1, 3))


# ---- rope ---------------------------------------------------------------------------------

def _yarn_corr_dim(n_dims: int, n_ctx_orig: int, n_rot: float, base: float) -> float:
    return n_dims * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))


def rope(a: jnp.ndarray, pos: jnp.ndarray, freq_factors: jnp.ndarray | None, p: dict[str, object]) -> jnp.ndarray:
    """ggml_rope_ext: a (ne3, T, H, D) with positions per ne2 index; mode 0 rotates (x[2i], x[2i+1]),
    NEOX (mode & 2) rotates (x[i], x[i + n_dims/2]); theta_i = pos * base^(-2i/n_dims), YaRN when ext_factor."""
    n_dims = int(p["n_dims"])  # type: ignore[call-overload]
    mode = int(p.get("mode", 0))  # type: ignore[call-overload]
    base = float(p.get("freq_base", 10000.0))  # type: ignore[arg-type]
    freq_scale = float(p.get("freq_scale", 1.0))  # type: ignore[arg-type]
    ext_factor = float(p.get("ext_factor", 0.0))  # type: ignore[arg-type]
    mscale = float(p.get("attn_factor", 1.0))  # type: ignore[arg-type]
    half = n_dims // 2
    i0 = np.arange(half, dtype=np.float32) * 2
    theta_extrap = pos.astype(jnp.float32)[:, None] * jnp.asarray(base ** (-i0 / n_dims), jnp.float32)[None, :]
    if freq_factors is not None:
        theta_extrap = theta_extrap / freq_factors.reshape(-1)[:half][None, :]
    theta = freq_scale * theta_extrap
    if ext_factor != 0.0:
        n_ctx_orig = int(p.get("n_ctx_orig", 0))  # type: ignore[call-overload]
        lo = max(0.0, math.floor(_yarn_corr_dim(n_dims, n_ctx_orig, float(p.get("beta_fast", 32.0)), base)))  # type: ignore[arg-type]
        hi = min(n_dims - 1.0, math.ceil(_yarn_corr_dim(n_dims, n_ctx_orig, float(p.get("beta_slow", 1.0)), base)))  # type: ignore[arg-type]
        y = (np.arange(half) - lo) / max(0.001, hi - lo)
        ramp = jnp.asarray((1 - np.clip(y, 0, 1)) * ext_factor, jnp.float32)
        theta = theta * (1 - ramp) + theta_extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    cos = (jnp.cos(theta) * mscale)[None, :, None, :]
    sin = (jnp.sin(theta) * mscale)[None, :, None, :]
    x = a.astype(jnp.float32)
    rot, rest = x[..., :n_dims], x[..., n_dims:]
    if mode & 2:  # GGML_ROPE_TYPE_NEOX
        x0, x1 = rot[..., :half], rot[..., half:]
        out = jnp.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    else:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(rot.shape)
    return jnp.concatenate([out, rest], axis=-1)


# ---- element-wise -------------------------------------------------------------------------

def gelu(x: jnp.ndarray) -> jnp.ndarray:
    """ggml's tanh-approximated GELU."""
    return 0.5 * x * (1.0 + jnp.tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)))


UNARY: dict[UnaryOp, Callable[[jnp.ndarray], jnp.ndarray]] = {
    UnaryOp.ABS: jnp.abs, UnaryOp.NEG: jnp.negative, UnaryOp.TANH: jnp.tanh, UnaryOp.RELU: jax.nn.relu,
    UnaryOp.SIGMOID: jax.nn.sigmoid, UnaryOp.GELU: gelu, UnaryOp.SILU: jax.nn.silu, UnaryOp.EXP: jnp.exp,
}
GLU_ACT: dict[GluOp, Callable[[jnp.ndarray], jnp.ndarray]] = {
    GluOp.SWIGLU: jax.nn.silu, GluOp.GEGLU: gelu, GluOp.REGLU: jax.nn.relu,
}
BINARY: dict[Op, Callable[[jnp.ndarray, jnp.ndarray], jnp.ndarray]] = {
    Op.ADD: jnp.add, Op.SUB: jnp.subtract, Op.MUL: jnp.multiply, Op.DIV: jnp.divide,
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


# ---- the evaluator -----------------------------------------------------------------------

INPLACE_OPS = frozenset({Op.SET_ROWS, Op.CPY, Op.CLAMP})


class Env:
    """Flat storage of base tensors; ``eval(node)`` runs one ggml node functionally."""

    def __init__(self, values: dict[Tensor, jnp.ndarray] | None = None) -> None:
        self.values: dict[Tensor, jnp.ndarray] = dict(values or {})
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
        if node.op in INPLACE_OPS:
            self._eval_inplace(node)
            return
        out = compute(node, self)
        dtype = layout.storage_dtype(node.type)
        self._set(node, out.astype(dtype).reshape(-1))

    def _eval_inplace(self, node: Tensor) -> None:
        base = node.view_src if node.view_src is not None else node
        if node.op is Op.SET_ROWS:
            rows, ids, dst = node.src[0], node.src[1], node.src[2]
            assert rows is not None and ids is not None and dst is not None
            new = layout.write_rows(self.flat(dst), node, self.read_f32(rows), self.read(ids)[0])
        elif node.op is Op.CPY:
            a, b = node.src[0], node.src[1]
            assert a is not None and b is not None
            vals = self.read_f32(a).reshape(node.ne[3], node.ne[2], node.ne[1], node.ne[0])
            new = layout.write(self.flat(b), node, vals)
        else:  # CLAMP (ggml_clamp returns a view of a: written in place)
            a = node.src[0]
            assert a is not None
            vals = jnp.clip(self.read_f32(a), node.op_params["min"], node.op_params["max"])
            new = layout.write(self.flat(a), node, vals)
        self._set(base, new)


def src_slots(node: Tensor) -> list[Tensor | None]:
    """The node's sources padded with None to GGML_MAX_SRC slots: a kernel reads an optional
    source (rope's freq factors, the softmax mask, a GLU's second half) by its slot."""
    s = node.src
    return s if len(s) >= MAX_SRC else [*s, *([None] * (MAX_SRC - len(s)))]


def compute(node: Tensor, env: Env) -> jnp.ndarray:
    """The logical f32/i32 result of a non-view, not-in-place node."""
    op, p = node.op, node.op_params
    s = src_slots(node)
    f32 = env.read_f32
    shape = (node.ne[3], node.ne[2], node.ne[1], node.ne[0])
    if op in BINARY:
        a = f32(s[0])  # type: ignore[arg-type]
        return BINARY[op](a, tile_to(f32(s[1]), a.shape))  # type: ignore[arg-type]
    if op is Op.MUL_MAT:
        return mul_mat(f32(s[0]), f32(s[1]))  # type: ignore[arg-type]
    if op is Op.RMS_NORM:
        return rms_norm(f32(s[0]), p["eps"])  # type: ignore[arg-type]
    if op is Op.NORM:
        return norm(f32(s[0]), p["eps"])  # type: ignore[arg-type]
    if op is Op.SCALE:
        return f32(s[0]) * p["s"] + p.get("b", 0.0)  # type: ignore[arg-type]
    if op is Op.GET_ROWS:
        src = s[0]
        assert src is not None
        return get_rows(env.read(src), src.type, env.read(s[1]))  # type: ignore[arg-type]
    if op is Op.ROPE:
        ff = f32(s[2]) if s[2] is not None else None
        return rope(f32(s[0]), env.read(s[1]).reshape(-1), ff, p)  # type: ignore[arg-type]
    if op is Op.SOFT_MAX:
        mask = f32(s[1]) if s[1] is not None else None
        return soft_max_ext(f32(s[0]), mask, p["scale"], p.get("max_bias", 0.0))  # type: ignore[arg-type]
    if op is Op.FLASH_ATTN_EXT:
        mask = f32(s[3]) if s[3] is not None else None
        return flash_attn_ext(f32(s[0]), f32(s[1]), f32(s[2]), mask,  # type: ignore[arg-type]
                              p["scale"], p.get("max_bias", 0.0), p.get("logit_softcap", 0.0))  # type: ignore[arg-type]
    if op is Op.GLU:
        kind = p["glu"]
        a = f32(s[0])  # type: ignore[arg-type]
        if s[1] is not None:
            x0, x1 = a, f32(s[1])
        else:
            nc = a.shape[-1] // 2
            x0, x1 = a[..., :nc], a[..., nc:]
        if p.get("swapped"):
            x0, x1 = x1, x0
        return GLU_ACT[kind](x0) * x1  # type: ignore[index]
    if op is Op.UNARY:
        return UNARY[p["unary"]](f32(s[0]))  # type: ignore[index,arg-type]
    if op in (Op.CONT, Op.DUP):
        src = s[0]
        assert src is not None
        x = env.read(src)
        return (x if src.type is GGMLType.I32 else as_f32(x, src.type)).reshape(shape)
    return _compute_misc(node, env, shape)


def _compute_misc(node: Tensor, env: Env, shape: tuple[int, int, int, int]) -> jnp.ndarray:
    op, p, s = node.op, node.op_params, src_slots(node)
    if op in MOE_KERNELS:
        return MOE_KERNELS[op](node, env, shape)
    x = env.read_f32(s[0]) if s[0] is not None else None  # type: ignore[arg-type]
    assert x is not None
    simple: dict[Op, Callable[[jnp.ndarray], jnp.ndarray]] = {
        Op.SQR: jnp.square, Op.SQRT: jnp.sqrt, Op.LOG: jnp.log, Op.SIN: jnp.sin, Op.COS: jnp.cos,
    }
    if op in simple:
        return simple[op](x)
    if op is Op.SUM:
        return jnp.sum(x).reshape(shape)
    if op is Op.SUM_ROWS:
        return jnp.sum(x, axis=-1, keepdims=True)
    if op is Op.MEAN:
        return jnp.mean(x, axis=-1, keepdims=True)
    if op is Op.ARGMAX:
        return jnp.argmax(x, axis=-1).astype(jnp.int32).reshape(shape)
    if op is Op.REPEAT:
        return tile_to(x, shape)
    if op is Op.CONCAT:
        return jnp.concatenate([x, env.read_f32(s[1])], axis=3 - int(p["dim"]))  # type: ignore[arg-type,call-overload]
    if op is Op.ADD1:
        return x + env.read_f32(s[1]).reshape(())  # type: ignore[arg-type]
    if op is Op.FILL:
        return jnp.full(shape, p["c"], jnp.float32)  # type: ignore[arg-type]
    if op is Op.DIAG_MASK_INF:
        n_past = int(p["n_past"])  # type: ignore[call-overload]
        cols = np.arange(shape[3])[None, :]
        rows = np.arange(shape[2])[:, None]
        return jnp.where(jnp.asarray(cols > n_past + rows), -jnp.inf, x)
    raise NotImplementedError(f"the JAX runtime has no kernel for {node.op_desc()} (node {node.name!r})")


def eval_nodes(nodes: list[Tensor], values: dict[Tensor, jnp.ndarray]) -> Env:
    """Evaluate nodes in order over the given base storage (a convenience for tests)."""
    env = Env(values)
    for n in nodes:
        env.eval(n)
    return env
