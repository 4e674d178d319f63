"""JAX kernels for the ops of llama.cpp's mixture-of-experts FFN (``build_moe_ffn``), in ggml's layouts.

Values are logical arrays in numpy order ``(ne3, ne2, ne1, ne0)``, as in :mod:`toolkit.jaxrt.kernels`,
whose table :data:`MOE_KERNELS` joins; SUM_ROWS, CLAMP, DIV and GET_ROWS of the router weights are the
generic kernels.

- ``MUL_MAT_ID(as, b, ids)`` (ggml-cpu ``ggml_compute_forward_mul_mat_id``): ``as`` ``(1, n_expert, n_out, k)``,
  ``b`` ``(1, T, n_b, k)``, ``ids`` I32 ``(1, 1, T, n_used)``; ``result[0, t, j] = as[ids[t, j]] @ b[t, j % n_b]``.
- ``ARGSORT`` (``ggml_compute_forward_argsort``): per row, the I32 indices in ascending or descending order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from toolkit.ggml.tensor import Op, Tensor
from toolkit.jaxrt.operands import Kernel, Reader, shape_of, src

HIGHEST = jax.lax.Precision.HIGHEST


def mul_mat_id(as_: jnp.ndarray, b: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """``(1, T, n_used, n_out)``: row ``j`` of token ``t`` is expert ``ids[t, j]`` applied to ``b[t, j % n_b]``.

    Every expert runs on every (token, b-row) once, then the used pairs are gathered: the same dot
    products ggml computes, without a data-dependent shape.
    """
    experts = as_[0]                                            # (n_expert, n_out, k)
    bb = b[0]                                                   # (T, n_b, k)
    idx = ids[0, 0].astype(jnp.int32)                          # (T, n_used)
    n_used, n_b = idx.shape[1], bb.shape[1]
    rows = bb[:, jnp.arange(n_used) % n_b, :]                   # (T, n_used, k)
    y = jnp.einsum("tjk,xok->tjxo", rows, experts, precision=HIGHEST)  # (T, n_used, n_expert, n_out)
    out = jnp.take_along_axis(y, idx[:, :, None, None], axis=2)[:, :, 0, :]
    return out[None]


def argsort(x: jnp.ndarray, descending: bool) -> jnp.ndarray:
    return jnp.argsort(x, axis=-1, stable=True, descending=descending).astype(jnp.int32)


def _mul_mat_id(n: Tensor, r: Reader) -> jnp.ndarray:
    return mul_mat_id(r.read_f32(src(n, 0)), r.read_f32(src(n, 1)), r.read(src(n, 2))).reshape(shape_of(n))


def _argsort(n: Tensor, r: Reader) -> jnp.ndarray:
    return argsort(r.read_f32(src(n, 0)), n.op_params.get("order") == "desc").reshape(shape_of(n))


# the MoE ops' entries of toolkit.jaxrt.kernels.KERNELS
MOE_KERNELS: dict[Op, Kernel] = {
    Op.MUL_MAT_ID: Kernel(_mul_mat_id),
    Op.ARGSORT: Kernel(_argsort),
}
