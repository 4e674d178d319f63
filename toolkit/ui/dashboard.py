"""The live dashboard: ipywidgets controls -> ``ctx.update(...)`` (sched_reserve) -> figures.

>>> import toolkit
>>> dash = toolkit.dashboard(model="tiny")       # doctest: +SKIP
>>> dash.controls["max_nodes"].value = "512"     # as typed  # doctest: +SKIP
>>> dash.ctx.events[-1].decision                 # doctest: +SKIP
'reused'

Every control change goes through one path: the observer records the new value, a short timer
coalesces a burst of changes (a dragged slider) so the last value wins, then one
``ctx.update(**changes)`` runs and the figures are redrawn from the newest ReserveEvent. An
exception never escapes a callback: it is shown in the dashboard and the previous state stays.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ipywidgets as W
import ipywidgets.widgets.widget as ipywidgets_widget
import plotly.graph_objects as go
import traitlets

from toolkit.compare import EventDiff, compare, default_pair
from toolkit.context import LlamaContextView, RunnableContext
from toolkit.errors import ParameterError, ToolkitError, UnsupportedFeature
from toolkit.reuse import ContextView
from toolkit.sched.explain import NodeExplanation, explain
from toolkit.trace.api import Traced
from toolkit.trace.session import TracedContext
from toolkit.ui import figures
from toolkit.ui.choices import (
    MODEL_PRESETS,
    describe_devices,
    describe_placement,
    make_context,
    parse_devices,
    parse_placement,
    preset_label,
    preset_of,
)
from toolkit.ui.inspect import diff_html, explanation_html, split_html, tensor_html
from toolkit.ui.layers import Collapse
from toolkit.ui.text import badge_html, badge_text

if TYPE_CHECKING:
    from toolkit.models.hparams import LlamaHParams
    from toolkit.ui.fitpanel import FitPanel

# dashboard control -> keyword of ctx.update (the context's cparams names, as in llama_context's cparams)
# (max_nodes / parallel are the context's overrides of llama_context::graph_max_nodes and of the
# constructor's pipeline-parallelism condition)
UPDATE_KEYS: dict[str, str] = {
    "max_nodes": "max_nodes", "parallel": "parallel", "op_offload": "op_offload",
    "n_ctx": "n_ctx", "n_batch": "n_batch", "n_ubatch": "n_ubatch", "flash_attn": "flash_attn",
    "n_gpu_layers": "n_gpu_layers",
}
# dashboard control -> keyword of TracedContext.update (toolkit.trace.session)
TRACED_UPDATE_KEYS: dict[str, str] = {
    "max_nodes": "max_nodes", "parallel": "parallel", "op_offload": "op_offload", "placement": "placement",
}
# controls that need a new Context (the model is fixed at construction)
CONTEXT_CONTROLS = ("model", "gguf")
# the device picker: one ``devices=`` change (ContextParams.devices) made of both controls
DEVICE_CONTROLS = ("devices", "budget_mib")
# controls that are ContextParams fields (passed to a new Context); the others are scheduler params
CPARAM_CONTROLS = ("n_ctx", "n_batch", "n_ubatch", "flash_attn", "n_gpu_layers", "op_offload")
# controls of a llama context that mean nothing for a traced JAX function (its graph is fixed)
LLAMA_ONLY_CONTROLS = ("model", "gguf", "n_ctx", "n_batch", "n_ubatch", "flash_attn", "n_gpu_layers")
# a traced function's parameters: where they live (toolkit.trace.placement), not a llama setting
TRACED_ONLY_CONTROLS = ("placement",)
POW2 = tuple(2 ** k for k in range(0, 18))


class _NotNone(traitlets.Any):
    allow_none = False     # traitlets.Any ignores allow_none=False given to its constructor


class _SizeSlider(W.SelectionSlider):
    """A SelectionSlider whose value may not be ``None``: ipywidgets' own takes None, then fails on
    the index and keeps ``value=None`` with the old index, without notifying observers."""

    value = _NotNone(help="Selected value")

    @traitlets.validate("value")
    def _validate_value(self, proposal: Any) -> Any:
        if proposal.value is None:
            raise traitlets.TraitError(f"{self.description}=None is not one of the options")
        return super()._validate_value(proposal)


def _options(lo: int, hi: int, current: int) -> list[int]:
    return sorted({v for v in POW2 if lo <= v <= hi} | {int(current)})


def parse_max_nodes(value: str) -> int | None:
    """``auto`` (llama.cpp's ``llama_context::graph_max_nodes`` formula) -> None; otherwise a positive integer."""
    v = str(value).strip().lower()
    if v in ("", "auto"):
        return None
    try:
        n = int(v)
    except ValueError:
        raise ParameterError("max_nodes", value, "'auto' or an integer > 0") from None
    if n <= 0:
        raise ParameterError("max_nodes", value, "'auto' or an integer > 0")
    return n


def _as_context(ctx: ContextView | Traced, devices: str | None = None,
                budget_mib: float | None = None) -> ContextView:
    """A Traced function becomes a TracedContext on ``devices`` (its own backends when None)."""
    if isinstance(ctx, Traced):
        spec: Any = None
        if devices is not None:
            spec = parse_devices(devices, budget_mib).cparams_devices()
        return TracedContext(ctx, spec)
    return ctx


class Dashboard:
    """Controls, decision badge and figures for one :class:`toolkit.context.Context`, or for a
    traced JAX function (a :class:`toolkit.trace.session.TracedContext`, or a ``Traced`` that is
    wrapped in one): then only max_nodes, pipeline parallelism, op offload, devices and the
    parameter placement are shown, and "run" executes the function split by split against jax.jit.

    ``debounce_s`` is how long a burst of changes is collected before one reserve runs; with
    0 (or outside a running event loop, as in tests) every change reserves at once.
    """

    def __init__(self, ctx: ContextView | Traced, *, model: str | None = None, devices: str | None = None,
                 budget_mib: float | None = None,
                 debounce_s: float = 0.15, collapse: Collapse = "layer", fig_width: int = 960,
                 context_factory: Callable[..., Any] = make_context) -> None:
        ctx = _as_context(ctx, devices, budget_mib)
        self.ctx: ContextView = ctx
        self.traced = isinstance(ctx, TracedContext)
        self.fig_width = fig_width
        self.debounce_s = debounce_s
        self.error: str | None = None
        self.exception: BaseException | None = None   # what made the last change fail (None: it applied)
        self.n_updates = 0                      # ctx.update / context rebuild calls (after coalescing)
        self.timings_ms: dict[str, float] = {}  # the last change: wait (coalescing), update, draw, total
        self._factory = context_factory
        self._pending: dict[str, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._syncing = False
        self._hold = False
        self._drawn: tuple[int, int] | None = None
        self._plan: Any = None
        self._plan_drawn: tuple[Any, ...] | None = None
        self.diff: EventDiff | None = None
        if isinstance(ctx, TracedContext):
            devices, budget_mib = ctx.devices   # what the traced function's backends are
            model = model or ctx.name
        else:
            assert isinstance(ctx, LlamaContextView)
            if devices is None:         # show what the context runs on
                devices, budget_mib = describe_devices(tuple(ctx.cparams.devices))
            if model is None:
                model = preset_of(ctx.hparams) or ctx.hparams.name
        self._model, self._devices, self._budget = model, devices, budget_mib
        if isinstance(ctx, TracedContext) and collapse == "layer":
            # a traced graph has no llama layers to group by: node by node when small, else by split
            collapse = "none" if ctx.n_nodes <= 64 else "split"
        self._build(collapse)
        self.refresh()

    # ---------------------------------------------------------------- widgets
    def _build(self, collapse: Collapse) -> None:
        llama = self.ctx if isinstance(self.ctx, LlamaContextView) else None
        cp = llama.cparams if llama is not None else None
        style = {"description_width": "initial"}
        n_layer = llama.hparams.n_layer if llama is not None else 32
        req = self.ctx.sched_params_req
        parallel = req.parallel if req is not None else False
        op_offload = req.op_offload if req is not None else True
        c: dict[str, W.Widget] = {
            "model": W.Dropdown(options=list(MODEL_PRESETS), description="model", style=style,
                                value=preset_label(self._model)),
            "gguf": W.Text(value=self._model if self._model.endswith(".gguf") else "", placeholder="or a .gguf path",
                           continuous_update=False, layout=W.Layout(width="220px")),
            "devices": W.Text(value=self._devices, description="devices", placeholder="cpu | rpc:N | sim:N",
                              continuous_update=False, style=style, layout=W.Layout(width="200px")),
            "budget_mib": W.BoundedFloatText(value=self._budget or 0, min=0, max=1 << 30, step=64,
                                             description="budget MiB (0 = none)", style=style,
                                             layout=W.Layout(width="220px")),
            "max_nodes": W.Text(value=str(self.ctx.max_nodes_override or "auto"),
                                description="max_nodes", continuous_update=False, style=style,
                                placeholder="auto or a number", layout=W.Layout(width="200px"),
                                tooltip=f"auto = {self.ctx.auto_max_nodes_text}"),
            "parallel": W.Checkbox(value=bool(parallel), description="pipeline parallelism", indent=False),
            "op_offload": W.Checkbox(value=bool(op_offload), description="op offload", indent=False),
            "n_ctx": _SizeSlider(options=_options(256, 1 << 17, getattr(cp, "n_ctx", 4096)),
                                       value=int(getattr(cp, "n_ctx", 4096)), description="n_ctx", style=style),
            "n_batch": _SizeSlider(options=_options(1, 1 << 13, getattr(cp, "n_batch", 2048)),
                                         value=int(getattr(cp, "n_batch", 2048)), description="n_batch", style=style),
            "n_ubatch": _SizeSlider(options=_options(1, 1 << 13, getattr(cp, "n_ubatch", 512)),
                                          value=int(getattr(cp, "n_ubatch", 512)), description="n_ubatch",
                                          style=style),
            "flash_attn": W.Dropdown(options=["auto", "on", "off"], description="flash attention", style=style,
                                     value=self._fa_value(getattr(cp, "flash_attn", "auto"))),
            "n_gpu_layers": W.IntSlider(value=min(int(getattr(cp, "n_gpu_layers", n_layer + 1)), n_layer + 1),
                                        min=0, max=n_layer + 1, description="n_gpu_layers", style=style),
        }
        if isinstance(self.ctx, TracedContext):
            for k in LLAMA_ONLY_CONTROLS:
                del c[k]
            c["placement"] = W.Text(value=describe_placement(self.ctx.traced.placement), description="placement",
                                    placeholder="0 | -1 | fc1.*:0, fc2.*:1", continuous_update=False, style=style,
                                    layout=W.Layout(width="320px"),
                                    tooltip="parameter path or glob -> backend index (-1 = CPU)")
        self.controls = c
        self._accepted = {k: w.value for k, w in c.items()}   # the values the context last accepted
        for key, w in c.items():
            w.add_class(f"toolkit-control-{key}")
            w.observe(partial(self._on_change, key), names=["value"])
        self.badge = W.HTML(layout=W.Layout(min_height="3em")).add_class("toolkit-badge-widget")
        self.errors = W.HTML().add_class("toolkit-error")
        self.sched_info = W.HTML().add_class("toolkit-sched-info")
        self.runtime = W.HTML("JAX runtime: not started").add_class("toolkit-runtime")
        self.collapse = W.ToggleButtons(options=["layer", "split", "none"], value=collapse,
                                        description="split map by", style=style)
        self.collapse.observe(lambda _ch: self._draw(force=True), names=["value"])
        self.tokens = W.Text(value="1, 2, 3", description="tokens", style=style, layout=W.Layout(width="220px"))
        self.compile_button = W.Button(description="compile", icon="cogs").add_class("toolkit-compile")
        self.run_button = W.Button(description="run prompt", icon="play").add_class("toolkit-run")
        self.compile_button.on_click(lambda _b: self._runtime_action("compile"))
        self.run_button.on_click(lambda _b: self._runtime_action("run"))
        self.figures: dict[str, go.FigureWidget] = {
            name: go.FigureWidget() for name in ("timeline", "buffers", "split_map", "memory_layout")}
        for name, fw in self.figures.items():
            fw.add_class(f"toolkit-fig-{name}")
        # inspect: a click on a node (split map) or a tensor (memory layout) explains it here
        self.inspect = W.HTML("<i>click a node in the split map or a tensor in the memory layout</i>"
                              ).add_class("toolkit-inspect")
        self.inspected: NodeExplanation | None = None
        # compare: any two reserves as a diff; by default the previous and the newest one
        self.compare_toggle = W.ToggleButton(value=False, description="compare reserves", icon="columns",
                                             layout=W.Layout(width="190px")).add_class("toolkit-compare-toggle")
        self.compare_a = W.Dropdown(description="from", style=style, layout=W.Layout(width="340px")
                                    ).add_class("toolkit-compare-a")
        self.compare_b = W.Dropdown(description="to", style=style, layout=W.Layout(width="340px")
                                    ).add_class("toolkit-compare-b")
        self.compare_html = W.HTML().add_class("toolkit-compare")
        self.compare_box = W.VBox([W.HBox([self.compare_a, self.compare_b]), self.compare_html],
                                  layout=W.Layout(display="none")).add_class("toolkit-compare-box")
        self._compare_follow = True       # follow (previous, newest) until a pick is made
        self.compare_toggle.observe(self._on_compare_toggle, names=["value"])
        self.compare_a.observe(self._on_compare_pick, names=["value"])
        self.compare_b.observe(self._on_compare_pick, names=["value"])
        # fit to budget (toolkit.ui.fitpanel): common_fit_params for the current model, built when opened
        self.fit_toggle = W.ToggleButton(value=False, description="fit to budget", icon="compress",
                                         layout=W.Layout(width="190px")).add_class("toolkit-fit-toggle")
        self.fit_box = W.VBox([], layout=W.Layout(display="none")).add_class("toolkit-fit-box")
        self.fit_panel: FitPanel | None = None
        self.fit_toggle.observe(self._on_fit_toggle, names=["value"])
        if isinstance(self.ctx, TracedContext):
            self.fit_toggle.layout.display = "none"     # a traced function has no llama model to fit
            self.run_button.description = "run vs jax.jit"
            self.runtime.value = f"{html.escape(self.ctx.name)}: not run yet"
        rows = [("model", "gguf", "devices", "budget_mib", "placement"),
                ("max_nodes", "parallel", "op_offload"), ("n_ctx", "n_batch", "n_ubatch"),
                ("flash_attn", "n_gpu_layers")]
        boxes = [W.HBox([c[k] for k in row if k in c] + ([self.sched_info] if i == 1 else []))
                 for i, row in enumerate(rows) if any(k in c for k in row)]
        run_row = [self.run_button] if self.traced else [self.tokens, self.compile_button, self.run_button]
        self.widget = W.VBox([
            *boxes,
            self.badge, self.errors,
            self.figures["timeline"], self.compare_toggle, self.compare_box, self.fit_toggle, self.fit_box,
            self.figures["buffers"],
            self.collapse, self.figures["split_map"], self.figures["memory_layout"], self.inspect,
            W.HBox(run_row), self.runtime,
        ]).add_class("toolkit-dashboard")

    @staticmethod
    def _fa_value(v: object) -> str:
        if isinstance(v, bool):
            return "on" if v else "off"
        s = str(getattr(v, "name", v)).lower()
        return s if s in ("auto", "on", "off") else "auto"

    # ---------------------------------------------------------------- change path
    def _on_change(self, key: str, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._pending[key] = change["new"]
        self._t_change = time.perf_counter()
        self._schedule()

    def _schedule(self) -> None:
        if self._hold:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.debounce_s <= 0:
            self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()           # a newer change restarts the wait: the last value wins
        self._timer = loop.call_later(self.debounce_s, self.flush)

    def flush(self) -> None:
        """Apply the pending (coalesced) changes now: one reserve, then redraw."""
        self._timer = None
        pending, self._pending = self._pending, {}
        if not pending:
            return
        t0 = getattr(self, "_t_change", time.perf_counter())
        t_update = time.perf_counter()
        try:
            if not self.traced and any(k in pending for k in CONTEXT_CONTROLS):
                self._new_context(pending)
            else:
                keys = TRACED_UPDATE_KEYS if self.traced else UPDATE_KEYS
                changes = {keys[k]: self._convert(k, v) for k, v in pending.items() if k in keys}
                if any(k in pending for k in DEVICE_CONTROLS):
                    c = self.controls
                    changes["devices"] = parse_devices(c["devices"].value,
                                                       float(c["budget_mib"].value) or None).cparams_devices()
                self.ctx.update(**changes)
                self._devices, self._budget = self.controls["devices"].value, self.controls["budget_mib"].value
            self.n_updates += 1
            self.error, self.exception = None, None
        except ToolkitError as e:  # a refused value: shown; the context keeps its previous state
            self.error, self.exception = f"{type(e).__name__}: {e}", e
            self._revert(pending)
        except Exception as e:  # a bug: the widget stays alive and says so (the traceback is kept)
            self.error, self.exception = f"internal error, please report it: {type(e).__name__}: {e}", e
            self._revert(pending)
        t_draw = time.perf_counter()
        self.refresh()
        if self.error is None:
            self._accepted = {k: w.value for k, w in self.controls.items()}
        t_end = time.perf_counter()
        # what the user waited for: the change (from its first observer call) until figures were sent
        self.timings_ms = {"wait": (t_update - t0) * 1e3, "update": (t_draw - t_update) * 1e3,
                           "draw": (t_end - t_draw) * 1e3, "total": (t_end - t0) * 1e3}

    def _revert(self, keys: dict[str, Any]) -> None:
        # the controls keep showing what the context runs with; the error names the refused value
        self._syncing = True
        try:
            for k in keys:
                self.controls[k].value = self._accepted[k]
        finally:
            self._syncing = False

    def apply(self, **changes: Any) -> None:
        """Set controls as a user would (names of ``controls``), then apply them as one change."""
        self._hold = True                  # collect all of them first
        try:
            for k, v in changes.items():
                self.controls[k].value = v
        finally:
            self._hold = False
        if self._timer is not None:
            self._timer.cancel()
        self.flush()

    def _convert(self, key: str, value: Any) -> Any:
        if key == "max_nodes":
            return parse_max_nodes(value)
        if key == "placement":
            return parse_placement(value)
        if key in ("n_ctx", "n_batch", "n_ubatch", "n_gpu_layers"):
            return int(value)
        return value

    def _new_context(self, pending: dict[str, Any]) -> None:
        c = self.controls
        model = c["gguf"].value.strip() or MODEL_PRESETS.get(c["model"].value or "", self._model)
        devices, budget = c["devices"].value, float(c["budget_mib"].value) or None
        cparams = {UPDATE_KEYS[k]: self._convert(k, c[k].value) for k in CPARAM_CONTROLS}
        assert isinstance(self.ctx, LlamaContextView)
        n_layer_old = self.ctx.hparams.n_layer
        if c["n_gpu_layers"].value >= n_layer_old + 1:
            cparams.pop("n_gpu_layers")      # "all layers" stays all layers on another model
        # a new model starts from llama.cpp's pipeline-parallel rule; a typed max_nodes carries over
        ctx = self._factory(model, devices, budget, max_nodes=parse_max_nodes(c["max_nodes"].value), **cparams)
        self.ctx, self._model, self._devices, self._budget = ctx, model, devices, budget
        n_layer = ctx.hparams.n_layer
        self._syncing = True
        try:
            c["n_gpu_layers"].max = n_layer + 1
            c["n_gpu_layers"].value = min(ctx.cparams.n_gpu_layers, n_layer + 1)
        finally:
            self._syncing = False

    # ---------------------------------------------------------------- drawing
    def refresh(self) -> None:
        """Badge, scheduler line and figures from the context's newest event."""
        events = list(self.ctx.events)
        ev = events[-1] if events else None
        held = self.ctx.scheduler.max_nodes
        self.errors.value = (f"<pre class='toolkit-error-text' style='color:#D55E00;white-space:pre-wrap'>"
                             f"{html.escape(self.error)}</pre>" if self.error else "")
        if ev is not None and self.error is None:
            auto = self.ctx.auto_max_nodes_text
            how = f"auto: {auto}" if self.controls["max_nodes"].value == "auto" else "typed"
            self.sched_info.value = (f"<span class='toolkit-max-nodes' data-event='{ev.index}' "
                                     f"data-value='{ev.params.max_nodes}' data-held='{held}'>"
                                     f"max_nodes {ev.params.max_nodes} ({how}) · scheduler "
                                     f"holds {held} · n_copies {ev.n_copies} · {ev.n_nodes_pp} nodes, "
                                     f"{ev.n_splits_pp} splits</span>")
            self._sync_flags(ev.params.parallel, ev.params.op_offload)
        self._draw()
        # the badge last: the front end applies updates in order, so a page showing the badge of an
        # event shows that event's scheduler line and figures too
        self.badge.value = badge_html(ev, error=self.error, held_max_nodes=held)

    def _sync_flags(self, parallel: bool, op_offload: bool) -> None:
        # the fallback of llama_context::sched_reserve clears pipeline_parallel: the checkbox shows what
        # the context uses
        self._syncing = True
        try:
            self.controls["parallel"].value = bool(parallel)
            self.controls["op_offload"].value = bool(op_offload)
        finally:
            self._syncing = False

    def _draw(self, force: bool = False) -> None:
        events = list(self.ctx.events)
        key = (id(self.ctx), len(events))
        if not force and key == self._drawn:
            return
        self._drawn = key
        plan = next((e.plan for e in reversed(events) if e.plan is not None), None)
        collapse: Collapse = self.collapse.value
        w = self.fig_width
        _replace(self.figures["timeline"], figures.timeline(events, self.ctx.compile_events), w)
        _replace(self.figures["buffers"], figures.buffer_sizes(events), w)
        self._plan = plan
        # the same placements and allocations draw the same split map and layout (a reuse that only
        # moved max_nodes, a CPU-only op offload toggle): compare the plans (frozen data, < 1 ms on
        # 1,000 nodes) and leave both figures alone
        plan_key = (plan, collapse, w)
        if force or plan_key != self._plan_drawn:
            self._plan_drawn = plan_key
            _replace(self.figures["split_map"], figures.split_map(plan, collapse, width=w), w)
            _replace(self.figures["memory_layout"], figures.memory_layout(plan), w)
            for name in ("split_map", "memory_layout"):
                for trace in self.figures[name].data:
                    trace.on_click(partial(self._on_click, name))
        self._draw_compare()

    # ---------------------------------------------------------------- inspect
    def _on_click(self, figure: str, trace: Any, points: Any, _state: Any = None) -> None:
        """A plotly click: each clickable trace carries, per point, the node index or tensor name."""
        if not points.point_inds:
            return
        cd = trace.customdata
        if cd is None:
            return
        target = cd[points.point_inds[0]]
        if isinstance(target, (list, tuple)):
            target = target[0]
        self.explain(target)

    def explain(self, node: int | str) -> NodeExplanation | None:
        """Show one node (graph index or name) of the newest plan in the inspect panel, as a click does.

        A split input copy (``CUDA0#x#0``) or a graph input planned by the allocator that is not
        a node is shown with its allocation and the nodes that read it; ``"split:K"`` shows split
        K's inputs and their copies."""
        plan = self._plan
        if plan is None:
            return None
        try:
            if isinstance(node, str) and node.startswith("split:") and node[6:].isdigit():
                self.inspected = None
                self.inspect.value = split_html(plan, int(node[6:]))
                return None
            if isinstance(node, str) and not any(n.name == node for n in plan.nodes):
                self.inspected = None
                self.inspect.value = tensor_html(plan, node)
                return None
            e = explain(plan, node if isinstance(node, str) else int(node))   # plotly may hand numpy numbers
        except ValueError as err:
            self.inspect.value = f"<span class='toolkit-inspect-error'>{html.escape(str(err))}</span>"
            return None
        self.inspected = e
        self.inspect.value = explanation_html(e)
        return e

    # ---------------------------------------------------------------- compare
    def _on_compare_toggle(self, change: dict[str, Any]) -> None:
        self.compare_box.layout.display = "flex" if change["new"] else "none"
        self._draw_compare()

    def _on_compare_pick(self, _change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._compare_follow = False
        self._draw_compare()

    def compare(self, a: int | None = None, b: int | None = None) -> EventDiff | None:
        """Open the compare view on events ``a`` and ``b`` (indices; None: previous and newest)."""
        if a is not None or b is not None:
            self._compare_follow = False
            self._syncing = True
            try:
                if a is not None:
                    self.compare_a.value = a
                if b is not None:
                    self.compare_b.value = b
            finally:
                self._syncing = False
        self.compare_toggle.value = True
        self._draw_compare()
        return self.diff

    def _draw_compare(self) -> None:
        events = list(self.ctx.events)
        options = [(f"#{e.index} {e.decision} · {e.trigger}"[:80], e.index) for e in events]
        self._syncing = True
        try:
            if [o[1] for o in self.compare_a.options] != [o[1] for o in options]:
                keep = (self.compare_a.value, self.compare_b.value)
                self.compare_a.options = options
                self.compare_b.options = options
                if not self._compare_follow:
                    self.compare_a.value, self.compare_b.value = keep
            pair = default_pair(events)
            if self._compare_follow and pair is not None:
                self.compare_a.value = events[pair[0]].index
                self.compare_b.value = events[pair[1]].index
        finally:
            self._syncing = False
        self.diff = None
        if not self.compare_toggle.value:
            return                          # hidden: nothing to draw
        by_index = {e.index: e for e in events}
        ea, eb = by_index.get(self.compare_a.value), by_index.get(self.compare_b.value)
        if ea is None or eb is None:
            self.compare_html.value = "<i>the compare view needs two reserves</i>"
            return
        self.diff = compare(ea, eb, events)
        self.compare_html.value = diff_html(self.diff)

    # ---------------------------------------------------------------- fit to budget
    def _on_fit_toggle(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.open_fit()
        self.fit_box.layout.display = "flex" if change["new"] else "none"

    def open_fit(self) -> FitPanel:
        """Open the fit-to-budget panel (a :class:`toolkit.ui.fitpanel.FitPanel` of the current model)."""
        if self.fit_panel is None:
            from toolkit.ui.fitpanel import FitPanel, flags_of

            ctx = self.ctx
            assert isinstance(ctx, LlamaContextView)
            try:   # a 24G budget per simulated or CUDA-like device of the picker spec
                spec = parse_devices(str(self._devices))
                kind, n = (spec.kind, spec.count) if spec.kind in ("sim", "cuda") else ("sim", 1)
            except ParameterError:   # devices no picker spec describes (mixed kinds): one to start from
                kind, n = "sim", 1
            self.fit_panel = FitPanel(lambda: (self._llama_hparams(), preset_of(self._llama_hparams())),
                                      budgets=",".join(["24G"] * n), kind=kind,
                                      flags=flags_of(ctx.cparams), fig_width=self.fig_width)
            self.fit_box.children = (self.fit_panel.widget,)
        self.fit_toggle.value = True
        return self.fit_panel

    def _llama_hparams(self) -> LlamaHParams:
        assert isinstance(self.ctx, LlamaContextView)
        return self.ctx.hparams

    # ---------------------------------------------------------------- share
    def save_html(self, path: str | Path) -> Path:
        """One self-contained HTML file: figures (plotly.js embedded), event log, parameters, version."""
        from toolkit.ui import share

        return share.save_html(path, [share.section_of(self.ctx, self._model)],
                               title=f"toolkit report: {self._model} on {self._devices}",
                               meta={"devices": str(self._devices)})

    # ---------------------------------------------------------------- runtime
    def _runtime_action(self, what: str) -> None:
        """compile: every split of the current scheduler for its device; run: decode the tokens."""
        if isinstance(self.ctx, TracedContext):
            self._run_traced(self.ctx)
            return
        ctx = self.ctx
        try:
            if not isinstance(ctx, RunnableContext):
                raise UnsupportedFeature("runtime", f"a {type(ctx).__name__} has no model setup to run on JAX")
            t0 = time.perf_counter()
            from toolkit.jaxrt import runtime  # jax loads here
            if what == "compile":
                # compile_splits records a CompileEvent (the timeline's hover shows it)
                info = runtime.compile_splits(ctx)
                out = (f"{info.get('compiled', '?')} split(s) compiled, {info.get('cache_hits', '?')} cache hit(s), "
                       f"XLA {info.get('compile_ms', 0.0):.1f} ms")
            else:
                tokens = [int(t) for t in self.tokens.value.replace(",", " ").split()]
                out = _summary(runtime.decode(ctx, tokens))
            ms = (time.perf_counter() - t0) * 1000
            self.runtime.value = f"{what} took {ms:.1f} ms: {html.escape(out)}"
        except Exception as e:
            msg = html.escape(f"{type(e).__name__}: {e}")
            self.runtime.value = f"<span style='color:#D55E00'>{what} failed: {msg}</span>"
        self.refresh()
        self._draw(force=True)

    def _run_traced(self, ctx: TracedContext) -> None:
        """Execute the traced function split by split with the current scheduler; compare with jax.jit."""
        try:
            r = ctx.run()
            self.last_run = r
            copies = f"{r['copies']} cop{'y' if r['copies'] == 1 else 'ies'}"
            out = (f"{r['ran_splits']} split(s) on {', '.join(r['devices'])}, {copies} between devices, "
                   f"{r['run_ms']:.1f} ms; max |diff| vs jax.jit = {r['max_abs_diff']:.3g}")
            self.runtime.value = (f"<span class='toolkit-run-result' data-max-abs-diff='{r['max_abs_diff']}'>"
                                  f"run {html.escape(ctx.name)}: {html.escape(out)}</span>")
        except Exception as e:
            msg = html.escape(f"{type(e).__name__}: {e}")
            self.runtime.value = f"<span style='color:#D55E00'>run failed: {msg}</span>"

    # ---------------------------------------------------------------- display
    def badge_text(self) -> str:
        events = self.ctx.events
        if self.error is not None:
            return f"ERROR · {self.error} · previous state kept"
        return badge_text(events[-1] if events else None)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"Dashboard(model={self._model!r}, devices={self._devices!r}, events={len(self.ctx.events)})"


def _summary(out: object) -> str:
    shape = getattr(out, "shape", None)
    if shape is not None:
        try:
            import numpy as np

            arr = np.asarray(out)
            return f"shape {tuple(shape)}, argmax of last row {int(arr.reshape(-1, shape[-1])[-1].argmax())}"
        except Exception:
            return f"shape {tuple(shape)}"
    return str(out)[:300]


def _replace(fw: go.FigureWidget, fig: go.Figure, width: int | None = None) -> None:
    """Update a FigureWidget in place with a freshly built figure.

    When the new figure has the same traces (count and types) as the widget, only the traces and
    the top-level layout entries that differ are sent, in one ``batch_update`` message; otherwise
    the traces are replaced and the layout reset."""
    layout = fig.layout.to_plotly_json()
    if width:
        layout["width"] = width
    # Plotly.relayout merges: name every list and axis range so nothing of the old figure lingers
    layout.setdefault("shapes", [])
    layout.setdefault("annotations", [])
    for k, v in list(layout.items()):
        if (k.startswith("xaxis") or k.startswith("yaxis")) and isinstance(v, dict) and "range" not in v:
            v["autorange"] = True
    new = [t.to_plotly_json() for t in fig.data]
    old = [t.to_plotly_json() for t in fw.data]
    same_shape = len(old) == len(new) and all(o.get("type") == n.get("type") for o, n in zip(old, new))
    with fw.batch_update():
        if same_shape:
            for trace, o, n in zip(fw.data, old, new):
                if o != n:
                    n.update({k: None for k in o.keys() - n.keys()})    # what the new trace leaves unset
                    trace.update(n, overwrite=True)
            cur = fw.layout.to_plotly_json()
            changed = {k: v for k, v in layout.items() if cur.get(k) != v}
            if changed:
                fw.layout.update(changed, overwrite=True)
        else:
            fw.data = ()
            fw.add_traces(list(fig.data))
            fw.layout = layout
    _keep_state_current(fw)


def _keep_state_current(fw: go.FigureWidget) -> None:
    """Make the widget's synced state (``_widget_data``/``_widget_layout``) what the views show.

    plotly sends edits as one-off messages and leaves that state at the first draw, so a page
    reload (which asks the kernel for the state) or a saved notebook would show an old figure.
    ``Widget.set_state`` stores a state as if the views had sent it, so it is not sent back to
    them (they have it already); its echo to the views is switched off for the call.
    """
    values = {"_widget_data": [t.to_plotly_json() for t in fw.data], "_widget_layout": fw.layout.to_plotly_json()}
    state = {name: fw.trait_metadata(name, "to_json")(value, fw) for name, value in values.items()}
    echo = ipywidgets_widget.JUPYTER_WIDGETS_ECHO
    ipywidgets_widget.JUPYTER_WIDGETS_ECHO = False
    try:
        fw.set_state(state)
    finally:
        ipywidgets_widget.JUPYTER_WIDGETS_ECHO = echo


def dashboard(model: Any = "tiny", devices: str | None = "cpu", budget_mib: float | None = None, *,
              debounce_s: float = 0.15, **cparams: Any) -> Dashboard:
    """One line in a notebook: a planning-only Context for ``model`` and its dashboard.

    ``model``: tiny / small / Llama-3-8B-shaped / 70B-shaped (or llama3_8b, llama3_70b), or a .gguf path;
    or a traced JAX function (``toolkit.trace(f, ...)``, on ``devices``; None keeps its backends) or a
    ``TracedContext``. ``devices``: cpu, rpc:N or sim:N; ``budget_mib``: each device's compute memory budget.
    Other keywords are context parameters (n_ctx=..., n_ubatch=..., flash_attn=...).
    """
    if not isinstance(model, str):
        if cparams:
            raise ParameterError(", ".join(cparams), "given", "no context parameters for a traced function "
                                 "(its graph is fixed)")
        return Dashboard(_as_context(model, devices, budget_mib), debounce_s=debounce_s)
    if devices is None:
        devices = "cpu"
    ctx = make_context(model, devices, budget_mib, **cparams)
    return Dashboard(ctx, model=model, devices=devices, budget_mib=budget_mib, debounce_s=debounce_s)
