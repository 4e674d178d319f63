"""``trace(f, *example_args, params=...)``: a JAX function as a ggml graph, scheduled and run.

>>> import jax.numpy as jnp
>>> from toolkit.trace import trace
>>> def mlp(p, x):
...     return jnp.tanh(x @ p["w"] + p["b"])
>>> tr = trace(mlp, jnp.ones((4, 8)), params={"w": jnp.ones((8, 16)), "b": jnp.zeros(16)})
>>> [t.op_desc() for t in tr.graph.nodes]
['MUL_MAT', 'RESHAPE', 'ADD', 'TANH']
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from toolkit.backend import Backend, Buffer
from toolkit.ggml.graph import GGML_DEFAULT_GRAPH_SIZE, Graph
from toolkit.ggml.tensor import Tensor, is_view_op
from toolkit.trace.convert import Converter, TracedGraph
from toolkit.trace.errors import UnsupportedPrimitive
from toolkit.trace.layout import ggml_type, known_dtypes, ne_of
from toolkit.trace.nodes import LeafInfo, Step
from toolkit.trace.placement import PlacementSpec, path_str, place_weights, resolve
from toolkit.trace.schedule import Schedule


def _reachable(outs: Sequence[Tensor]) -> set[int]:
    seen: set[int] = set()
    stack = list(outs)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(t.srcs)
    return seen


def _leaf_name(prefix: str, path: str, i: int) -> str:
    name = f"{prefix}{path}" if path else f"{prefix}{i}"
    return name.replace("#", "_")[-63:]


class Traced:
    """A JAX function traced to a jaxpr and converted to ggml graphs (see :func:`trace`)."""

    def __init__(self, f: Callable[..., Any], args: Sequence[Any], params: Any = None,
                 placement: PlacementSpec = None, inline: bool = True, opaque: Collection[str] = (),
                 backends: Sequence[Backend] | None = None) -> None:
        import jax

        tu = jax.tree_util
        self.fn = f
        self.example_args = tuple(args)  # what a TracedContext runs by default
        self.has_params = params is not None
        self.inline = inline
        self.opaque = tuple(opaque)
        p_flat, self._p_tree = tu.tree_flatten_with_path(params) if self.has_params else ([], None)
        a_flat, self._a_tree = tu.tree_flatten_with_path(tuple(args))
        n_p = len(p_flat)

        def flat_fun(*leaves: Any) -> Any:
            a = tu.tree_unflatten(self._a_tree, leaves[n_p:])
            if self.has_params:
                return f(tu.tree_unflatten(self._p_tree, leaves[:n_p]), *a)
            return f(*a)

        self.closed_jaxpr, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(
            *[v for _, v in p_flat], *[v for _, v in a_flat])
        self.out_tree = tu.tree_structure(out_shape)
        self.param_paths = [path_str(p) for p, _ in p_flat]
        self.param_values = [v for _, v in p_flat]
        self.arg_paths = [path_str(p) for p, _ in a_flat]
        self.weights = [self._weight(i, p, v)
                        for i, (p, v) in enumerate(zip(self.param_paths, self.param_values, strict=True))]
        self.placement = placement
        self.backends: list[Backend] | None = None
        self.weight_backend: list[int] = []
        self.weight_buffers: list[Buffer] = []
        self._graph: TracedGraph | None = None
        self._default_schedule: Schedule | None = None
        self.build()  # fail early: unsupported primitives are reported at trace time
        if backends is not None:
            self.place(backends, placement)

    def _weight(self, i: int, path: str, value: Any) -> Tensor:
        shape, dtype = tuple(value.shape), str(value.dtype)
        t_type = ggml_type(dtype)
        if t_type is None:
            raise UnsupportedPrimitive("parameter", f"parameter {path!r}", "",
                                       f"dtype {dtype} has no ggml type (supported: {', '.join(known_dtypes())})")
        t = Tensor(t_type, ne_of(shape), name=_leaf_name("", path, i))
        t.extra = LeafInfo("param", shape, dtype, index=i, path=path)
        return t

    # ---- graphs ----------------------------------------------------------------------------
    def param_tree(self) -> Any:
        """The parameters as the function takes them (the traced values), None without params."""
        import jax.tree_util as tu  # lazy: jax

        return tu.tree_unflatten(self._p_tree, self.param_values) if self.has_params else None

    def build(self) -> TracedGraph:
        """A fresh graph (weights shared): nodes in jaxpr order, dead equations dropped."""
        conv = Converter(self.inline, self.opaque)
        inputs: list[Tensor] = []
        arg_vars = self.closed_jaxpr.jaxpr.invars[len(self.weights):]
        for i, (path, var) in enumerate(zip(self.arg_paths, arg_vars, strict=True)):
            aval = var.aval
            info = LeafInfo("input", tuple(aval.shape), str(aval.dtype), index=i, path=path)
            inputs.append(conv.leaf(aval.shape, str(aval.dtype), info, _leaf_name("in:", path, i)).set_input())
        outs = conv.run(self.closed_jaxpr.jaxpr, self.closed_jaxpr.consts, [*self.weights, *inputs])
        live = _reachable(outs)
        size = max(GGML_DEFAULT_GRAPH_SIZE, len(live) + 1)
        graph = Graph(size)
        for t in conv.nodes:  # jaxpr order: a node after its sources, as build_forward_expand keeps it
            if id(t) in live:
                graph.build_forward_expand(t)
        for t in outs:
            if isinstance(t.extra, LeafInfo) and t.extra.kind in ("const", "literal"):
                # a constant returned as is: no node reads it, so no pass would give it a backend
                # (split_graph pass 4 places leafs as srcs of nodes); the runner returns its value directly
                continue
            graph.build_forward_expand(t)
            t.set_output()
        tg = TracedGraph(graph, inputs, outs, self.weights)
        if self._graph is None:
            self._graph = tg
        return tg

    @property
    def graph(self) -> Graph:
        """The first build's graph (for reading; schedule() splits fresh builds)."""
        assert self._graph is not None
        return self._graph.graph

    # ---- placement -------------------------------------------------------------------------
    def place(self, backends: Sequence[Backend], placement: PlacementSpec = None) -> Traced:
        """Put every parameter in a WEIGHTS buffer of the backend the placement picks."""
        spec = self.placement if placement is None else placement
        # resolved first: a placement the backends cannot take raises with this object unchanged
        where = resolve(spec, self.param_paths, self.param_values, list(backends))
        self.placement, self.backends, self.weight_backend = spec, list(backends), where
        self.weight_buffers = place_weights(self.weights, self.weight_backend, self.backends)
        return self

    def where(self) -> dict[str, str]:
        """Parameter path → backend name."""
        if self.backends is None:
            return {}
        return {p: self.backends[i].name for p, i in zip(self.param_paths, self.weight_backend, strict=True)}

    # ---- scheduling and running ------------------------------------------------------------
    def schedule(self, backends: Sequence[Backend] | None = None, *, op_offload: bool = True,
                 parallel: bool = False, max_nodes: int | None = None,
                 pins: dict[str, int] | None = None, planner: str = "ggml") -> Schedule:
        """Split and allocate a fresh build with the ggml scheduler (reserve, then alloc_graph,
        as llama.cpp does). ``pins`` maps node names to backend indices (set_tensor_backend);
        ``planner="offline"`` sizes the buffers with the offline planner instead of ggml's."""
        if backends is not None and (self.backends is None or list(backends) != self.backends):
            self.place(backends)
        if self.backends is None:
            raise ValueError("schedule() needs backends (pass backends=, or trace(..., backends=...))")
        return Schedule.make(self, self.backends, op_offload=op_offload, parallel=parallel,
                             max_nodes=max_nodes, pins=pins or {}, planner=planner)

    def __call__(self, *args: Any, params: Any = None) -> Any:
        """Run on the backends given so far (scheduled once with op offload on, then reused)."""
        if self._default_schedule is None or self._default_schedule.backends != self.backends:
            self._default_schedule = self.schedule()
        return self._default_schedule.run(*args, params=params)

    # ---- text ------------------------------------------------------------------------------
    def to_text(self) -> str:
        g = self.graph
        n_jax = sum(1 for t in g.nodes if t.op.value == "JAX")
        n_view = sum(1 for t in g.nodes if is_view_op(t.op))
        lines = [f"traced {getattr(self.fn, '__name__', 'function')}: {len(self.closed_jaxpr.jaxpr.eqns)} "
                 f"top-level equations -> {g.n_nodes} nodes ({n_view} views, {n_jax} JAX-only), {g.n_leafs} leafs, "
                 f"{len(self.weights)} weights"]
        for i, (p, w) in enumerate(zip(self.param_paths, self.weights, strict=True)):
            where = ""
            if self.backends is not None:
                where = f" on {self.backends[self.weight_backend[i]].name}"
            lines.append(f"  weight {p:<24s} {w.type.lower:>4s} {w.shape_str():<16s} {w.nbytes:>10d} B{where}")
        lines.append(g.to_text())
        return "\n".join(lines)

    def __repr__(self) -> str:
        g = self.graph
        return f"Traced({getattr(self.fn, '__name__', 'function')}, n_nodes={g.n_nodes}, n_leafs={g.n_leafs})"


def trace(f: Callable[..., Any], *example_args: Any, params: Any = None, placement: PlacementSpec = None,
          inline: bool = True, backends: Sequence[Backend] | None = None, opaque: Collection[str] = ()) -> Traced:
    """Trace ``f`` into a ggml graph: one node per primitive.

    ``f`` is called as ``f(params, *example_args)`` when ``params`` (a pytree of arrays, the
    weights) is given, else as ``f(*example_args)``. ``placement`` maps parameters to backends
    (see :mod:`toolkit.trace.placement`); it applies once ``backends`` are known (here or in
    :meth:`Traced.schedule`). ``inline=False`` keeps each nested jit / custom_jvp / custom_vjp
    call as one node; ``opaque`` names primitives with sub-jaxprs (``"while"``, ``"scan"``,
    ``"cond"``) to keep as one node instead of refusing them. Raises
    :class:`UnsupportedPrimitive` naming the primitive, its equation and source line.
    """
    return Traced(f, example_args, params, placement, inline, opaque, backends)


__all__ = ["Step", "Traced", "trace"]
