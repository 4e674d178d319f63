"""ggml's tensor model: type, ne/nb in 4 dims, op, sources, views, flags (``struct ggml_tensor``)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

from toolkit.ggml.types import GGMLType

MAX_DIMS = 4
MAX_SRC = 10
MAX_NAME = 64  # GGML_MAX_NAME: names are truncated to 63 characters


class Op(enum.Enum):
    """ggml ops (the subset llama graphs, tests and traced JAX functions use)."""

    NONE = "NONE"
    DUP = "DUP"
    ADD = "ADD"
    ADD_ID = "ADD_ID"
    ADD1 = "ADD1"
    SUB = "SUB"
    MUL = "MUL"
    DIV = "DIV"
    SQR = "SQR"
    SQRT = "SQRT"
    LOG = "LOG"
    SIN = "SIN"
    COS = "COS"
    SUM = "SUM"
    SUM_ROWS = "SUM_ROWS"
    MEAN = "MEAN"
    ARGMAX = "ARGMAX"
    REPEAT = "REPEAT"
    CONCAT = "CONCAT"
    SILU_BACK = "SILU_BACK"
    NORM = "NORM"
    RMS_NORM = "RMS_NORM"
    RMS_NORM_BACK = "RMS_NORM_BACK"
    MUL_MAT = "MUL_MAT"
    MUL_MAT_ID = "MUL_MAT_ID"
    SCALE = "SCALE"
    FILL = "FILL"
    SET = "SET"
    CPY = "CPY"
    CONT = "CONT"
    RESHAPE = "RESHAPE"
    VIEW = "VIEW"
    PERMUTE = "PERMUTE"
    TRANSPOSE = "TRANSPOSE"
    GET_ROWS = "GET_ROWS"
    SET_ROWS = "SET_ROWS"
    DIAG_MASK_INF = "DIAG_MASK_INF"
    DIAG_MASK_ZERO = "DIAG_MASK_ZERO"
    SOFT_MAX = "SOFT_MAX"
    SOFT_MAX_BACK = "SOFT_MAX_BACK"
    ROPE = "ROPE"
    ROPE_BACK = "ROPE_BACK"
    CLAMP = "CLAMP"
    PAD = "PAD"
    ARANGE = "ARANGE"
    ARGSORT = "ARGSORT"
    FLASH_ATTN_EXT = "FLASH_ATTN_EXT"
    UNARY = "UNARY"
    GLU = "GLU"
    L2_NORM = "L2_NORM"
    SSM_CONV = "SSM_CONV"
    GATED_DELTA_NET = "GATED_DELTA_NET"
    # ops a traced JAX primitive maps to when ggml has no equivalent
    JAX = "JAX"


class UnaryOp(enum.Enum):
    ABS = "ABS"
    NEG = "NEG"
    TANH = "TANH"
    RELU = "RELU"
    SIGMOID = "SIGMOID"
    GELU = "GELU"
    SILU = "SILU"
    EXP = "EXP"
    SOFTPLUS = "SOFTPLUS"


class GluOp(enum.Enum):
    REGLU = "REGLU"
    GEGLU = "GEGLU"
    SWIGLU = "SWIGLU"
    SWIGLU_OAI = "SWIGLU_OAI"


VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


def is_view_op(op: Op) -> bool:
    """VIEW, RESHAPE, PERMUTE and TRANSPOSE: skipped by the scheduler's passes 2, 3 and 5
    (``ggml_is_view_op`` in ``ggml_backend_sched_split_graph``)."""
    return op in VIEW_OPS


class TensorFlag(enum.IntFlag):
    NONE = 0
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8


class BufferUsage(enum.Enum):
    """ggml_backend_buffer_usage: what a backend buffer holds."""

    ANY = "any"
    WEIGHTS = "weights"
    COMPUTE = "compute"


def _contiguous_nb(type_: GGMLType, ne: Sequence[int]) -> tuple[int, int, int, int]:
    nb0 = type_.type_size
    nb1 = nb0 * (ne[0] // type_.blck_size)
    nb2 = nb1 * ne[1]
    nb3 = nb2 * ne[2]
    return (nb0, nb1, nb2, nb3)


class Tensor:
    """A ggml tensor. Compared and hashed by identity, as ggml keys tensors by pointer.

    ``src`` is a list so the scheduler can redirect sources to copies (``ggml_backend_sched_split_graph`` pass 5).
    It holds the sources the op was given, optional ones as None (ggml's fixed ``src[GGML_MAX_SRC]``
    array without its trailing empty slots, which every pass over the sources would skip).
    ``buffer`` is set for pre-allocated tensors (weights, KV cache): any object with
    ``buft`` and ``usage`` attributes, such as ``toolkit.backend.Buffer``.
    """

    __slots__ = (
        "type", "ne", "nb", "op", "op_params", "src", "view_src", "view_offs",
        "flags", "_name", "buffer", "data", "extra",
    )
    # declared for the type checker: __init__ reads them on another Tensor (view flattening)
    view_src: Tensor | None
    view_offs: int

    def __init__(
        self,
        type_: GGMLType,
        ne: Sequence[int],
        *,
        op: Op = Op.NONE,
        src: Sequence[Tensor | None] = (),
        view_src: Tensor | None = None,
        view_offs: int = 0,
        nb: Sequence[int] | None = None,
        name: str = "",
        op_params: dict[str, Any] | None = None,
    ) -> None:
        ne4 = tuple(int(x) for x in ne) + (1,) * (MAX_DIMS - len(ne))
        if len(ne4) != MAX_DIMS:
            raise ValueError(f"a ggml tensor has at most {MAX_DIMS} dims, got ne={tuple(ne)}")
        if ne4[0] % type_.blck_size:
            raise ValueError(
                f"ne[0]={ne4[0]} is not a multiple of {type_.name}'s block size {type_.blck_size}"
            )
        # view flattening (ggml_new_tensor_impl): view_src is always the base tensor
        if view_src is not None and view_src.view_src is not None:
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        if view_src is not None:
            # ggml checks the contiguous size of the view against the base
            needed = _nbytes(type_, ne4, _contiguous_nb(type_, ne4))
            if view_offs + needed > view_src.nbytes and needed > 0:
                raise ValueError(
                    f"view of {view_src.name!r} at offset {view_offs} needs {needed} bytes "
                    f"but the base holds {view_src.nbytes}"
                )
        self.type = type_
        self.ne: tuple[int, int, int, int] = ne4  # type: ignore[assignment]
        self.nb: tuple[int, int, int, int] = (
            tuple(int(x) for x in nb) if nb is not None else _contiguous_nb(type_, ne4)  # type: ignore[assignment]
        )
        self.op = op
        self.op_params: dict[str, Any] = dict(op_params or {})
        self.src: list[Tensor | None] = list(src)
        self.view_src = view_src
        self.view_offs = view_offs
        self.flags = TensorFlag.NONE
        self._name = ""
        self.name = name
        self.buffer: Any = None
        self.data: Any = None
        self.extra: Any = None

    def duplicate(self, src: list[Tensor | None], view_src: Tensor | None) -> Tensor:
        """A new tensor with this one's fields, over the given sources and view base (no checks: the
        fields were checked when this one was made). Graph copies are built from it."""
        t = Tensor.__new__(Tensor)
        t.type, t.ne, t.nb, t.op = self.type, self.ne, self.nb, self.op
        t.op_params = dict(self.op_params) if self.op_params else {}
        t.src, t.view_src, t.view_offs = src, view_src, self.view_offs
        t.flags, t.name = self.flags, self._name
        t.buffer, t.data, t.extra = self.buffer, self.data, self.extra
        return t

    # ---- identity -------------------------------------------------------------------
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    # ---- names and flags ------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = value[: MAX_NAME - 1]

    def set_name(self, name: str) -> Tensor:
        self.name = name
        return self

    def set_input(self) -> Tensor:
        self.flags |= TensorFlag.INPUT
        return self

    def set_output(self) -> Tensor:
        self.flags |= TensorFlag.OUTPUT
        return self

    @property
    def is_input(self) -> bool:
        return bool(self.flags & TensorFlag.INPUT)

    @property
    def is_output(self) -> bool:
        return bool(self.flags & TensorFlag.OUTPUT)

    # ---- shape ----------------------------------------------------------------------
    @property
    def n_dims(self) -> int:
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def nelements(self) -> int:
        n0, n1, n2, n3 = self.ne
        return n0 * n1 * n2 * n3

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        """``ggml_nbytes``: 0 when empty, the span of a strided view, rows by block."""
        return _nbytes(self.type, self.ne, self.nb)

    @property
    def is_contiguous(self) -> bool:
        return self.is_contiguous_n(0)

    def is_contiguous_n(self, n: int) -> bool:
        """``ggml_is_contiguous_n``: dims above ``n`` packed; size-1 dims ignored."""
        blck = self.type.blck_size
        next_nb = self.type.type_size
        if self.ne[0] != blck and self.nb[0] != next_nb:
            return False
        next_nb *= self.ne[0] // blck
        for i in range(1, MAX_DIMS):
            if self.ne[i] != 1:
                if i > n:
                    if self.nb[i] != next_nb:
                        return False
                    next_nb *= self.ne[i]
                else:
                    next_nb = self.ne[i] * self.nb[i]
        return True

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    @property
    def is_weight(self) -> bool:
        """A weight: has a buffer whose usage is WEIGHTS (a view of a weight is not: its own ``buffer``
        stays null until it is allocated)."""
        return self.buffer is not None and getattr(self.buffer, "usage", None) is BufferUsage.WEIGHTS

    @property
    def base(self) -> Tensor:
        return self.view_src if self.view_src is not None else self

    @property
    def srcs(self) -> list[Tensor]:
        """The non-null sources, in order."""
        return [s for s in self.src if s is not None]

    def op_desc(self) -> str:
        """ggml_op_desc: the unary or GLU op name for UNARY and GLU nodes."""
        if self.op is Op.UNARY:
            return str(self.op_params["unary"].value)
        if self.op is Op.GLU:
            return str(self.op_params["glu"].value)
        if self.op is Op.JAX:
            return str(self.op_params.get("primitive", "JAX")).upper()
        return self.op.value

    def shape_str(self) -> str:
        return "[" + ", ".join(str(x) for x in self.ne[: max(self.n_dims, 1)]) + "]"

    def __repr__(self) -> str:
        return f"Tensor({self.name!r}, {self.op_desc()}, {self.type.lower}, {self.shape_str()})"


def _nbytes(type_: GGMLType, ne: Sequence[int], nb: Sequence[int]) -> int:
    ne0, ne1, ne2, ne3 = ne
    if ne0 <= 0 or ne1 <= 0 or ne2 <= 0 or ne3 <= 0:
        return 0
    nb0, nb1, nb2, nb3 = nb
    rest = (ne1 - 1) * nb1 + (ne2 - 1) * nb2 + (ne3 - 1) * nb3
    blck = type_.blck_size
    if blck == 1:
        return type_.type_size + (ne0 - 1) * nb0 + rest
    return ne0 * nb0 // blck + rest


def nbytes(t: Tensor) -> int:
    return t.nbytes


def contiguous_strides(type_: GGMLType, ne: Sequence[int]) -> tuple[int, int, int, int]:
    ne4 = tuple(ne) + (1,) * (MAX_DIMS - len(ne))
    return _contiguous_nb(type_, ne4)
