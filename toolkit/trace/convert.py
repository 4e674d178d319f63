"""A closed jaxpr → ggml tensors: one node per primitive, leafs for inputs, parameters, constants, literals.

Nested ``jit`` / ``pjit`` / ``closed_call`` / ``remat`` / ``custom_jvp_call`` /
``custom_vjp_call`` are inlined (their equations become nodes, scoped by the call's name)
unless ``inline=False`` keeps each as one opaque node. Control flow (``while``, ``scan``,
``cond``) and other primitives holding sub-jaxprs are refused with
:class:`~toolkit.trace.errors.UnsupportedPrimitive` unless listed in ``opaque``; so are
equations with side effects and dtypes ggml cannot hold.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.ggml.graph import Graph
from toolkit.ggml.tensor import MAX_SRC, Tensor
from toolkit.trace.errors import UnsupportedPrimitive
from toolkit.trace.layout import ggml_type, known_dtypes, ne_of
from toolkit.trace.nodes import EqnView, LeafInfo, check_src_count, make_nodes

# call-like primitives whose sub-jaxpr runs once, in order: inlining them is exact
INLINE_PRIMITIVES = frozenset({
    "jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint",
    "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin",
})
_NAME_LIMIT = 63  # GGML_MAX_NAME - 1


@dataclass
class TracedGraph:
    """One build of the traced function's graph. The scheduler mutates a graph's ``src``
    pointers when it splits it (``ggml_backend_sched_split_graph``), so every schedule gets a fresh build."""

    graph: Graph
    inputs: list[Tensor]      # flat argument order; unused arguments are not in the graph
    outputs: list[Tensor]     # flat output order
    weights: list[Tensor]     # flat parameter order (shared by every build)

    def tensor(self, name: str) -> Tensor:
        for t in (*self.graph.nodes, *self.graph.leafs):
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in the traced graph")


def _source(eqn: Any) -> str:
    try:
        from jax._src import source_info_util

        return str(source_info_util.summarize(eqn.source_info))
    except Exception:  # source_info is best effort: an older/newer JAX may lay it out differently
        return ""


def _sub_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    """(jaxpr, consts) of a call-like equation, or None."""
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is None:
            continue
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # ClosedJaxpr
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):  # open Jaxpr (remat)
            return sub, []
    return None


def _has_sub_jaxprs(eqn: Any) -> bool:
    def is_jaxpr(v: Any) -> bool:
        return hasattr(v, "eqns") or (hasattr(v, "jaxpr") and hasattr(v, "consts"))

    for v in eqn.params.values():
        if is_jaxpr(v) or (isinstance(v, (tuple, list)) and any(is_jaxpr(x) for x in v)):
            return True
    return False


class Converter:
    """Walks a closed jaxpr once, making tensors; names are unique (the executor finds by name)."""

    def __init__(self, inline: bool = True, opaque: Collection[str] = ()) -> None:
        self.inline = inline
        self.opaque = frozenset(opaque)
        self.nodes: list[Tensor] = []
        self.leafs: list[Tensor] = []
        self._n = 0

    # ---- names ----------------------------------------------------------------------------
    def _name(self, scope: Sequence[str], prim: str) -> str:
        tail = f"{prim}.{self._n}"
        self._n += 1
        head = "/".join(scope)
        name = f"{head}/{tail}" if head else tail
        if len(name) > _NAME_LIMIT:  # keep the unique tail; drop the outer scopes
            name = "…" + name[-(_NAME_LIMIT - 1):]
        return name

    # ---- leafs ----------------------------------------------------------------------------
    def leaf(self, shape: Sequence[int], dtype: str, info: LeafInfo, name: str, where: str = "") -> Tensor:
        t_type = ggml_type(dtype)
        if t_type is None:
            raise UnsupportedPrimitive(
                info.kind, where or f"{info.kind} {name!r}", "",
                f"dtype {dtype} has no ggml type (supported: {', '.join(known_dtypes())})",
            )
        t = Tensor(t_type, ne_of(shape), name=name)
        t.extra = info
        self.leafs.append(t)
        return t

    def _literal(self, lit: Any, where: str) -> Tensor:
        aval = lit.aval
        info = LeafInfo("literal", tuple(aval.shape), str(aval.dtype), value=lit.val)
        return self.leaf(aval.shape, str(aval.dtype), info, f"lit.{self._bump()}", where)

    def _const(self, value: Any, where: str) -> Tensor:
        shape = tuple(getattr(value, "shape", ()))
        dtype = str(getattr(value, "dtype", type(value).__name__))
        info = LeafInfo("const", shape, dtype, value=value)
        return self.leaf(shape, dtype, info, f"const.{self._bump()}", where)

    def _bump(self) -> int:
        self._n += 1
        return self._n - 1

    # ---- the walk -------------------------------------------------------------------------
    def run(self, jaxpr: Any, consts: Sequence[Any], inputs: Sequence[Tensor],
            scope: tuple[str, ...] = (), path: str = "") -> list[Tensor]:
        from jax.extend.core import Literal

        env: dict[Any, Tensor] = {}
        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = self._const(c, f"{path or 'top level'} constant")
        for v, t in zip(jaxpr.invars, inputs, strict=True):
            env[v] = t

        for i, eqn in enumerate(jaxpr.eqns):
            prim = eqn.primitive.name
            where = f"{path} > equation {i}" if path else f"equation {i}"

            def read(x: Any, where: str = where) -> Tensor:
                if isinstance(x, Literal):
                    return self._literal(x, where)
                return env[x]

            ins = [read(x) for x in eqn.invars]
            outs = self._eqn(eqn, prim, ins, scope, where)
            for v, t in zip(eqn.outvars, outs, strict=True):
                env[v] = t
        return [env[v] if not isinstance(v, Literal) else self._literal(v, path or "outputs")
                for v in jaxpr.outvars]

    def _eqn(self, eqn: Any, prim: str, ins: list[Tensor], scope: tuple[str, ...], where: str) -> list[Tensor]:
        src = _source(eqn)
        if eqn.effects:
            effects = ", ".join(sorted(type(e).__name__ for e in eqn.effects))
            raise UnsupportedPrimitive(
                prim, where, src,
                f"it has side effects ({effects}); a scheduled graph runs pure primitives only "
                "(remove jax.debug.print / callbacks before tracing)",
            )
        sub = _sub_jaxpr(eqn) if prim in INLINE_PRIMITIVES else None
        if sub is not None and self.inline and prim not in self.opaque:
            jaxpr, consts = sub
            label = str(eqn.params.get("name", prim))
            return self.run(jaxpr, consts, ins, (*scope, label), f"{where} ({prim} '{label}')")
        if sub is None and _has_sub_jaxprs(eqn) and prim not in self.opaque:
            raise UnsupportedPrimitive(
                prim, where, src,
                "control flow and other primitives with sub-jaxprs are not split into graph nodes; "
                f"unroll it (e.g. a Python loop), or pass opaque=('{prim}',) to keep it as one node",
            )
        out_shapes = [tuple(v.aval.shape) for v in eqn.outvars]
        out_dtypes = [str(v.aval.dtype) for v in eqn.outvars]
        for d in out_dtypes:
            if ggml_type(d) is None:
                raise UnsupportedPrimitive(
                    prim, where, src, f"its result dtype {d} has no ggml type (supported: {', '.join(known_dtypes())})"
                )
        if prim == "concatenate" and len(ins) > MAX_SRC:
            return self._concat_chunks(eqn, ins, scope, where, src)
        too_many = check_src_count(len(ins))
        if too_many is not None:
            raise UnsupportedPrimitive(prim, where, src, too_many)
        if not out_shapes:
            raise UnsupportedPrimitive(prim, where, src, "it has no result, and a ggml node is its result")
        view = EqnView(
            primitive=eqn.primitive, name=prim, params=dict(eqn.params),
            in_shapes=[tuple(x.aval.shape) for x in eqn.invars], in_dtypes=[str(x.aval.dtype) for x in eqn.invars],
            out_shapes=out_shapes, out_dtypes=out_dtypes, where=f"{where}{' at ' + src if src else ''}",
        )
        outs = make_nodes(view, ins, self._name(scope, prim))
        # a packed multi-output base is reached through its views' src when the graph is built
        self.nodes.extend(outs)
        return outs

    def _concat_chunks(self, eqn: Any, ins: list[Tensor], scope: tuple[str, ...], where: str,
                       src: str) -> list[Tensor]:
        """A concatenation of more than GGML_MAX_SRC operands as a tree of concatenations of at
        most 10 (ggml builds the same from binary ggml_concat calls)."""
        axis = int(eqn.params["dimension"])
        dtype = str(eqn.outvars[0].aval.dtype)
        shapes = [tuple(x.aval.shape) for x in eqn.invars]
        parts, part_shapes = list(ins), shapes
        while len(parts) > 1:
            nxt, nxt_shapes = [], []
            for i in range(0, len(parts), MAX_SRC):
                group, gshapes = parts[i:i + MAX_SRC], part_shapes[i:i + MAX_SRC]
                if len(group) == 1:
                    nxt.append(group[0])
                    nxt_shapes.append(gshapes[0])
                    continue
                out = list(gshapes[0])
                out[axis] = sum(s[axis] for s in gshapes)
                view = EqnView(
                    primitive=eqn.primitive, name="concatenate", params=dict(eqn.params), in_shapes=gshapes,
                    in_dtypes=[dtype] * len(group), out_shapes=[tuple(out)], out_dtypes=[dtype],
                    where=f"{where}{' at ' + src if src else ''}",
                )
                (t,) = make_nodes(view, group, self._name(scope, "concatenate"))
                self.nodes.append(t)
                nxt.append(t)
                nxt_shapes.append(tuple(out))
            parts, part_shapes = nxt, nxt_shapes
        return parts
