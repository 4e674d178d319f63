"""Op constructors with ggml's shape rules and naming (``ggml.c``).

Every constructor returns a new :class:`Tensor`; none computes anything. Views
always point at the base tensor with accumulated offsets (``ggml_new_tensor_impl`` flattens ``view_src``).
"""

from __future__ import annotations

from collections.abc import Sequence

from toolkit.ggml.tensor import GluOp, Op, Tensor, UnaryOp
from toolkit.ggml.types import F32, I32, GGMLType

__all__ = [
    "new_tensor", "new_tensor_1d", "new_tensor_2d", "new_tensor_3d", "new_tensor_4d",
    "dup_tensor", "view_tensor", "add", "sub", "mul", "div", "add1", "scale", "sqr", "sqrt",
    "log", "sum", "sum_rows", "mean", "argmax", "concat", "unary", "silu", "gelu", "relu", "exp",
    "tanh", "neg", "sigmoid", "norm", "rms_norm", "mul_mat", "get_rows", "set_rows", "cpy",
    "cont", "cont_2d", "cont_3d", "cont_4d", "reshape", "reshape_1d", "reshape_2d",
    "reshape_3d", "reshape_4d", "view_1d", "view_2d", "view_3d", "view_4d", "permute",
    "transpose", "diag_mask_inf", "soft_max", "soft_max_ext", "rope_ext", "flash_attn_ext",
    "glu_split", "swiglu_split", "swiglu", "fill", "repeat", "clamp", "mul_mat_id", "argsort",
    "argsort_top_k", "add_id", "swiglu_oai", "flash_attn_ext_add_sinks", "soft_max_add_sinks",
    "scale_inplace", "softplus", "l2_norm", "ssm_conv", "gated_delta_net", "rope_multi",
]


def _fail(op: str, msg: str) -> ValueError:
    return ValueError(f"ggml_{op}: {msg}")


# ---- creation --------------------------------------------------------------------------

def new_tensor(type_: GGMLType, ne: Sequence[int], name: str = "") -> Tensor:
    return Tensor(type_, ne, name=name)


def new_tensor_1d(type_: GGMLType, ne0: int, name: str = "") -> Tensor:
    return Tensor(type_, (ne0,), name=name)


def new_tensor_2d(type_: GGMLType, ne0: int, ne1: int, name: str = "") -> Tensor:
    return Tensor(type_, (ne0, ne1), name=name)


def new_tensor_3d(type_: GGMLType, ne0: int, ne1: int, ne2: int, name: str = "") -> Tensor:
    return Tensor(type_, (ne0, ne1, ne2), name=name)


def new_tensor_4d(type_: GGMLType, ne0: int, ne1: int, ne2: int, ne3: int, name: str = "") -> Tensor:
    return Tensor(type_, (ne0, ne1, ne2, ne3), name=name)


def dup_tensor(a: Tensor) -> Tensor:
    """A new contiguous tensor of a's type and shape (unnamed)."""
    return Tensor(a.type, a.ne)


def view_tensor(a: Tensor) -> Tensor:
    """``ggml_view_tensor``: same type, shape and strides, op NONE, named ``"<a> (view)"``."""
    return Tensor(a.type, a.ne, view_src=a, view_offs=0, nb=a.nb, name=f"{a.name} (view)")


def _op(result: Tensor, op: Op, *src: Tensor | None, **params: object) -> Tensor:
    result.op = op
    result.src = list(src)
    result.op_params.update(params)
    return result


# ---- element-wise ----------------------------------------------------------------------

def can_repeat(b: Tensor, a: Tensor) -> bool:
    """``ggml_can_repeat(b, a)``: b broadcasts to a."""
    return b.nelements == 0 or all(a.ne[i] % b.ne[i] == 0 for i in range(4))


def _binary(op: Op, name: str, a: Tensor, b: Tensor) -> Tensor:
    if not can_repeat(b, a):
        raise _fail(name, f"cannot broadcast {b.name or 'b'} {list(b.ne)} to {a.name or 'a'} {list(a.ne)}")
    return _op(dup_tensor(a), op, a, b)


def add(a: Tensor, b: Tensor) -> Tensor:
    return _binary(Op.ADD, "add", a, b)


def sub(a: Tensor, b: Tensor) -> Tensor:
    return _binary(Op.SUB, "sub", a, b)


def mul(a: Tensor, b: Tensor) -> Tensor:
    return _binary(Op.MUL, "mul", a, b)


def div(a: Tensor, b: Tensor) -> Tensor:
    return _binary(Op.DIV, "div", a, b)


def add1(a: Tensor, b: Tensor) -> Tensor:
    if b.nelements != 1:
        raise _fail("add1", f"b must be a scalar, got {list(b.ne)}")
    return _op(dup_tensor(a), Op.ADD1, a, b)


def scale(a: Tensor, s: float, b: float = 0.0) -> Tensor:
    return _op(dup_tensor(a), Op.SCALE, a, s=float(s), b=float(b))


def fill(a: Tensor, c: float) -> Tensor:
    return _op(dup_tensor(a), Op.FILL, a, c=float(c))


def clamp(a: Tensor, lo: float, hi: float) -> Tensor:
    return _op(view_tensor(a), Op.CLAMP, a, min=float(lo), max=float(hi))


def sqr(a: Tensor) -> Tensor:
    return _op(dup_tensor(a), Op.SQR, a)


def sqrt(a: Tensor) -> Tensor:
    return _op(dup_tensor(a), Op.SQRT, a)


def log(a: Tensor) -> Tensor:
    return _op(dup_tensor(a), Op.LOG, a)


def unary(a: Tensor, kind: UnaryOp) -> Tensor:
    return _op(dup_tensor(a), Op.UNARY, a, unary=kind)


def silu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SILU)


def gelu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.GELU)


def relu(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.RELU)


def exp(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.EXP)


def tanh(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.TANH)


def neg(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.NEG)


def sigmoid(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SIGMOID)


def glu_split(a: Tensor, b: Tensor, kind: GluOp) -> Tensor:
    if a.ne != b.ne or a.type != b.type:
        raise _fail("glu", f"a {list(a.ne)} and b {list(b.ne)} must have the same type and shape")
    return _op(Tensor(a.type, a.ne), Op.GLU, a, b, glu=kind, swapped=False)


def swiglu_split(a: Tensor, b: Tensor) -> Tensor:
    """``ggml_swiglu_split(a, b)`` = silu(a) * b, one GLU node (printed SWIGLU)."""
    return glu_split(a, b, GluOp.SWIGLU)


def geglu_split(a: Tensor, b: Tensor) -> Tensor:
    """``ggml_geglu_split(a, b)`` = gelu(a) * b, one GLU node (printed GEGLU)."""
    return glu_split(a, b, GluOp.GEGLU)


def swiglu(a: Tensor) -> Tensor:
    """Fused swiglu over the two halves of a's rows."""
    if a.ne[0] % 2:
        raise _fail("swiglu", f"ne[0]={a.ne[0]} must be even")
    ne = (a.ne[0] // 2, a.ne[1], a.ne[2], a.ne[3])
    return _op(Tensor(a.type, ne), Op.GLU, a, None, glu=GluOp.SWIGLU, swapped=False)


# ---- reductions ------------------------------------------------------------------------

def sum(a: Tensor) -> Tensor:  # noqa: A001 - ggml's name
    return _op(Tensor(a.type, (1,)), Op.SUM, a)


def sum_rows(a: Tensor) -> Tensor:
    return _op(Tensor(a.type, (1, a.ne[1], a.ne[2], a.ne[3])), Op.SUM_ROWS, a)


def mean(a: Tensor) -> Tensor:
    return _op(Tensor(F32, (1, a.ne[1], a.ne[2], a.ne[3])), Op.MEAN, a)


def argmax(a: Tensor) -> Tensor:
    if a.n_dims > 2:
        raise _fail("argmax", f"expects a matrix, got {list(a.ne)}")
    return _op(Tensor(I32, (a.ne[1],)), Op.ARGMAX, a)


def repeat(a: Tensor, b: Tensor) -> Tensor:
    if not can_repeat(a, b):
        raise _fail("repeat", f"cannot repeat {list(a.ne)} to {list(b.ne)}")
    return _op(Tensor(a.type, b.ne), Op.REPEAT, a)


def repeat_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """``ggml_repeat_4d``: ``a`` tiled to the given shape (each dimension a multiple of a's)."""
    ne = (ne0, ne1, ne2, ne3)
    if any(n % m for n, m in zip(ne, a.ne)):
        raise _fail("repeat_4d", f"cannot repeat {list(a.ne)} to {list(ne)}")
    return _op(Tensor(a.type, ne), Op.REPEAT, a)


def concat(a: Tensor, b: Tensor, dim: int) -> Tensor:
    if not 0 <= dim < 4:
        raise _fail("concat", f"dim {dim} out of range 0..3")
    if a.type != b.type:
        raise _fail("concat", f"types differ: {a.type.name} vs {b.type.name}")
    ne = list(a.ne)
    for d in range(4):
        if d != dim and a.ne[d] != b.ne[d]:
            raise _fail("concat", f"ne[{d}] differs: {a.ne[d]} vs {b.ne[d]}")
    ne[dim] = a.ne[dim] + b.ne[dim]
    return _op(Tensor(a.type, ne), Op.CONCAT, a, b, dim=dim)


# ---- normalisation, matmul, rows -------------------------------------------------------

def norm(a: Tensor, eps: float) -> Tensor:
    return _op(dup_tensor(a), Op.NORM, a, eps=float(eps))


def rms_norm(a: Tensor, eps: float) -> Tensor:
    return _op(dup_tensor(a), Op.RMS_NORM, a, eps=float(eps))


def mul_mat(a: Tensor, b: Tensor) -> Tensor:
    """``ggml_mul_mat(a, b)``: result[i, j] = dot(a row i, b row j); ne = [a.ne1, b.ne1, b.ne2, b.ne3]."""
    if a.ne[0] != b.ne[0] or b.ne[2] % a.ne[2] or b.ne[3] % a.ne[3]:
        raise _fail("mul_mat", f"cannot multiply {a.name or 'a'} {list(a.ne)} by {b.name or 'b'} {list(b.ne)}")
    if a.nb[0] > a.nb[1]:
        raise _fail("mul_mat", f"a ({a.name}) must not be transposed")
    return _op(Tensor(F32, (a.ne[1], b.ne[1], b.ne[2], b.ne[3])), Op.MUL_MAT, a, b)


def mul_mat_id(as_: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """``ggml_mul_mat_id(as, b, ids)``: per token, the experts ids picks from the 3-D ``as``.

    ``as`` is ``[k_in, n_out, n_expert]``, ``b`` ``[k_in, n_b, n_tokens]``, ``ids`` I32 ``[n_used, n_tokens]``;
    the result is F32 ``[n_out, n_used, n_tokens]`` (srcs: as, b, ids).
    """
    ok = (as_.ne[3] == 1 and b.ne[3] == 1 and ids.ne[2] == 1 and ids.ne[3] == 1 and ids.ne[1] == b.ne[2]
          and as_.ne[0] == b.ne[0] and ids.ne[0] % b.ne[1] == 0)
    if not ok or ids.type is not I32:
        raise _fail("mul_mat_id", f"cannot multiply experts {list(as_.ne)} by {list(b.ne)} with ids "
                                  f"{ids.type.lower} {list(ids.ne)}")
    if as_.nb[0] > as_.nb[1]:
        raise _fail("mul_mat_id", f"as ({as_.name}) must not be transposed")
    return _op(Tensor(F32, (as_.ne[1], ids.ne[0], b.ne[2], 1)), Op.MUL_MAT_ID, as_, b, ids)


def argsort(a: Tensor, descending: bool = False) -> Tensor:
    """``ggml_argsort``: I32 indices that sort each row (``GGML_SORT_ORDER_ASC``/``DESC``)."""
    return _op(Tensor(I32, a.ne), Op.ARGSORT, a, order="desc" if descending else "asc")


def argsort_top_k(a: Tensor, k: int) -> Tensor:
    """``ggml_argsort_top_k``: a descending ARGSORT and a view of its first k columns."""
    if not 0 < k <= a.ne[0]:
        raise _fail("argsort_top_k", f"k={k} must be in 1..{a.ne[0]}")
    r = argsort(a, descending=True)
    return view_4d(r, k, r.ne[1], r.ne[2], r.ne[3], r.nb[1], r.nb[2], r.nb[3], 0)


def get_rows(a: Tensor, b: Tensor) -> Tensor:
    """Rows of a picked by the I32 ids in b: ne = [a.ne0, b.ne0, b.ne1, b.ne2]."""
    if a.ne[2] != b.ne[1] or b.ne[3] != 1 or b.type is not I32:
        raise _fail("get_rows", f"bad ids {b.name or 'b'} {b.type.lower} {list(b.ne)} for {list(a.ne)}")
    out_type = I32 if a.type is I32 else F32
    return _op(Tensor(out_type, (a.ne[0], b.ne[0], b.ne[1], b.ne[2])), Op.GET_ROWS, a, b)


def set_rows(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write the rows of b into a at the ids c; the result is a view of a (srcs b, c, a)."""
    ok = (
        a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3] and b.ne[1] == c.ne[0]
        and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1
    )
    if not ok:
        raise _fail("set_rows", f"shapes do not fit: a {list(a.ne)}, b {list(b.ne)}, ids {list(c.ne)}")
    if b.type is not F32 or c.type not in (GGMLType.I32, GGMLType.I64):
        raise _fail("set_rows", f"b must be f32 and ids i32/i64, got {b.type.lower}/{c.type.lower}")
    return _op(view_tensor(a), Op.SET_ROWS, b, c, a)


def diag_mask_inf(a: Tensor, n_past: int) -> Tensor:
    return _op(dup_tensor(a), Op.DIAG_MASK_INF, a, n_past=n_past)


def soft_max(a: Tensor) -> Tensor:
    return soft_max_ext(a, None, 1.0, 0.0)


def soft_max_ext(a: Tensor, mask: Tensor | None, scale: float, max_bias: float) -> Tensor:
    if mask is not None and (mask.ne[0] != a.ne[0] or mask.ne[1] < a.ne[1]):
        raise _fail("soft_max_ext", f"mask {list(mask.ne)} does not cover {list(a.ne)}")
    return _op(dup_tensor(a), Op.SOFT_MAX, a, mask, scale=float(scale), max_bias=float(max_bias))


def rope_ext(
    a: Tensor,
    pos: Tensor,
    freq_factors: Tensor | None,
    n_dims: int,
    mode: int = 0,
    n_ctx_orig: int = 0,
    freq_base: float = 10000.0,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    attn_factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> Tensor:
    if pos.type is not I32 or pos.ne[0] != a.ne[2]:
        raise _fail("rope_ext", f"positions {pos.type.lower} {list(pos.ne)} must be i32 of length ne[2]={a.ne[2]}")
    return _op(
        dup_tensor(a), Op.ROPE, a, pos, freq_factors,
        n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=freq_base,
        freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
        beta_fast=beta_fast, beta_slow=beta_slow,
    )


def flash_attn_ext(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
    max_bias: float = 0.0, logit_softcap: float = 0.0,
) -> Tensor:
    """Result ne = [v.ne0, q.ne2, q.ne1, q.ne3] (already permuted, f32)."""
    if k.ne[0] != q.ne[0] or k.ne[1] != v.ne[1] or q.ne[2] % k.ne[2] or q.ne[3] % k.ne[3]:
        raise _fail("flash_attn_ext", f"q {list(q.ne)}, k {list(k.ne)}, v {list(v.ne)} do not fit")
    if mask is not None and mask.ne[0] != k.ne[1]:
        raise _fail("flash_attn_ext", f"mask ne[0]={mask.ne[0]} must equal n_kv={k.ne[1]}")
    out = Tensor(F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]))
    return _op(out, Op.FLASH_ATTN_EXT, q, k, v, mask,
               scale=float(scale), max_bias=float(max_bias), logit_softcap=float(logit_softcap))


# ---- copies and views ------------------------------------------------------------------

def cpy(a: Tensor, b: Tensor) -> Tensor:
    if a.nelements != b.nelements:
        raise _fail("cpy", f"{a.nelements} elements into {b.nelements}")
    r = view_tensor(b)
    r.name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    return _op(r, Op.CPY, a, b)


def pad(a: Tensor, p0: int, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """``ggml_pad``: ``ggml_pad_ext`` with zeros after each dimension (none before, not circular)."""
    if min(p0, p1, p2, p3) < 0:
        raise _fail("pad", f"padding {[p0, p1, p2, p3]} must be >= 0")
    out = Tensor(a.type, (a.ne[0] + p0, a.ne[1] + p1, a.ne[2] + p2, a.ne[3] + p3))
    return _op(out, Op.PAD, a, lp0=0, rp0=p0, lp1=0, rp1=p1, lp2=0, rp2=p2, lp3=0, rp3=p3, circular=0)


def cont(a: Tensor) -> Tensor:
    return cont_4d(a, *a.ne)


def cont_2d(a: Tensor, ne0: int, ne1: int) -> Tensor:
    return cont_4d(a, ne0, ne1, 1, 1)


def cont_3d(a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return cont_4d(a, ne0, ne1, ne2, 1)


def cont_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    if ne0 * ne1 * ne2 * ne3 != a.nelements:
        raise _fail("cont", f"{a.nelements} elements into {[ne0, ne1, ne2, ne3]}")
    return _op(Tensor(a.type, (ne0, ne1, ne2, ne3), name=f"{a.name} (cont)"), Op.CONT, a)


def _reshape(a: Tensor, ne: Sequence[int]) -> Tensor:
    n = 1
    for x in ne:
        n *= x
    if not a.is_contiguous:
        raise _fail("reshape", f"{a.name or 'tensor'} is not contiguous")
    if n != a.nelements:
        raise _fail("reshape", f"{a.nelements} elements of {a.name or 'tensor'} into {list(ne)}")
    r = Tensor(a.type, ne, view_src=a, view_offs=0, name=f"{a.name} (reshaped)")
    return _op(r, Op.RESHAPE, a)


def reshape(a: Tensor, b: Tensor) -> Tensor:
    return _reshape(a, b.ne)


def reshape_1d(a: Tensor, ne0: int) -> Tensor:
    return _reshape(a, (ne0,))


def reshape_2d(a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape(a, (ne0, ne1))


def reshape_3d(a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape(a, (ne0, ne1, ne2))


def reshape_4d(a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape(a, (ne0, ne1, ne2, ne3))


def _view(a: Tensor, ne: Sequence[int], nb_tail: Sequence[int], offset: int) -> Tensor:
    r = Tensor(a.type, ne, view_src=a, view_offs=offset, name=f"{a.name} (view)")
    nb = list(r.nb)
    for i, x in enumerate(nb_tail, start=1):
        nb[i] = x
    # ggml_view_2d/3d: the dims past the given strides continue from the last one
    for i in range(len(nb_tail) + 1, 4):
        nb[i] = nb[i - 1] * r.ne[i - 1]
    r.nb = (nb[0], nb[1], nb[2], nb[3])
    return _op(r, Op.VIEW, a, offset=offset)


def view_1d(a: Tensor, ne0: int, offset: int) -> Tensor:
    return _view(a, (ne0,), (), offset)


def view_2d(a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    return _view(a, (ne0, ne1), (nb1,), offset)


def view_3d(a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    return _view(a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(
    a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int, offset: int
) -> Tensor:
    return _view(a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


def permute(a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """``ggml_permute``: source dim i goes to position axis_i."""
    axes = (axis0, axis1, axis2, axis3)
    if sorted(axes) != [0, 1, 2, 3]:
        raise _fail("permute", f"axes {axes} are not a permutation of 0..3")
    r = view_tensor(a)
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = a.ne[i]
        nb[ax] = a.nb[i]
    r.ne = (ne[0], ne[1], ne[2], ne[3])
    r.nb = (nb[0], nb[1], nb[2], nb[3])
    r.name = f"{a.name} (permuted)"
    return _op(r, Op.PERMUTE, a, axes=axes)


def transpose(a: Tensor) -> Tensor:
    r = view_tensor(a)
    r.ne = (a.ne[1], a.ne[0], a.ne[2], a.ne[3])
    r.nb = (a.nb[1], a.nb[0], a.nb[2], a.nb[3])
    r.name = f"{a.name} (transposed)"
    return _op(r, Op.TRANSPOSE, a)


# ---- gpt-oss: expert biases, the clamped SwiGLU, attention sinks --------------------------

def add_id(a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """``ggml_add_id(a, b, ids)``: ``a[:, i, t] + b[:, ids[i, t]]``, the bias of each selected expert.

    ``a`` is F32 ``[n, n_used, n_tokens]``, ``b`` F32 ``[n, n_expert]`` (one bias row per expert),
    ``ids`` I32 ``[n_used, n_tokens]``; the result has a's shape (srcs: a, b, ids).
    """
    ok = (a.ne[0] == b.ne[0] and a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1] and a.ne[3] == 1
          and b.ne[2] == 1 and b.ne[3] == 1 and ids.type is I32 and a.type is F32 and b.type is F32)
    if not ok:
        raise _fail("add_id", f"cannot add biases {b.type.lower} {list(b.ne)} to {a.type.lower} {list(a.ne)} "
                              f"with ids {ids.type.lower} {list(ids.ne)}")
    return _op(dup_tensor(a), Op.ADD_ID, a, b, ids)


def swiglu_oai(a: Tensor, b: Tensor, alpha: float, limit: float) -> Tensor:
    """``ggml_swiglu_oai(a, b, alpha, limit)``: ``x * sigmoid(alpha * x) * (y + 1)`` with
    ``x = min(a, limit)`` and ``y = clamp(b, -limit, limit)``; one GLU node (printed SWIGLU_OAI)."""
    if a.ne != b.ne or a.type != b.type:
        raise _fail("swiglu_oai", f"a {list(a.ne)} and b {list(b.ne)} must have the same type and shape")
    return _op(Tensor(a.type, a.ne), Op.GLU, a, b, glu=GluOp.SWIGLU_OAI, swapped=False,
               alpha=float(alpha), limit=float(limit))


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """``ggml_flash_attn_ext_add_sinks``: the per-head sinks (F32 ``[n_head]``) as FLASH_ATTN_EXT's src[4];
    nothing without sinks."""
    _add_sinks("flash_attn_ext_add_sinks", a, sinks, Op.FLASH_ATTN_EXT, slot=4, head_dim=1)


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """``ggml_soft_max_add_sinks``: the per-head sinks (F32 ``[n_head]``) as SOFT_MAX's src[2];
    nothing without sinks."""
    _add_sinks("soft_max_add_sinks", a, sinks, Op.SOFT_MAX, slot=2, head_dim=2)


def _add_sinks(fn: str, a: Tensor, sinks: Tensor | None, op: Op, slot: int, head_dim: int) -> None:
    """Set ``a->src[slot] = sinks`` after checking that ``a`` is ``op`` and the sinks are F32 with one
    value per head (``a->ne[head_dim]``), as both ``ggml_*_add_sinks`` assert."""
    if sinks is None:
        return
    if a.op is not op or sinks.type is not F32 or sinks.ne[0] != a.ne[head_dim]:
        raise _fail(fn, f"sinks {sinks.type.lower} {list(sinks.ne)} do not fit {a.op.value} {list(a.ne)}")
    a.src = [*a.src[:slot], *[None] * (slot - len(a.src)), sinks]


# ---- recurrent layers (hybrid models) ----------------------------------------------------

def scale_inplace(a: Tensor, s: float) -> Tensor:
    """``ggml_scale_inplace``: SCALE whose result is a view of ``a`` (``"<a> (view)"``)."""
    return _op(view_tensor(a), Op.SCALE, a, s=float(s), b=0.0)


def softplus(a: Tensor) -> Tensor:
    return unary(a, UnaryOp.SOFTPLUS)


def l2_norm(a: Tensor, eps: float) -> Tensor:
    """``ggml_l2_norm``: each row divided by ``max(||row||, eps)``."""
    return _op(dup_tensor(a), Op.L2_NORM, a, eps=float(eps))


def ssm_conv(sx: Tensor, c: Tensor) -> Tensor:
    """``ggml_ssm_conv(sx [d_conv - 1 + n_t, d_inner, n_s], c [d_conv, d_inner])``: F32 ``[d_inner, n_t, n_s]``."""
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    if sx.ne[3] != 1 or c.ne[2] != 1 or c.ne[3] != 1 or sx.ne[1] != d_inner or n_t < 0:
        raise _fail("ssm_conv", f"sx {list(sx.ne)} does not fit the kernel {list(c.ne)}")
    return _op(Tensor(F32, (d_inner, n_t, sx.ne[2])), Op.SSM_CONV, sx, c)


def gated_delta_net(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, K: int) -> Tensor:
    """``ggml_gated_delta_net``: F32 ``[S_v * H, n_tokens * n_seqs + K * S_v * n_seqs]``, the outputs of
    every token then ``K`` snapshots of the state ``[S_v, S_v, H, n_seqs]`` (``K`` is op param 0)."""
    S_v, H, n_tokens, n_seqs = v.ne
    if g.ne[0] not in (1, S_v) or beta.ne[0] != 1 or state.ne != (S_v, S_v, H, n_seqs) or K < 1:
        raise _fail("gated_delta_net", f"v {list(v.ne)}, g {list(g.ne)}, beta {list(beta.ne)}, "
                    f"state {list(state.ne)}, K={K} do not fit")
    out = Tensor(F32, (S_v * H, n_tokens * n_seqs + K * S_v * n_seqs))
    return _op(out, Op.GATED_DELTA_NET, q, k, v, g, beta, state, K=int(K))


def rope_multi(a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int, sections: Sequence[int], mode: int,
               n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0) -> Tensor:
    """``ggml_rope_multi``: ROPE with four positions per token (``GGML_ROPE_TYPE_MROPE`` bit) and the
    M-RoPE ``sections``."""
    if pos.type is not I32 or pos.ne[0] != 4 * a.ne[2]:
        raise _fail("rope_multi", f"positions {pos.type.lower} {list(pos.ne)} must be i32 of length 4 * ne[2]")
    return _op(
        dup_tensor(a), Op.ROPE, a, pos, freq_factors,
        n_dims=n_dims, mode=mode, n_ctx_orig=n_ctx_orig, freq_base=freq_base,
        freq_scale=freq_scale, ext_factor=ext_factor, attn_factor=attn_factor,
        beta_fast=beta_fast, beta_slow=beta_slow, sections=tuple(int(x) for x in sections),
    )
