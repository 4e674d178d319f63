"""A traced graph scheduled on backends: the plan (splits, buffer sizes) and its execution.

The splits are the scheduler's own (``ggml_backend_sched_split_graph``, read from its
:class:`~toolkit.sched.plan.Plan`); a schedule reads the traced function through
:class:`TracedFunction` (:class:`toolkit.trace.api.Traced` is one), so this module sits below it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from toolkit.backend import Backend, Buffer
from toolkit.ggml.graph import GGML_DEFAULT_GRAPH_SIZE
from toolkit.ggml.tensor import Tensor, is_view_op
from toolkit.sched import Scheduler
from toolkit.trace.checks import check_plan
from toolkit.trace.convert import TracedGraph
from toolkit.trace.execute import RunReport, TracedGraphRunner
from toolkit.trace.nodes import LeafInfo

if TYPE_CHECKING:
    from toolkit.sched.plan import Plan


class TracedFunction(Protocol):
    """What a schedule reads of a traced function: fresh builds of its graph, and for a run its flat
    arguments, parameters, their placement and the output tree."""

    @property
    def arg_paths(self) -> list[str]:
        """The flat arguments' pytree paths (their number is what a run takes)."""
        ...

    @property
    def param_values(self) -> list[Any]:
        """The traced parameter values, flat (a run's default parameters)."""
        ...

    @property
    def weights(self) -> list[Tensor]:
        """One leaf tensor per flat parameter, shared by every build."""
        ...

    @property
    def weight_backend(self) -> list[int]:
        """The backend index of each weight ([] until placed)."""
        ...

    @property
    def weight_buffers(self) -> list[Buffer]:
        """The WEIGHTS buffers the placement filled."""
        ...

    @property
    def out_tree(self) -> Any:
        """The output pytree structure (a run returns the outputs in it)."""
        ...

    def build(self) -> TracedGraph:
        """A fresh build of the graph (the scheduler rewrites a graph's srcs when it splits it)."""
        ...


def auto_max_nodes(n_nodes: int, n_leafs: int) -> int:
    """The default max_nodes of a traced graph: ``max(GGML_DEFAULT_GRAPH_SIZE, 2 × (n_nodes + n_leafs))``."""
    return max(GGML_DEFAULT_GRAPH_SIZE, 2 * (n_nodes + n_leafs))


def device_of(backend: Backend) -> Any:
    """The JAX device a backend runs on: its executor when that is a device, else the default."""
    import jax

    ex = backend.executor
    if ex is not None and hasattr(ex, "platform") and hasattr(ex, "id"):
        return ex
    dev = getattr(ex, "device", None)
    if dev is not None and hasattr(dev, "platform"):
        return dev
    return jax.devices()[0]


@dataclass
class Schedule:
    """One build of a traced graph as the scheduler split and allocated it: each node's backend and the
    splits ``(backend, first node, end)`` as its plan holds them."""

    traced: TracedFunction
    built: TracedGraph
    backends: list[Backend]
    node_backend: list[int]
    splits: list[tuple[int, int, int]]
    scheduler: Scheduler
    plan: Plan
    ok: bool = True
    last_run: RunReport | None = None
    _runners: dict[str, TracedGraphRunner] = field(default_factory=dict)

    # ---- making one ------------------------------------------------------------------------
    @classmethod
    def make(cls, traced: TracedFunction, backends: Sequence[Backend], *, op_offload: bool, parallel: bool,
             max_nodes: int | None, pins: dict[str, int], planner: str = "ggml") -> Schedule:
        """reserve on one build, alloc_graph on another (``ggml_backend_sched_split_graph`` rewrites a graph's
        srcs, so a graph is split once)."""
        first = traced.build()
        s = Scheduler(list(backends), None, max_nodes or auto_max_nodes(first.graph.n_nodes, first.graph.n_leafs),
                      parallel, op_offload, planner)
        s.reset()
        _pin(s, first, pins)
        ok = s.reserve(first.graph)
        built = traced.build()
        s.reset()
        _pin(s, built, pins)
        ok = s.alloc_graph(built.graph) and ok
        return cls.of(traced, built, s, ok)

    @classmethod
    def of(cls, traced: TracedFunction, built: TracedGraph, s: Scheduler, ok: bool) -> Schedule:
        """The schedule of a build the scheduler has just allocated (``alloc_graph``): its plan's
        placements and splits."""
        plan = s.plan()
        node_backend = [0] * built.graph.n_nodes
        for p in plan.nodes:
            node_backend[p.index] = p.backend_id
        splits = [(sp.backend_id, sp.i_start, sp.i_end) for sp in plan.splits]
        return cls(traced, built, list(s.backends), node_backend, splits, s, plan, ok)

    # ---- reading it ------------------------------------------------------------------------
    @property
    def n_splits(self) -> int:
        return len(self.splits)

    def problems(self) -> list[str]:
        """Plan invariants that do not hold (:func:`toolkit.trace.checks.check_plan`); [] when valid."""
        return check_plan(self.plan, self.built.graph, self.backends)

    def buffer_sizes(self) -> dict[str, int]:
        """Compute buffer bytes per backend (get_buffer_size: 0 for a buft shared with an earlier one)."""
        return {b.name: int(self.scheduler.buffer_size(i)) for i, b in enumerate(self.backends)}

    def weight_sizes(self) -> dict[str, int]:
        return {buf.name: int(buf.size) for buf in self.traced.weight_buffers}

    def to_text(self) -> str:
        g = self.built.graph
        lines = [f"{g.n_nodes} nodes, {g.n_leafs} leafs -> {self.n_splits} splits on "
                 f"{', '.join(b.name for b in self.backends)}"]
        plan_inputs = {sp.index: sp.inputs for sp in self.plan.splits}
        for k, (b, i0, i1) in enumerate(self.splits):
            ops = [g.nodes[i].op_desc() for i in range(i0, i1) if not is_view_op(g.nodes[i].op)]
            ins = ", ".join(f"{x.name} ({x.nbytes} B)" for x in plan_inputs.get(k, ()))
            lines.append(f"split {k:2d} {self.backends[b].name:>6s} nodes [{i0:3d}, {i1:3d}) "
                         f"{len(ops):3d} ops  inputs: {ins or '-'}")
        for name, size in self.buffer_sizes().items():
            lines.append(f"compute buffer {name:>8s}: {size:>10d} B")
        for name, size in self.weight_sizes().items():
            lines.append(f"weights {name}: {size} B")
        return "\n".join(lines)

    __str__ = to_text

    def __repr__(self) -> str:
        names = ", ".join(b.name for b in self.backends)
        return f"Schedule({self.built.graph.n_nodes} nodes, {self.n_splits} splits on {names}, ok={self.ok})"

    # ---- running it ------------------------------------------------------------------------
    def run(self, *args: Any, params: Any = None, mode: str = "eager", devices: Sequence[Any] | None = None) -> Any:
        """Execute split by split; returns the function's outputs (a pytree, like ``f``)."""
        import jax

        tr = self.traced
        if not self.ok:
            notes = "; ".join(self.plan.notes)
            raise RuntimeError(f"the scheduler could not allocate this graph ({notes or 'alloc_graph failed'}); "
                               "buffers past their budget cannot run")
        devs = list(devices) if devices is not None else [device_of(b) for b in self.backends]
        key = f"{mode}:{','.join(str(d) for d in devs)}"
        if key not in self._runners:
            names = [b.name for b in self.backends]
            self._runners[key] = TracedGraphRunner(self.built.graph.nodes, self.node_backend, self.splits, devs, names,
                                                   mode)
        flat_args = jax.tree_util.tree_leaves(tuple(args))
        if len(flat_args) != len(tr.arg_paths):
            raise ValueError(f"expected {len(tr.arg_paths)} array arguments (flattened), got {len(flat_args)}")
        p_values = tr.param_values if params is None else jax.tree_util.tree_leaves(params)
        if len(p_values) != len(tr.weights):
            raise ValueError(f"expected {len(tr.weights)} parameter arrays, got {len(p_values)}")
        values: dict[int, Any] = {}
        homes: dict[int, int | None] = {}
        last = len(self.backends) - 1
        for t in self.built.graph.leafs:
            info = t.extra
            if not isinstance(info, LeafInfo):
                continue
            if info.kind == "param":
                b = tr.weight_backend[info.index] if tr.weight_backend else last
                values[id(t)] = jax.device_put(p_values[info.index], devs[b])
                homes[id(t)] = b
            elif info.kind == "input":
                # graph inputs start on the last (CPU) backend (``ggml_backend_sched_backend_id_from_cur``)
                values[id(t)] = jax.device_put(flat_args[info.index], devs[last])
                homes[id(t)] = last
            else:
                values[id(t)] = info.value
                homes[id(t)] = None
        outs, report = self._runners[key].run(values, homes, self.built.outputs)
        self.last_run = report
        for i, t in enumerate(self.built.outputs):
            info = t.extra
            if isinstance(info, LeafInfo) and info.kind in ("const", "literal"):
                # an output that is a constant: an array of the jaxpr's dtype, like jax.jit returns
                outs[i] = jax.device_put(np.asarray(info.value, dtype=info.dtype), devs[last])
        return jax.tree_util.tree_unflatten(tr.out_tree, outs)


def _pin(s: Scheduler, tg: TracedGraph, pins: dict[str, int]) -> None:
    for name, b in pins.items():
        s.set_tensor_backend(tg.tensor(name), b)
