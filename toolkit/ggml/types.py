"""ggml tensor types: block size and bytes per block (``ggml_blck_size`` / ``ggml_type_size``).

Every type of ggml's ``enum ggml_type`` that a GGUF may hold, with ``ggml_type_traits``' block size and
bytes (the block structs of ggml-common.h), and whether ggml-cpu can quantize into it
(:attr:`GGMLType.cpu_from_float`: ``type_traits_cpu[type].from_float``; the IQ1, IQ2 and IQ3 types have
none, their quantization needs an importance matrix).

>>> GGMLType.Q4_K.blck_size, GGMLType.Q4_K.type_size, GGMLType.Q4_K.row_size(4096)
(256, 144, 2304)
>>> GGMLType.IQ2_XXS.cpu_from_float, GGMLType.NVFP4.cpu_from_float
(False, True)
"""

from __future__ import annotations

import enum
import math
import struct

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
    Q8_1 = (9, 32, 40)
    Q2_K = (10, 256, 84)
    Q3_K = (11, 256, 110)
    Q4_K = (12, 256, 144)
    Q5_K = (13, 256, 176)
    Q6_K = (14, 256, 210)
    Q8_K = (15, 256, 292)
    IQ2_XXS = (16, 256, 66)
    IQ2_XS = (17, 256, 74)
    IQ3_XXS = (18, 256, 98)
    IQ1_S = (19, 256, 50)
    IQ4_NL = (20, 32, 18)
    IQ3_S = (21, 256, 110)
    IQ2_S = (22, 256, 82)
    IQ4_XS = (23, 256, 136)
    I8 = (24, 1, 1)
    I16 = (25, 1, 2)
    I32 = (26, 1, 4)
    I64 = (27, 1, 8)
    F64 = (28, 1, 8)
    IQ1_M = (29, 256, 56)
    BF16 = (30, 1, 2)
    TQ1_0 = (34, 256, 54)
    TQ2_0 = (35, 256, 66)
    MXFP4 = (39, 32, 17)
    NVFP4 = (40, 64, 36)     # 4 UE4M3 scales of 16-element sub-blocks, 32 bytes of E2M1 pairs
    Q1_0 = (41, 128, 18)     # one f16 scale, a bit per element
    Q2_0 = (42, 64, 18)      # one f16 scale, 2 bits per element

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
    def cpu_from_float(self) -> bool:
        """Whether ggml-cpu has ``from_float`` for the type (it can write it: a KV cache's SET_ROWS, an
        activation's conversion); the integer types are never written from floats here."""
        return self not in _NO_CPU_FROM_FLOAT and self not in (GGMLType.I8, GGMLType.I16, GGMLType.I64,
                                                                  GGMLType.F64)

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


# type_traits_cpu[type].from_float == NULL in ggml-cpu.c: these need ggml_quantize_init's importance data
_NO_CPU_FROM_FLOAT = frozenset({GGMLType.IQ2_XXS, GGMLType.IQ2_XS, GGMLType.IQ3_XXS, GGMLType.IQ3_S,
                                GGMLType.IQ2_S, GGMLType.IQ1_S, GGMLType.IQ1_M})

F32 = GGMLType.F32
F16 = GGMLType.F16
BF16 = GGMLType.BF16
I32 = GGMLType.I32
Q4_0 = GGMLType.Q4_0
Q8_0 = GGMLType.Q8_0


_F32 = struct.Struct("<f")


def to_f32(x: float) -> float:
    """``(float) x`` as C casts a double: rounded to the nearest float32, infinity past its range. An
    operation on two float32 values done in double and cast back is the float32 operation (a double
    holds more than twice float32's precision)."""
    try:
        return float(_F32.unpack(_F32.pack(x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)
