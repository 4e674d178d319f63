"""One jaxpr equation → ggml graph node(s): which primitives take a ggml op, which become views.

A primitive takes a ggml op only where the scheduler's rules for that op are safe for it:

- element-wise primitives (add, mul, exp, ...) map to ADD, MUL, UNARY EXP, ... so the
  allocator's in-place rule (``ggml_gallocr_allocate_node``: same type, ne and nb as a parent that is at its last
  use) may apply; they qualify only when every operand has the output's shape or is a
  scalar, so reusing an operand's memory is a true element-wise overwrite;
- dot_general with one contracting dim, leading batch dims and one free rhs dim is
  MUL_MAT: the op-offload batch rule (CUDA's ``get_op_batch_size``) then reads the rows in ``ne[1]``;
- a row gather (``table[ids]``, ``jnp.take(table, ids, axis=0)``) is GET_ROWS, whose
  offload batch is 0 (never offloaded by CUDA's ``offload_op``), like llama's token embedding;
- reshape / squeeze / expand_dims / size-preserving broadcast of a contiguous tensor is a
  RESHAPE view, transpose a PERMUTE view, slice and split VIEWs (views are skipped by
  ``ggml_backend_sched_split_graph``'s placement passes and take their base's backend; the allocator
  never plans them);
- everything else is an Op.JAX node with ``op_params["primitive"]`` (no in-place, no view).

Every node keeps ``op_params["primitive"]`` so per-backend support can be decided per
primitive (:mod:`toolkit.trace.support`), and ``extra`` holds the :class:`Step` the executor
runs: the original inputs (the scheduler redirects ``src`` to copies in split_graph pass 5) and a function.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any

from toolkit.ggml.tensor import MAX_SRC, Op, Tensor, UnaryOp
from toolkit.ggml.types import GGMLType
from toolkit.trace.layout import fits_ggml_dims, ggml_dim, ggml_type, ne_of


@dataclass
class Step:
    """How the executor computes one node: ``fn(*values of inputs)``."""

    fn: Callable[..., Any]
    inputs: tuple[Tensor, ...]
    primitive: str
    where: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class LeafInfo:
    """What a leaf holds: a graph input, a parameter (weight), a constant or a literal."""

    kind: str                # "input" | "param" | "const" | "literal"
    shape: tuple[int, ...]
    dtype: str
    value: Any = None        # const / literal value
    index: int = -1          # position among the flat inputs / params
    path: str = ""           # pytree path of a parameter or input


_BINARY = {"add": Op.ADD, "add_any": Op.ADD, "sub": Op.SUB, "mul": Op.MUL, "div": Op.DIV}
_UNARY = {"exp": UnaryOp.EXP, "tanh": UnaryOp.TANH, "neg": UnaryOp.NEG, "abs": UnaryOp.ABS,
          "logistic": UnaryOp.SIGMOID}
_SIMPLE = {"sqrt": Op.SQRT, "log": Op.LOG, "sin": Op.SIN, "cos": Op.COS}
_RESHAPES = frozenset({"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "stop_gradient"})


@dataclass
class EqnView:
    """The parts of a jaxpr equation the mapping reads (also built for inlined equations)."""

    primitive: Any
    name: str
    params: dict[str, Any]
    in_shapes: list[tuple[int, ...]]
    in_dtypes: list[str]
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[str]
    where: str


def binder(prim: Any, params: dict[str, Any], n_out: int) -> Callable[..., Any]:
    """``prim.bind`` as ``jax.core.eval_jaxpr`` does it (sub-jaxprs passed as subfuns)."""
    got = prim.get_bind_params(params)
    # JAX 0.10 returns the params; older releases returned (subfuns, params)
    subfuns, bind_params = (got if isinstance(got, tuple) else ([], got))

    def fn(*xs: Any) -> Any:
        out = prim.bind(*subfuns, *xs, **bind_params)
        if prim.multiple_results and n_out == 1:
            return out[0]
        return out

    fn.__name__ = f"bind_{prim.name}"
    return fn


def _tensor(shape: Sequence[int], dtype: str, op: Op, src: Sequence[Tensor], name: str,
            params: dict[str, Any]) -> Tensor:
    t = ggml_type(dtype)
    assert t is not None  # checked by the converter before mapping
    return Tensor(t, ne_of(shape), op=op, src=list(src), name=name, op_params=params)


def _elementwise_ok(e: EqnView) -> bool:
    """Element-wise in ggml's sense: src0 has the result's shape and type, the others broadcast
    to it (equal dims or 1, or scalars: ``ggml_can_repeat``)."""
    out = e.out_shapes[0]
    if not e.in_shapes or e.in_shapes[0] != out or e.in_dtypes[0] != e.out_dtypes[0]:
        return False
    return all(len(s) == 0 or (len(s) == len(out) and all(a in (b, 1) for a, b in zip(s, out, strict=True)))
               for s in e.in_shapes[1:])


def _commuted(e: EqnView, ins: list[Tensor]) -> tuple[EqnView, list[Tensor]] | None:
    """add/mul with the full-shape operand second: the same node with srcs swapped."""
    if e.name not in ("add", "add_any", "mul") or len(ins) != 2:
        return None
    sw = EqnView(e.primitive, e.name, e.params, e.in_shapes[::-1], e.in_dtypes[::-1], e.out_shapes,
                 e.out_dtypes, e.where)
    return (sw, ins[::-1]) if _elementwise_ok(sw) else None


def _mul_mat_fits(e: EqnView) -> bool:
    (lc, rc), (lb, rb) = e.params["dimension_numbers"]
    nb = len(lb)
    lhs, rhs = e.in_shapes
    return (
        len(lc) == 1 and len(rc) == 1
        and tuple(lb) == tuple(rb) == tuple(range(nb))
        and len(rhs) == nb + 2 and len(lhs) >= nb + 1
        and fits_ggml_dims(lhs, rhs, e.out_shapes[0])
    )


def _is_row_gather(e: EqnView) -> bool:
    dn = e.params["dimension_numbers"]
    operand, idx = e.in_shapes
    out = e.out_shapes[0]
    return (
        len(operand) == 2 and tuple(e.params["slice_sizes"]) == (1, operand[1])
        and tuple(dn.collapsed_slice_dims) == (0,) and tuple(dn.start_index_map) == (0,)
        and tuple(dn.offset_dims) == (len(out) - 1,) and not tuple(dn.operand_batching_dims)
        and len(idx) >= 1 and idx[-1] == 1 and e.in_dtypes[1] in ("int32", "int64", "uint32")
        and fits_ggml_dims(out, idx)
    )


def _is_reshape(e: EqnView, x: Tensor) -> bool:
    """A reshape-like primitive that keeps element order, on a contiguous tensor: a view."""
    if not x.is_contiguous or e.in_dtypes[0] != e.out_dtypes[0]:
        return False
    if prod(e.in_shapes[0]) != prod(e.out_shapes[0]):
        return False
    if e.name == "reshape":
        return e.params.get("dimensions") is None
    if e.name == "broadcast_in_dim":
        dims = tuple(e.params["broadcast_dimensions"])
        return dims == tuple(sorted(dims))
    return True


def make_nodes(e: EqnView, ins: list[Tensor], name: str) -> list[Tensor]:
    """The tensors for the equation's outputs (one per output)."""
    base = {"primitive": e.name}
    n_out = len(e.out_shapes)
    if n_out == 1:
        t = _single(e, ins, name, base)
        if t is None:
            t = _tensor(e.out_shapes[0], e.out_dtypes[0], Op.JAX, ins, name, base)
        fn = binder(e.primitive, e.params, 1)
        if e.name == "dot_general" and t.op is Op.MUL_MAT:
            # ggml order (weight-like rhs first: ``ggml_backend_sched_backend_id_from_cur`` reads the first weight src)
            t.src[0], t.src[1] = ins[1], ins[0]
        t.extra = Step(fn, tuple(ins), e.name, e.where, e.out_shapes[0], e.out_dtypes[0])
        return [t]
    if e.name == "split" and fits_ggml_dims(e.in_shapes[0]) and _viewable(ins[0]):
        return _split_views(e, ins[0], name)
    return _packed(e, ins, name, base)


def _single(e: EqnView, ins: list[Tensor], name: str, base: dict[str, Any]) -> Tensor | None:
    shape, dtype = e.out_shapes[0], e.out_dtypes[0]
    p = e.name
    if p in _BINARY and _elementwise_ok(e):
        return _tensor(shape, dtype, _BINARY[p], ins, name, base)
    if p in _BINARY and (sw := _commuted(e, ins)) is not None:
        # ggml broadcasts src1 into src0 (``ggml_can_repeat``): the full operand goes first
        return _tensor(shape, dtype, _BINARY[p], sw[1], name, base)
    if p in _UNARY and _elementwise_ok(e):
        return _tensor(shape, dtype, Op.UNARY, ins, name, {**base, "unary": _UNARY[p]})
    if p in _SIMPLE and _elementwise_ok(e):
        return _tensor(shape, dtype, _SIMPLE[p], ins, name, base)
    if p == "integer_pow" and e.params.get("y") == 2 and _elementwise_ok(e):
        return _tensor(shape, dtype, Op.SQR, ins, name, base)
    if p == "dot_general" and _mul_mat_fits(e):
        return _tensor(shape, dtype, Op.MUL_MAT, ins, name, base)
    if p == "gather" and _is_row_gather(e):
        return _tensor(shape, dtype, Op.GET_ROWS, ins, name, base)
    if p == "concatenate" and len(ins) == 2 and fits_ggml_dims(shape):
        dim = ggml_dim(int(e.params["dimension"]), len(shape))
        return _tensor(shape, dtype, Op.CONCAT, ins, name, {**base, "dim": dim})
    if p == "reduce_sum" and fits_ggml_dims(e.in_shapes[0]) and len(e.in_shapes[0]) >= 1:
        axes, rank = tuple(e.params["axes"]), len(e.in_shapes[0])
        if axes == (rank - 1,):
            return _tensor(shape, dtype, Op.SUM_ROWS, ins, name, base)
        if axes == tuple(range(rank)):
            return _tensor(shape, dtype, Op.SUM, ins, name, base)
    if p in _RESHAPES and _viewable(ins[0]) and _is_reshape(e, ins[0]):
        op = Op.VIEW if p == "stop_gradient" else Op.RESHAPE
        return _view(ins[0], shape, dtype, op, 0, None, name, base)
    if p == "transpose" and fits_ggml_dims(shape) and _viewable(ins[0]):
        return _permute(ins[0], tuple(e.params["permutation"]), name, base)
    if p == "slice" and fits_ggml_dims(shape) and not _strided(e.params.get("strides")) and _viewable(ins[0]):
        x = ins[0]
        rank = len(e.in_shapes[0])
        offs = sum(int(s) * x.nb[ggml_dim(a, rank)] for a, s in enumerate(e.params["start_indices"]))
        return _view(x, shape, dtype, Op.VIEW, offs, x.nb, name, {**base, "offset": offs})
    return None


def _viewable(x: Tensor) -> bool:
    """Views only of nodes, graph inputs and weights. A constant or literal leaf is placed only
    as the src of a non-view node (split_graph pass 4 gives it that node's backend; a view passes on
    its own unassigned id), so a view of one would leave the leaf without a backend."""
    info = x.base.extra
    return not (isinstance(info, LeafInfo) and info.kind in ("const", "literal"))


def _strided(strides: Sequence[int] | None) -> bool:
    return strides is not None and any(int(s) != 1 for s in strides)


def _view(x: Tensor, shape: Sequence[int], dtype: str, op: Op, offs: int,
          nb: tuple[int, int, int, int] | None, name: str, params: dict[str, Any]) -> Tensor | None:
    t_type = ggml_type(dtype)
    assert t_type is not None
    try:
        v = Tensor(t_type, ne_of(shape), op=op, src=[x], view_src=x, view_offs=offs, nb=nb, name=name,
                   op_params=params)
    except ValueError:
        return None  # out of the base's bytes in ggml's check: keep it a computed node
    return v


def _permute(x: Tensor, perm: tuple[int, ...], name: str, base: dict[str, Any]) -> Tensor | None:
    # numpy: out axis j = in axis perm[j]; ggml_permute: source dim i goes to position axes[i]
    rank = len(perm)
    axes = list(range(4))
    for j, a in enumerate(perm):
        axes[ggml_dim(a, rank)] = ggml_dim(j, rank)
    ne = [0] * 4
    nb = [0] * 4
    for i, ax in enumerate(axes):
        ne[ax] = x.ne[i]
        nb[ax] = x.nb[i]
    try:
        v = Tensor(x.type, x.ne, op=Op.PERMUTE, src=[x], view_src=x, view_offs=0, nb=x.nb, name=name,
                   op_params={**base, "axes": tuple(axes)})
    except ValueError:
        return None  # outside ggml's view bounds check: keep it a computed node
    v.ne = (ne[0], ne[1], ne[2], ne[3])
    v.nb = (nb[0], nb[1], nb[2], nb[3])
    return v


def _split_views(e: EqnView, x: Tensor, name: str) -> list[Tensor]:
    """``split`` as one VIEW per piece (jnp.split of fused qkv is then free, like ggml_view_3d)."""
    from jax import lax  # the executor's slice; only reached while tracing

    axis = int(e.params["axis"])
    rank = len(e.in_shapes[0])
    stride = x.nb[ggml_dim(axis, rank)]
    out: list[Tensor] = []
    start = 0
    for k, (shape, dtype) in enumerate(zip(e.out_shapes, e.out_dtypes, strict=True)):
        size = shape[axis]
        offs = start * stride
        v = _view(x, shape, dtype, Op.VIEW, offs, x.nb, f"{name}:{k}",
                  {"primitive": e.name, "offset": offs})
        if v is None:
            return _packed(e, [x], name, {"primitive": e.name})
        lo, hi = start, start + size
        v.extra = Step(lambda a, lo=lo, hi=hi: lax.slice_in_dim(a, lo, hi, axis=axis), (x,), e.name, e.where,
                       shape, dtype)
        out.append(v)
        start += size
    return out


def _packed(e: EqnView, ins: list[Tensor], name: str, base: dict[str, Any]) -> list[Tensor]:
    """A multi-output equation: one node holding every output back to back, one VIEW per output.

    ggml nodes have one result; packing keeps the outputs' bytes in one allocation that
    lives until the last view's last user (``ggml_gallocr_alloc_graph_impl`` counts n_views), as the equation
    produces them together.
    """
    types = [ggml_type(d) for d in e.out_dtypes]
    sizes = [Tensor(t, ne_of(s)).nbytes for t, s in zip(types, e.out_shapes, strict=True) if t is not None]
    packed = Tensor(GGMLType.I8, (max(sum(sizes), 1),), op=Op.JAX, src=list(ins), name=name,
                    op_params={**base, "n_outputs": len(e.out_shapes)})
    packed.extra = Step(binder(e.primitive, e.params, len(e.out_shapes)), tuple(ins), e.name, e.where,
                        (max(sum(sizes), 1),), "int8")
    out: list[Tensor] = []
    offs = 0
    for k, (shape, dtype, size) in enumerate(zip(e.out_shapes, e.out_dtypes, sizes, strict=True)):
        v = _view(packed, shape, dtype, Op.VIEW, offs, None, f"{name}:{k}", {**base, "offset": offs, "output": k})
        assert v is not None
        v.extra = Step(operator.itemgetter(k), (packed,), e.name, e.where, shape, dtype)
        out.append(v)
        offs += size
    return out


def check_src_count(n: int) -> str | None:
    """Why an equation with n operands cannot be one ggml node (GGML_MAX_SRC), or None."""
    if n > MAX_SRC:
        return f"{n} operands, but a ggml node holds at most {MAX_SRC} sources (GGML_MAX_SRC)"
    return None
