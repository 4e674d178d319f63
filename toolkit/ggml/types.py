"""ggml tensor types: block size and bytes per block (``ggml_blck_size`` / ``ggml_type_size``)."""

from __future__ import annotations

import enum

from toolkit.errors import ParameterError


class GGMLType(enum.Enum):
    """The ggml types llama.cpp uses for weights, activations and KV caches.

    Each value is ``(ggml id, block size, bytes per block)``.
    """

    F32 = (0, 1, 4)
    F16 = (1, 1, 2)
    Q4_0 = (2, 32, 18)
    Q4_1 = (3, 32, 20)
    Q5_0 = (6, 32, 22)
    Q5_1 = (7, 32, 24)
    Q8_0 = (8, 32, 34)
    Q2_K = (10, 256, 84)
    Q3_K = (11, 256, 110)
    Q4_K = (12, 256, 144)
    Q5_K = (13, 256, 176)
    Q6_K = (14, 256, 210)
    IQ4_NL = (20, 32, 18)
    IQ4_XS = (23, 256, 136)
    I8 = (24, 1, 1)
    I16 = (25, 1, 2)
    I32 = (26, 1, 4)
    I64 = (27, 1, 8)
    F64 = (28, 1, 8)
    BF16 = (30, 1, 2)
    MXFP4 = (39, 32, 17)

    # plain attributes set once per member: the hot paths (nbytes, alloc_size) read these for every
    # tensor, and Enum's ``value`` lookup is far slower than an attribute
    ggml_id: int
    blck_size: int
    type_size: int

    def __init__(self, ggml_id: int, blck_size: int, type_size: int) -> None:
        self.ggml_id = ggml_id
        self.blck_size = blck_size
        self.type_size = type_size

    @property
    def is_quantized(self) -> bool:
        return self.blck_size > 1

    @property
    def lower(self) -> str:
        return self.name.lower()

    def row_size(self, ne0: int) -> int:
        """Bytes of one row of ``ne0`` elements (``ggml_row_size``)."""
        if ne0 % self.blck_size:
            raise ValueError(
                f"row of {ne0} elements is not a multiple of {self.name}'s block size {self.blck_size}"
            )
        return self.type_size * ne0 // self.blck_size

    @classmethod
    def parse(cls, name: str | GGMLType) -> GGMLType:
        """``"f16"``, ``"Q8_0"`` or a GGMLType → GGMLType, with a clear error."""
        if isinstance(name, GGMLType):
            return name
        try:
            return cls[str(name).upper()]
        except KeyError:
            known = ", ".join(t.lower for t in cls)
            raise ParameterError("type", name, f"a ggml type name ({known})", "unknown ggml type") from None


F32 = GGMLType.F32
F16 = GGMLType.F16
BF16 = GGMLType.BF16
I32 = GGMLType.I32
Q4_0 = GGMLType.Q4_0
Q8_0 = GGMLType.Q8_0
