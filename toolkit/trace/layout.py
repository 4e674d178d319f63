"""JAX avals as ggml tensors: dtype → ggml type, numpy shape → ``ne`` (ne[0] is the LAST numpy axis).

ggml tensors have at most 4 dims (GGML_MAX_DIMS). A traced value of higher rank keeps its
exact byte size by folding its leading numpy axes into ``ne[3]``; such tensors are never
turned into strided views (the view mappings check :func:`fits_ggml_dims`).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from toolkit.ggml.tensor import MAX_DIMS
from toolkit.ggml.types import GGMLType

# ggml has no bool or unsigned types: those map to the signed type of the same width, so
# byte sizes (what the allocator plans) stay exact; the executor keeps the JAX dtype.
_DTYPES: dict[str, GGMLType] = {
    "float32": GGMLType.F32,
    "float16": GGMLType.F16,
    "bfloat16": GGMLType.BF16,
    "float64": GGMLType.F64,
    "int8": GGMLType.I8,
    "int16": GGMLType.I16,
    "int32": GGMLType.I32,
    "int64": GGMLType.I64,
    "uint8": GGMLType.I8,
    "uint16": GGMLType.I16,
    "uint32": GGMLType.I32,
    "uint64": GGMLType.I64,
    "bool": GGMLType.I8,
}


def ggml_type(dtype: object) -> GGMLType | None:
    """The ggml type holding a JAX dtype, or None (complex, fp8, PRNG keys have none)."""
    return _DTYPES.get(str(dtype))


def known_dtypes() -> tuple[str, ...]:
    return tuple(_DTYPES)


def ne_of(shape: Sequence[int]) -> tuple[int, int, int, int]:
    """``ne`` of a numpy shape: reversed, padded with 1; axes past the 4th fold into ne[3]."""
    rev = [int(x) for x in reversed(tuple(shape))]
    if len(rev) > MAX_DIMS:
        rev = rev[: MAX_DIMS - 1] + [prod(rev[MAX_DIMS - 1:])]
    rev += [1] * (MAX_DIMS - len(rev))
    return (rev[0], rev[1], rev[2], rev[3])


def fits_ggml_dims(*shapes: Sequence[int]) -> bool:
    """True when every shape has rank <= 4, so numpy axis a is exactly ggml dim rank-1-a."""
    return all(len(tuple(s)) <= MAX_DIMS for s in shapes)


def ggml_dim(axis: int, rank: int) -> int:
    """The ggml dim of numpy axis ``axis`` in a rank-``rank`` array (rank <= 4)."""
    return rank - 1 - axis
