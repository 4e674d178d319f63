"""JAX kernels for gpt-oss's new ops, in ggml's layouts (values in numpy order ``(ne3, ne2, ne1, ne0)``
as in :mod:`toolkit.jaxrt.kernels`, whose table :data:`GPTOSS_KERNELS` joins).

- ``ADD_ID(a, b, ids)`` (ggml-cpu ``ggml_compute_forward_add_id``): ``a`` ``(1, T, n_used, n)``, ``b``
  ``(1, 1, n_expert, n)``, ``ids`` I32 ``(1, 1, T, n_used)``; ``result[0, t, j] = a[0, t, j] + b[ids[t, j]]``.
- ``SWIGLU_OAI`` (a GLU kind, ``ggml_compute_forward_swiglu_oai``): ``x = min(a, limit)``,
  ``y = clamp(b, -limit, limit)``, ``x / (1 + exp(-alpha x)) * (y + 1)``.
- The attention sinks (``ggml_soft_max_add_sinks``, ``ggml_flash_attn_ext_add_sinks``): one logit per
  head that joins the softmax's denominator only, :func:`sinks_denominator`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from toolkit.ggml.tensor import Op, Tensor
from toolkit.jaxrt.operands import Kernel, Reader, shape_of, src


def add_id(a: jnp.ndarray, b: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """``a + b[ids]``: each selected expert's bias row added to its output row."""
    rows = b.reshape(-1, b.shape[-1])                                # (n_expert, n)
    idx = ids.reshape(a.shape[1], a.shape[2]).astype(jnp.int32)      # (T, n_used)
    return a + rows[idx][None]


def swiglu_oai(x0: jnp.ndarray, x1: jnp.ndarray, alpha: float, limit: float) -> jnp.ndarray:
    x = jnp.minimum(x0, limit)
    y = jnp.clip(x1, -limit, limit)
    return x * jax.nn.sigmoid(alpha * x) * (y + 1.0)


def sinks_denominator(s: jnp.ndarray, sinks: jnp.ndarray | None, head_axis: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """The softmax of scores ``s`` (last axis) as ``(exp(s - m), denominator)`` with the per-head sink
    logits in the denominator: ``m = max(max s, sink)``, ``denominator = sum exp(s - m) + exp(sink - m)``
    (ggml-cpu's softmax and flash attention both correct their running sum this way). A row whose
    scores are all masked keeps a zero numerator (ggml's ``S == 0`` guard)."""
    mx = jnp.max(s, axis=-1, keepdims=True)
    if sinks is not None:
        shape = [1] * s.ndim
        shape[head_axis] = sinks.size
        sk = sinks.reshape(shape).astype(jnp.float32)
        mx = jnp.maximum(mx, sk)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    p = jnp.exp(s - mx)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sinks is not None:
        denom = denom + jnp.exp(sk - mx)
    return p, denom


def _add_id(n: Tensor, r: Reader) -> jnp.ndarray:
    return add_id(r.read_f32(src(n, 0)), r.read_f32(src(n, 1)), r.read(src(n, 2))).reshape(shape_of(n))


# the gpt-oss ops' entries of toolkit.jaxrt.kernels.KERNELS
GPTOSS_KERNELS: dict[Op, Kernel] = {
    Op.ADD_ID: Kernel(_add_id),
}
