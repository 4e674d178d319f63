"""ggml memory layout in JAX: flat storage, strided views, strided and row-indexed writes.

Every base tensor (a non-view tensor: weight, KV cache, graph input, op result, split-input
copy) is held as a flat 1-D array of *storage units* (f32, f16, bf16, i32; bytes for
quantized types; the low 32-bit words for i64, which JAX holds without x64). A tensor is
read through its ``ne``/``nb``/``view_offs`` exactly as ggml addresses memory, so views,
permutes, transposed V caches and copies that keep their source's strides (``ggml_dup_tensor_layout``) all work.
The logical value of a tensor is a 4-D array in numpy order ``(ne3, ne2, ne1, ne0)``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from toolkit.ggml.tensor import Tensor
from toolkit.ggml.types import GGMLType
from toolkit.jaxrt.quant import quantize

_DTYPES: dict[GGMLType, Any] = {
    GGMLType.F32: jnp.float32, GGMLType.F16: jnp.float16, GGMLType.BF16: jnp.bfloat16,
    GGMLType.I32: jnp.int32, GGMLType.I64: jnp.int32, GGMLType.I16: jnp.int16, GGMLType.I8: jnp.int8,
}


def storage_dtype(type_: GGMLType) -> Any:
    """The JAX dtype of one storage unit of a type."""
    if type_.is_quantized:
        return jnp.uint8
    try:
        return _DTYPES[type_]
    except KeyError:
        raise NotImplementedError(f"the JAX runtime does not hold {type_.name} tensors") from None


def unit_size(type_: GGMLType) -> int:
    """Bytes per storage unit: 1 for quantized types, 4 for i64 (its low word is read)."""
    if type_.is_quantized:
        return 1
    return 4 if type_ is GGMLType.I64 else type_.type_size


def storage_units(t: Tensor) -> int:
    """Length of a base tensor's flat storage."""
    return -(-t.nbytes // unit_size(t.type))


def host_storage(t: Tensor, data: np.ndarray) -> np.ndarray:
    """A numpy value as flat storage: logical values (any shape) are cast; raw bytes (uint8)
    are taken as ggml's memory image (quantized blocks, f16/bf16 bits)."""
    data = np.ascontiguousarray(data)
    dtype = np.dtype(storage_dtype(t.type))  # type: ignore[call-overload]
    if t.type.is_quantized:
        return data.view(np.uint8).reshape(-1)
    if t.type is GGMLType.I64:
        return data.astype(np.int64).reshape(-1).view(np.int32)
    raw_bytes = data.dtype == np.uint8 and dtype.itemsize != 1
    raw_bits = data.dtype.kind == "u" and data.dtype.itemsize == dtype.itemsize  # e.g. bf16 as uint16
    if raw_bytes or raw_bits:
        return data.reshape(-1).view(np.uint8).view(dtype)
    return data.astype(dtype).reshape(-1)


def _units(t: Tensor) -> tuple[int, tuple[int, int, int, int], tuple[int, int, int, int]]:
    """(offset, numpy-order shape, numpy-order strides) of t in storage units of its base."""
    u = unit_size(t.type)
    ne, nb = t.ne, t.nb
    offs = t.view_offs if t.view_src is not None else 0
    if t.type.is_quantized:
        # a quantized row is addressed as bytes: ne0 elements -> row_size bytes at stride 1
        shape = (ne[3], ne[2], ne[1], t.type.row_size(ne[0]))
        return offs, shape, (nb[3], nb[2], nb[1], 1)
    return offs // u, (ne[3], ne[2], ne[1], ne[0]), (nb[3] // u, nb[2] // u, nb[1] // u, nb[0] // u)


def _nested(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[tuple[int, int, int]] | None:
    """Dims (index, n, stride) sorted by stride when each stride nests inside the previous one."""
    dims = sorted(((i, n, s) for i, (n, s) in enumerate(zip(shape, strides)) if n != 1), key=lambda d: -d[2])
    for a, b in zip(dims, dims[1:]):
        if b[2] <= 0 or a[2] % b[2] or b[1] * b[2] > a[2]:
            return None
    if dims and dims[-1][2] <= 0:
        return None
    return dims


def strided_read(flat: jnp.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> jnp.ndarray:
    """``x[i] = flat[offset + Σ i_k * strides_k]`` for a static layout.

    Nested layouts (every ggml view, permute and transpose the llama graph makes) become a
    slice, reshapes, slices and a transpose, which XLA fuses; anything else is a gather.
    """
    dims = _nested(shape, strides)
    if dims is None:
        idx = np.full(shape, offset, dtype=np.int64)
        for k, (n, s) in enumerate(zip(shape, strides)):
            idx = idx + (np.arange(n) * s).reshape([n if j == k else 1 for j in range(len(shape))])
        return jnp.take(flat, jnp.asarray(idx.reshape(-1), dtype=jnp.int32)).reshape(shape)
    if not dims:
        return flat[offset:offset + 1].reshape(shape)
    n0, s0 = dims[0][1], dims[0][2]
    need = n0 * s0
    end = min(offset + need, flat.shape[0])
    x = flat[offset:end]
    if end - offset < need:  # the last row's padding runs past the buffer: never read, pad it
        x = jnp.concatenate([x, jnp.zeros((need - (end - offset),), flat.dtype)])
    x = x.reshape(n0, s0)
    for _, n, s in dims[1:]:
        prev = x.shape[-1]
        x = x.reshape(*x.shape[:-1], prev // s, s)[..., :n, :]
    x = x[..., 0]
    order = [d[0] for d in dims]
    x = jnp.transpose(x, tuple(int(i) for i in np.argsort(order)))
    return x.reshape(shape)


def _index_grid(offset: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    idx = np.full(shape, offset, dtype=np.int64)
    for k, (n, s) in enumerate(zip(shape, strides)):
        idx = idx + (np.arange(n) * s).reshape([n if j == k else 1 for j in range(len(shape))])
    return idx


def _is_packed(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expect = 1
    for n, s in reversed(list(zip(shape, strides))):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def strided_write(
    flat: jnp.ndarray, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], values: jnp.ndarray
) -> jnp.ndarray:
    """The functional form of writing ``values`` (already in ``shape``) into a strided region."""
    values = values.astype(flat.dtype)
    n = int(np.prod(shape))
    if _is_packed(shape, strides):
        return flat.at[offset:offset + n].set(values.reshape(-1))
    idx = _index_grid(offset, shape, strides).reshape(-1)
    return flat.at[jnp.asarray(idx, dtype=jnp.int32)].set(values.reshape(-1), unique_indices=True)


def read(flat: jnp.ndarray, t: Tensor) -> jnp.ndarray:
    """The logical value of t (numpy order; raw row bytes for quantized types) from its base's storage."""
    offs, shape, strides = _units(t)
    return strided_read(flat, offs, shape, strides)


def write(flat: jnp.ndarray, t: Tensor, values: jnp.ndarray) -> jnp.ndarray:
    """Base storage with t's region replaced by ``values`` (t's logical shape)."""
    if t.type.is_quantized:
        raise NotImplementedError(f"writing into quantized tensor {t.name!r} ({t.type.name}) is not supported")
    offs, shape, strides = _units(t)
    return strided_write(flat, offs, shape, strides, values.reshape(shape))


def write_rows(flat: jnp.ndarray, dst: Tensor, rows: jnp.ndarray, ids: jnp.ndarray) -> jnp.ndarray:
    """SET_ROWS: row (i1, i2, i3) of ``rows`` goes to row ids[i1, i2 % ne_ids1, i3 % ne_ids2] of dst."""
    if dst.type.is_quantized:
        # a quantized KV cache (-ctk q8_0): rows are quantized as ggml's from_float does, then
        # written as rows of bytes
        rows = quantize(rows, dst.type)
    offs, _, (s3, s2, s1, s0) = _units(dst)
    r3, r2, r1, r0 = rows.shape
    i3, i2 = np.arange(r3) % ids.shape[0], np.arange(r2) % ids.shape[1]
    idv = ids[i3[:, None], i2[None, :], :]  # (r3, r2, r1)
    static = offs + (np.arange(r3) * s3)[:, None, None, None] + (np.arange(r2) * s2)[None, :, None, None] \
        + (np.arange(r0) * s0)[None, None, None, :]
    vals = rows.astype(flat.dtype)
    n = flat.shape[0]
    if s0 == 1 and s1 >= r0 > 1 and offs % s1 == 0 and n % s1 == 0 and s2 % s1 == 0 and s3 % s1 == 0:
        # whole rows: a row scatter into the (rows, s1) view, which XLA runs far faster than elements
        base_rows = (offs + (np.arange(r3) * s3)[:, None] + (np.arange(r2) * s2)[None, :]) // s1
        rid = jnp.asarray(base_rows, jnp.int32)[..., None] + idv.astype(jnp.int32)
        mat = flat.reshape(n // s1, s1)
        if r0 == s1:
            mat = mat.at[rid.reshape(-1)].set(vals.reshape(-1, r0), mode="drop")
        else:
            mat = mat.at[rid.reshape(-1), :r0].set(vals.reshape(-1, r0), mode="drop")
        return mat.reshape(-1)
    idx = jnp.asarray(static, jnp.int32) + idv[..., None].astype(jnp.int32) * s1
    return flat.at[idx.reshape(-1)].set(vals.reshape(-1), mode="drop")
