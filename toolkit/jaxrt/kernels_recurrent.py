"""JAX kernels for the hybrid models' recurrent layers (Qwen3.5/3.6's gated delta net, LFM2's short
convolution), in ggml's layouts (values in numpy order ``(ne3, ne2, ne1, ne0)`` as in
:mod:`toolkit.jaxrt.kernels`, whose table :data:`RECURRENT_KERNELS` joins). ggml-cpu's ops.cpp is the
reference:

- ``SSM_CONV(sx, c)`` (``ggml_compute_forward_ssm_conv_f32``): ``sx`` ``[d_conv - 1 + n_t, d_inner, n_s]``,
  ``c`` ``[d_conv, d_inner]``; ``out[s, t, i] = sum_k sx[s, i, t + k] * c[i, k]``, F32 ``[d_inner, n_t, n_s]``.
- ``L2_NORM`` (``ggml_compute_forward_l2_norm_f32``): each row times ``1 / max(sqrt(sum x^2), eps)``.
- ``GATED_DELTA_NET(q, k, v, g, beta, state)`` (``ggml_compute_forward_gated_delta_net_one_chunk``):
  per sequence and V head a state matrix ``S`` (held transposed, ``M[j][i] = S[i][j]``), per token
  ``M *= exp(g)`` (``g`` one value per head, or one per row of ``M``: the KDA form),
  ``delta = (v - M k) * beta``, ``M += delta k^T``, ``out = M q / sqrt(S_v)``. The result holds every
  token's output ``[S_v, H, n_tokens, n_seqs]`` then ``K`` snapshots of the state (slot 0 the newest,
  slot ``s`` ``s`` tokens back; slots older than the ubatch are not written by ggml and read 0 here).
  Q and K heads are taken ``iv1 % ne1`` (tiled), their sequences ``iv3 / (n_seqs / ne3)``.
- ``softplus`` (``op_softplus``): ``x`` above 20, else ``log(1 + exp(x))``.
- ``ggml_rope_multi``'s positions (``ggml_mrope_cache_init``): :func:`mrope_pair_positions` gives each
  rotated pair the position of its section (M-RoPE: contiguous sections t, h, w, e; IMROPE: interleaved
  t, h, w by ``sector % 3`` within ``3 * section``); the rotation is NEOX's (pairs ``i, i + n_dims / 2``).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from toolkit.errors import ParameterError
from toolkit.ggml.tensor import Op, Tensor
from toolkit.jaxrt.operands import Kernel, Reader, param_f32, param_i32, shape_of, src

HIGHEST = jax.lax.Precision.HIGHEST
ROPE_TYPE_MROPE, ROPE_TYPE_VISION, ROPE_TYPE_IMROPE = 8, 24, 40
SOFTPLUS_THRESHOLD = 20.0


def softplus(x: jnp.ndarray) -> jnp.ndarray:
    """``op_softplus``: ``x`` where ``x > 20``, else ``log(1 + exp(x))`` (the exp is clamped so the branch
    not taken stays finite)."""
    return jnp.where(x > SOFTPLUS_THRESHOLD, x, jnp.log(1.0 + jnp.exp(jnp.minimum(x, SOFTPLUS_THRESHOLD))))


def l2_norm(x: jnp.ndarray, eps: float) -> jnp.ndarray:
    """``ggml_l2_norm``: each row (last axis) divided by ``max(||row||, eps)``."""
    return x * (1.0 / jnp.maximum(jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True)), eps))


def ssm_conv(sx: jnp.ndarray, c: jnp.ndarray) -> jnp.ndarray:
    """``ggml_ssm_conv``: ``sx`` ``(1, n_s, d_inner, d_conv - 1 + n_t)``, ``c`` ``(1, 1, d_inner, d_conv)``
    -> ``(1, n_s, n_t, d_inner)``, the sliding window's row-wise dot product."""
    nc = c.shape[-1]
    n_t = sx.shape[-1] - nc + 1
    w = c[0, 0]                                                       # (d_inner, d_conv)
    acc = sum(sx[..., k:k + n_t] * w[None, None, :, k:k + 1] for k in range(nc))  # (1, n_s, d_inner, n_t)
    return jnp.swapaxes(jnp.asarray(acc), -1, -2)


def gated_delta_net(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, g: jnp.ndarray, beta: jnp.ndarray,
                    state: jnp.ndarray, n_snap: int) -> jnp.ndarray:
    """The flat F32 result of ``ggml_gated_delta_net`` (outputs, then ``n_snap`` state snapshots).

    ``q``, ``k`` ``(nq3, n_tokens, nq1, S_v)``; ``v`` ``(n_seqs, n_tokens, H, S_v)``; ``g``
    ``(n_seqs, n_tokens, H, 1 or S_v)``; ``beta`` ``(n_seqs, n_tokens, H, 1)``; ``state`` any array of
    ``n_seqs * H * S_v * S_v`` values, ``(n_seqs, H, j, i)`` = ``M``."""
    n_seqs, n_tokens, H, S_v = v.shape
    if n_snap < 1:
        raise ParameterError("K", n_snap, "a snapshot count >= 1 (ggml_gated_delta_net asserts K >= 1)")

    def heads(x: jnp.ndarray) -> jnp.ndarray:
        """Q/K to V's (sequence, head) grid: heads iv1 % ne1, sequences iv3 / (n_seqs / ne3)."""
        hx = jnp.tile(x, (1, 1, H // x.shape[2], 1)) if x.shape[2] != H else x
        return jnp.repeat(hx, n_seqs // x.shape[0], axis=0) if x.shape[0] != n_seqs else hx

    qs, ks = heads(q), heads(k)
    m0 = state.reshape(n_seqs, H, S_v, S_v).astype(jnp.float32)
    kda = g.shape[-1] == S_v
    scale = 1.0 / float(np.sqrt(np.float32(S_v)))

    def step(m: jnp.ndarray, xs: tuple[jnp.ndarray, ...]) -> tuple[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
        qt, kt, vt, gt, bt = xs                                        # (n_seqs, H, S_v | 1)
        eg = jnp.exp(gt)
        m = m * (eg[:, :, None, :] if kda else eg[:, :, :, None])     # KDA: M[j][i] *= exp(g[i])
        mk = jnp.einsum("shji,shi->shj", m, kt, precision=HIGHEST)
        delta = (vt - mk) * bt                                         # bt (n_seqs, H, 1)
        m = m + delta[..., :, None] * kt[..., None, :]
        out = jnp.einsum("shji,shi->shj", m, qt, precision=HIGHEST) * scale
        return m, (out, m)

    xs = tuple(jnp.moveaxis(x.astype(jnp.float32), 1, 0) for x in (qs, ks, v, g, beta))
    _, (outs, states) = jax.lax.scan(step, m0, xs)                     # (n_tokens, n_seqs, H, ...)
    attn = jnp.moveaxis(outs, 0, 1).reshape(-1)                        # (n_seqs, n_tokens, H, S_v)
    n_written = min(n_tokens, n_snap)
    snaps = states[::-1][:n_written].reshape(n_written, -1)            # slot s = s tokens back
    if n_written < n_snap:
        snaps = jnp.concatenate([snaps, jnp.zeros((n_snap - n_written, snaps.shape[1]), jnp.float32)])
    return jnp.concatenate([attn, snaps.reshape(-1)])


def mrope_pair_positions(pos: jnp.ndarray, sections: Sequence[int], mode: int, n_tokens: int,
                         half: int) -> jnp.ndarray:
    """``(n_tokens, half)`` float positions, pair ``i``'s from its section (``ggml_mrope_cache_init``):
    ``pos`` holds four runs of ``n_tokens`` (t, h, w, e). IMROPE interleaves t, h, w by ``sector % 3``
    within three times each section; M-RoPE takes contiguous sections. The vision form is refused."""
    if len(sections) != 4:
        raise ParameterError("sections", tuple(sections), "4 M-RoPE sections (ggml_rope_multi)")
    if mode == ROPE_TYPE_VISION:
        raise ParameterError("mode", mode, f"M-RoPE {ROPE_TYPE_MROPE} or IMROPE {ROPE_TYPE_IMROPE} (the vision "
                             "rope's independent sections are not run)")
    s0, s1, s2, _ = (int(x) for x in sections)
    sect_dims = sum(int(x) for x in sections)
    if sect_dims <= 0:
        raise ParameterError("sections", tuple(sections), "sections whose sum is > 0")
    which = np.empty(half, dtype=np.int32)
    for i in range(half):
        sector = i % sect_dims
        if mode == ROPE_TYPE_IMROPE:
            which[i] = (1 if sector % 3 == 1 and sector < 3 * s1 else 2 if sector % 3 == 2 and sector < 3 * s2
                        else 0 if sector % 3 == 0 and sector < 3 * s0 else 3)
        else:
            which[i] = 0 if sector < s0 else 1 if sector < s0 + s1 else 2 if sector < s0 + s1 + s2 else 3
    runs = pos.reshape(4, n_tokens).astype(jnp.float32)               # (t, h, w, e) x n_tokens
    return runs[which].T


def rope_sections(node: Tensor) -> tuple[int, ...] | None:
    """A ROPE node's M-RoPE ``sections`` (``ggml_rope_multi``), or None for ``ggml_rope_ext``'s."""
    v = node.op_params.get("sections")
    if v is None:
        return None
    if not isinstance(v, tuple) or not all(isinstance(x, int) for x in v):
        raise ParameterError(f"{node.name}.op_params['sections']", v, "a tuple of 4 ints (ggml_rope_multi)")
    return v


# ---- the table's entries -------------------------------------------------------------------------

def _ssm_conv(n: Tensor, r: Reader) -> jnp.ndarray:
    return ssm_conv(r.read_f32(src(n, 0)), r.read_f32(src(n, 1))).reshape(shape_of(n))


def _gated_delta_net(n: Tensor, r: Reader) -> jnp.ndarray:
    q, k, v, g, beta, state = (r.read_f32(src(n, i)) for i in range(6))
    return gated_delta_net(q, k, v, g, beta, state, param_i32(n, "K")).reshape(shape_of(n))


def _l2_norm(n: Tensor, r: Reader) -> jnp.ndarray:
    return l2_norm(r.read_f32(src(n, 0)), param_f32(n, "eps"))


# the recurrent layers' entries of toolkit.jaxrt.kernels.KERNELS (softplus joins its UNARY table and
# the M-RoPE positions its rope)
RECURRENT_KERNELS: dict[Op, Kernel] = {
    Op.L2_NORM: Kernel(_l2_norm),
    Op.SSM_CONV: Kernel(_ssm_conv),
    Op.GATED_DELTA_NET: Kernel(_gated_delta_net),
}
