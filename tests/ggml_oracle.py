"""Independent measurements for the ggml tensor tests.

- Byte spans come from numpy: a layout with ggml's ``ne``/``nb`` is laid over a byte buffer
  (one item per quantization block, as ggml strides count blocks) and numpy reports the
  bytes it covers.
- Block and type sizes come from the ``gguf`` package's copy of ggml's type table.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from toolkit.ggml import GGMLType

try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # numpy 1.26
    from numpy import byte_bounds  # type: ignore[attr-defined,no-redef]


def np_layout(type_: GGMLType, ne: Sequence[int], nb: Sequence[int]) -> np.ndarray:
    """uint8 array of shape (ne3, ne2, ne1, ne0/blck, type_size) with strides (nb3, nb2, nb1, nb0, 1)."""
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    shape = (ne4[3], ne4[2], ne4[1], ne4[0] // type_.blck_size, type_.type_size)
    strides = (nb[3], nb[2], nb[1], nb[0], 1)
    need = sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) + 1
    return as_strided(np.zeros(need, dtype=np.uint8), shape=shape, strides=strides)


def span_bytes(type_: GGMLType, ne: Sequence[int], nb: Sequence[int]) -> int:
    """Bytes from the first to one past the last byte the layout touches; numpy's 0 when empty."""
    if any(n <= 0 for n in ne):
        return int(np.empty([max(n, 0) for n in ne], dtype=np.uint8).nbytes)
    lo, hi = byte_bounds(np_layout(type_, ne, nb))
    return int(hi - lo)


def np_strides(type_: GGMLType, ne: Sequence[int]) -> tuple[int, int, int, int]:
    """ggml-order strides of a C-contiguous numpy array holding the tensor's blocks."""
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    a = np.empty((ne4[3], ne4[2], ne4[1], ne4[0] // type_.blck_size), dtype=np.dtype(f"V{type_.type_size}"))
    s = a.strides
    return (s[3], s[2], s[1], s[0])
