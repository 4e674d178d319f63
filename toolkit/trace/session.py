"""A traced JAX function with a live scheduler: the reuse-or-rebuild story of :class:`toolkit.context.Context`.

:class:`TracedContext` holds a :class:`~toolkit.trace.api.Traced` function, its backends and one
:class:`~toolkit.sched.Scheduler`. ``sched_new`` keeps the scheduler when
:meth:`SchedParams.can_reuse` says it can serve the new params (``llama_context::sched_params::can_reuse``), and every
``sched_reserve`` / ``update`` appends the same :class:`~toolkit.context.ReserveEvent` a llama
context records, so the dashboard's badge, timeline, buffer and split figures read it unchanged.

A traced function has one graph (no prompt/generation pair): an event records it once, under the
label ``graph``, and its memory groups are the weights (``model``) and ``compute``.
``max_nodes`` plays the role it has in llama.cpp: it sizes the graph
(``ggml_new_graph_custom(ctx, max_nodes)``, so it must exceed the node and leaf counts) and the
scheduler's hash set (``ggml_hash_size(max_nodes)``); ``None`` picks ``max(1024, 2 × (n_nodes + n_leafs))``, the size
:meth:`Traced.schedule` uses.

>>> import jax.numpy as jnp, toolkit
>>> from toolkit.trace.session import TracedContext
>>> tr = toolkit.trace(lambda p, x: jnp.tanh(x @ p["w"]), jnp.ones((4, 8)), params={"w": jnp.ones((8, 16))})
>>> tc = TracedContext(tr, devices="cpu")
>>> [tc.update(max_nodes=512).decision, tc.update(op_offload=False).decision]
['reused', 'rebuilt']
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from toolkit import validate
from toolkit.backend import Backend
from toolkit.errors import AllocationError, ParameterError
from toolkit.models.devices import make_devices, parse_picker
from toolkit.reuse import MODEL_GROUP, CompileEvent, Reason, ReserveEvent, SchedParams, SchedulerHolder
from toolkit.sched import Scheduler, hash_size
from toolkit.trace.schedule import Schedule, auto_max_nodes
from toolkit.view import Collapse, ContextSettings, Control, Runtime, device_controls, scheduler_controls

if TYPE_CHECKING:
    from toolkit.trace.api import Traced
    from toolkit.trace.convert import TracedGraph

# what update() accepts (the dashboard's controls that make sense for a traced graph)
UPDATE_FIELDS = ("max_nodes", "parallel", "op_offload", "devices", "budget_mib", "placement")
AUTO_MAX_NODES_TEXT = "max(1024, 2·(nodes+leafs))"
GRAPH_LABEL = "graph"   # the label of the traced graph in a ReserveEvent's graphs (its only one)


def min_max_nodes(n_nodes: int, n_leafs: int) -> int:
    """The smallest max_nodes a new scheduler can plan the graph with: the graph must hold every
    node and leaf (ggml asserts ``n < size``) and the hash set all of them (``hash_size >= n_nodes + n_leafs``)."""
    lo = max(n_nodes, n_leafs) + 1
    need = n_nodes + n_leafs
    if hash_size(lo) >= need:
        return lo
    hi = need  # hash_size(m) >= m
    while lo < hi:  # hash_size is non-decreasing: bisect for the first m that fits
        mid = (lo + hi) // 2
        if hash_size(mid) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo


def backends_from_specs(specs: Sequence[str]) -> list[Backend]:
    """Backends for device specs (``toolkit.models.devices``: ``sim``, ``sim:512M``, ``cuda``,
    ``rpc:2``, …), each running on a JAX device (backend k on ``jax.devices()[k % n]``)."""
    import jax  # lazy: the traced context's planning needs no JAX device

    backends = make_devices(tuple(specs)).backends
    devs = jax.devices()
    for k, b in enumerate(backends):
        b.executor = devs[k % len(devs)]
    return backends


def describe_backends(backends: Sequence[Backend]) -> tuple[str, float | None]:
    """The dashboard's device picker text (``cpu``, ``sim:2``, ``rpc:2``) and budget in MiB for
    a backend list; backend names joined when no picker spec describes it."""
    gpus = list(backends[:-1])
    if not gpus:
        return "cpu", None
    kinds = {re.sub(r"[^A-Za-z].*", "", b.name).lower() for b in gpus}  # SIM0 / RPC0[host:port] -> sim / rpc
    limits = {b.buft.alloc_limit for b in gpus}
    if len(kinds) == 1 and len(limits) == 1:
        kind, limit = kinds.pop(), limits.pop()
        if kind in ("sim", "cuda") or (kind == "rpc" and limit is None):
            return f"{kind}:{len(gpus)}", (limit / (1 << 20) if limit else None)
    return ",".join(b.name for b in backends), None


class TracedContext:
    """A traced function's scheduler side: ``sched_new`` (reuse), ``sched_reserve``, events.

    ``devices`` is a backend list, a picker spec (``"cpu"``, ``"sim:2"``) or device specs
    (``("sim:64M", "sim:64M")``); None keeps the backends the function was placed on (else
    ``cpu``). Bad input to :meth:`update` raises a :class:`~toolkit.errors.ToolkitError` naming
    the value and the limit; the scheduler, its buffers and the placement stay as they were.
    """

    auto_max_nodes_text = AUTO_MAX_NODES_TEXT

    def __init__(self, traced: Traced, devices: Any = None, *, placement: Any = None, max_nodes: int | None = None,
                 parallel: bool = False, op_offload: bool = True, pins: dict[str, int] | None = None,
                 planner: str = "ggml", args: Sequence[Any] | None = None, params: Any = None) -> None:
        self.traced = traced
        self.pins = dict(pins or {})
        self.args = tuple(args) if args is not None else tuple(traced.example_args)
        self.params = params
        g = traced.graph
        self.n_nodes, self.n_leafs = g.n_nodes, g.n_leafs
        self.max_nodes_override = self._check_max_nodes(max_nodes)
        self.parallel = validate.boolean("parallel", parallel)
        self.op_offload = validate.boolean("op_offload", op_offload)
        if devices is None and traced.backends is None:
            devices = "cpu"
        backends = traced.backends if devices is None else self._backends(devices)
        assert backends is not None
        traced.place(backends, placement)
        self.holder = SchedulerHolder(lambda: self.backends, planner)
        self._schedule: tuple[int, Schedule] | None = None
        self.sched_reserve(trigger=f"traced {self.name}")

    # ---- the reuse layer's state ---------------------------------------------------------------
    @property
    def scheduler(self) -> Scheduler:
        return self.holder.sched

    @property
    def sched_params_cur(self) -> SchedParams | None:
        return self.holder.params_cur

    @property
    def sched_params_req(self) -> SchedParams | None:
        return self.holder.params_req

    @property
    def events(self) -> list[ReserveEvent]:
        return self.holder.events

    @property
    def compile_events(self) -> list[CompileEvent]:
        return self.holder.compile_events

    @property
    def warnings(self) -> list[str]:
        return self.holder.warnings

    @property
    def planner(self) -> str:
        return self.holder.planner

    def compute_buffers_bytes(self) -> dict[str, int]:
        """``ggml_backend_sched_get_buffer_size`` per backend by buft name."""
        return self.holder.compute_buffers_bytes()

    # ---- what the dashboard reads --------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(getattr(self.traced.fn, "__name__", "function"))  # a partial or callable object has none

    @property
    def backends(self) -> list[Backend]:
        assert self.traced.backends is not None
        return self.traced.backends

    @property
    def devices(self) -> tuple[str, float | None]:
        return describe_backends(self.backends)

    @property
    def n_copies(self) -> int:
        return int(self.scheduler.n_copies)

    def weight_bytes(self) -> dict[str, int]:
        """The parameters' WEIGHTS buffers by buft name."""
        out: dict[str, int] = {}
        for buf in self.traced.weight_buffers:
            out[buf.buft.name] = out.get(buf.buft.name, 0) + int(buf.size)
        return out

    def settings(self) -> ContextSettings:
        """What a traced graph offers the dashboard: the device picker, the parameter placement and
        the scheduler's params (its graph is fixed: no model, no context params), and ``run``."""
        controls = (*device_controls(*self.devices),
                    Control("placement", "placement", self.traced.placement, "placement"),
                    *scheduler_controls(self.max_nodes_override, self.auto_max_nodes_text, self.parallel,
                                        self.op_offload))
        # no llama layers to group by: node by node when small, else by split
        groupings: tuple[Collapse, ...] = ("none", "split") if self.n_nodes <= 64 else ("split", "none")
        return ContextSettings(self.name, controls, groupings, runtime=Runtime(run=self.run))

    def max_nodes(self) -> int:
        return self.max_nodes_override or auto_max_nodes(self.n_nodes, self.n_leafs)

    def build(self) -> TracedGraph:
        """A fresh build (``ggml_backend_sched_split_graph`` rewrites a graph's srcs), pins applied."""
        tg = self.traced.build()
        self.scheduler.reset()
        for name, b in self.pins.items():
            self.scheduler.set_tensor_backend(tg.tensor(name), b)
        return tg

    def _check_max_nodes(self, max_nodes: Any) -> int | None:
        if max_nodes is None:
            return None
        max_nodes = validate.optional_integer("max_nodes", max_nodes, lo=1, hi=validate.UINT32_MAX,
                                              none_means=AUTO_MAX_NODES_TEXT)
        assert max_nodes is not None
        if max_nodes <= max(self.n_nodes, self.n_leafs):
            # the graph holds max_nodes tensors of each kind (ggml asserts n_nodes < size)
            raise ParameterError("max_nodes", max_nodes, f"max_nodes > {max(self.n_nodes, self.n_leafs)}",
                                 f"too small for the traced graph: it has {self.n_nodes} nodes "
                                 f"and {self.n_leafs} leafs")
        return max_nodes

    def _precheck(self, params: SchedParams) -> None:
        """Refuse a max_nodes whose hash set cannot hold the graph before touching the scheduler."""
        h = self.holder.hash_capacity_for(params)
        n = self.n_nodes + self.n_leafs
        if n > h:
            raise ParameterError(
                "max_nodes", params.max_nodes, f"max_nodes >= {min_max_nodes(self.n_nodes, self.n_leafs)}",
                f"too small for the traced graph: n_nodes + n_leafs = {self.n_nodes} + {self.n_leafs} = {n} "
                f"exceeds the scheduler's hash capacity {h}")

    # ---- sched_reserve -------------------------------------------------------------------------
    def sched_reserve(self, trigger: str = "sched_reserve", extra_reasons: Sequence[Reason] = ()) -> ReserveEvent:
        """sched_new, then reserve the traced graph; without room for pipeline parallelism, retry
        without it (as ``llama_context::sched_reserve`` does)."""
        params = SchedParams(self.max_nodes(), self.parallel, self.op_offload)
        self._precheck(params)
        h = self.holder
        r = h.begin_reserve(params, extra_reasons)
        tg = self.build()
        ok = self.scheduler.reserve(tg.graph)
        if not ok and self.parallel:
            self.parallel = False
            h.fall_back(r)
            tg = self.build()
            ok = self.scheduler.reserve(tg.graph)
        if not ok:
            raise AllocationError(f"failed to allocate compute buffers: {h.alloc_failure()}")
        t_end = time.perf_counter()
        h.graph_reserved(r, GRAPH_LABEL, tg.graph.n_nodes)
        timings = {"sched_new": (r.t_new - r.t0) * 1e3, "reserve": (t_end - r.t_new) * 1e3,
                   "total": (t_end - r.t0) * 1e3}
        return h.record(r, trigger, timings, {MODEL_GROUP: self.weight_bytes()}, pipeline_parallel=self.parallel)

    # ---- changes -------------------------------------------------------------------------------
    def update(self, **changes: Any) -> ReserveEvent:
        """Change ``max_nodes`` (None = auto), ``parallel``, ``op_offload``, ``devices`` (with
        ``budget_mib`` for a picker spec) or ``placement``, then sched_reserve.

        New devices mean new backends: no scheduler can be reused (reason ``devices``). On bad
        input (a ToolkitError naming the value and the limit) everything stays as it was and an
        ``error`` event records the attempt.
        """
        trigger = "; ".join(f"{k} {self._current(k)} -> {_show(v)}" for k, v in changes.items()) or "sched_reserve"
        return self.holder.update(self, trigger, lambda: self._apply(changes, trigger))

    def _apply(self, changes: dict[str, Any], trigger: str) -> ReserveEvent:
        unknown = sorted(set(changes) - set(UPDATE_FIELDS))
        if unknown:
            raise ParameterError(", ".join(unknown), changes[unknown[0]], f"one of {', '.join(UPDATE_FIELDS)}",
                                 "cannot change this of a traced graph")
        tr = self.traced
        before = tr.backends
        if "max_nodes" in changes:
            self.max_nodes_override = self._check_max_nodes(changes["max_nodes"])
        if "parallel" in changes:
            self.parallel = validate.boolean("parallel", changes["parallel"])
        if "op_offload" in changes:
            self.op_offload = validate.boolean("op_offload", changes["op_offload"])
        reasons: list[Reason] = []
        backends = self.backends
        if "devices" in changes or "budget_mib" in changes:
            spec = changes.get("devices", self.devices[0])
            backends = self._backends(spec, changes.get("budget_mib"))
        if "placement" in changes:
            tr.placement = changes["placement"]   # None too: every weight on backend 0
            tr.place(backends)  # resolves it: an index out of range names the placement
        elif backends is not self.backends:
            self._place_on(backends, changes)
        if backends is not before:
            reasons.append(Reason("devices", _devices_label(before or ()), _devices_label(backends)))
            self.holder.drop()  # other backends: no scheduler can be reused
        return self.sched_reserve(trigger, reasons)

    def _place_on(self, backends: list[Backend], changes: dict[str, Any]) -> None:
        """The current placement on new backends; one that names a backend they lack is the new
        devices' fault (a ParameterError naming them, the value and what the placement needs)."""
        tr = self.traced
        try:
            tr.place(backends)
        except ParameterError as e:
            param = "devices" if "devices" in changes else "budget_mib"
            raise ParameterError(param, changes[param], f"devices with a backend for every weight the placement "
                                 f"{_show(tr.placement)} puts on one", f"on {_devices_label(backends)}, {e}") from None

    # ---- what SchedulerHolder.update saves and restores ----------------------------------------
    def save_state(self) -> object:
        tr = self.traced
        return (self.max_nodes_override, self.parallel, self.op_offload, tr.placement, tr.backends)

    def restore_state(self, state: object) -> None:
        tr = self.traced
        assert isinstance(state, tuple)
        self.max_nodes_override, self.parallel, self.op_offload = state[0], state[1], state[2]
        placement: Any = state[3]
        backends: list[Backend] | None = state[4]
        if backends is not None and (tr.backends is not backends or tr.placement is not placement):
            tr.placement = placement
            tr.place(backends)

    def replan(self) -> None:
        self.scheduler.reserve(self.build().graph)

    def _backends(self, devices: Any, budget_mib: float | None = None) -> list[Backend]:
        accepted = "a picker spec (e.g. 'sim:2'), a list of device specs or a list of backends ending with the CPU"
        if budget_mib is not None:
            budget_mib = validate.real("budget_mib", budget_mib, lo=0.0)
        if isinstance(devices, str):
            return backends_from_specs(parse_picker(devices, budget_mib).cparams_devices())
        if not isinstance(devices, (list, tuple)):    # () is the CPU alone
            raise ParameterError("devices", devices, accepted)
        items = list(devices)
        if items and all(isinstance(b, Backend) for b in items):
            if not items[-1].is_cpu:
                raise ParameterError("devices", items[-1].name, "a backend list that ends with the CPU")
            return items
        if all(isinstance(s, str) for s in items):
            return backends_from_specs(items)
        raise ParameterError("devices", devices, accepted)

    def _current(self, key: str) -> Any:
        if key == "max_nodes":
            return self.sched_params_req.max_nodes if self.sched_params_req else None
        if key == "devices":
            return _devices_label(self.backends)
        if key == "budget_mib":
            return self.devices[1]
        if key == "placement":
            return _show(self.traced.placement)
        return getattr(self, key, None)

    # ---- running it ----------------------------------------------------------------------------
    def schedule(self) -> Schedule:
        """The traced graph allocated by the current scheduler (alloc_graph on a fresh build), ready to run."""
        key = len(self.events)
        if self._schedule is not None and self._schedule[0] == key and self._schedule[1].scheduler is self.scheduler:
            return self._schedule[1]
        tg = self.build()
        sch = Schedule.of(self.traced, tg, self.scheduler, self.scheduler.alloc_graph(tg.graph))
        self._schedule = (key, sch)
        return sch

    def param_tree(self) -> Any:
        """The parameters as the function takes them (the traced values unless ``params`` was given)."""
        if self.params is not None:
            return self.params
        return self.traced.param_tree()

    def run(self, *args: Any, params: Any = None, mode: str = "eager") -> dict[str, Any]:
        """Run split by split on the backends' devices and compare with ``jax.jit(f)``: outputs,
        max |difference|, splits run, copies between devices and wall time."""
        import jax  # lazy: running needs JAX, planning does not

        args = args or self.args
        if not args and self.traced.arg_paths:
            raise ParameterError("args", args, f"the {len(self.traced.arg_paths)} argument(s) of {self.name}")
        p = params if params is not None else self.param_tree()
        sch = self.schedule()
        t0 = time.perf_counter()
        out = sch.run(*args, params=p, mode=mode)
        jax.block_until_ready(out)
        t1 = time.perf_counter()
        f = self.traced.fn
        ref = jax.jit(f)(p, *args) if self.traced.has_params else jax.jit(f)(*args)
        diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)))) if np.size(a) else 0.0
                 for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref), strict=True)]
        rep = sch.last_run
        return {"outputs": out, "max_abs_diff": max(diffs, default=0.0), "n_splits": sch.n_splits,
                "ran_splits": len(rep.splits) if rep is not None else 0,
                "copies": rep.n_copies if rep is not None else 0, "run_ms": (t1 - t0) * 1e3,
                "devices": sorted({s.device for s in rep.splits}) if rep is not None else []}

    # ---- text ----------------------------------------------------------------------------------
    def to_text(self) -> str:
        return "\n".join(ev.to_text() for ev in self.events)

    def __repr__(self) -> str:
        return (f"TracedContext({self.name}, backends=[{', '.join(b.name for b in self.backends)}], "
                f"sched={self.sched_params_cur}, events={len(self.events)})")


def _devices_label(backends: Sequence[Backend]) -> str:
    spec, budget = describe_backends(backends)
    return spec + (f" ({budget:g} MiB each)" if budget else "")


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)) and v and isinstance(v[0], Backend):
        return ",".join(b.name for b in v)
    return str(v)


__all__ = ["AUTO_MAX_NODES_TEXT", "GRAPH_LABEL", "TracedContext", "auto_max_nodes", "backends_from_specs",
           "describe_backends", "min_max_nodes"]
