"""The live dashboard: ipywidgets controls -> ``ctx.update(...)`` (sched_reserve) -> figures.

>>> import toolkit
>>> dash = toolkit.dashboard(model="tiny")       # doctest: +SKIP
>>> dash.controls["max_nodes"].value = "512"     # as typed  # doctest: +SKIP
>>> dash.ctx.events[-1].decision                 # doctest: +SKIP
'reused'

The dashboard reads a context through one typed view, ``ctx.settings()``
(:class:`toolkit.view.ContextSettings`): the control table (``toolkit.ui.controls``) is built
from its controls, the panels (``toolkit.ui.panels``) from its groupings, model and runtime.

Every control change goes through one path: the observer records the new value, a short timer
coalesces a burst of changes (a dragged slider) so the last value wins, then one
``ctx.update(**changes)`` runs and the figures are redrawn from the newest ReserveEvent. An
exception never escapes a callback: it is shown in the dashboard and the previous state stays.
"""

from __future__ import annotations

import asyncio
import html
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import ipywidgets as W

from toolkit.compare import EventDiff
from toolkit.errors import ParameterError, ToolkitError
from toolkit.explain import LoggedBuffer, from_log
from toolkit.reuse import ContextView
from toolkit.sched.explain import NodeExplanation
from toolkit.trace.api import Traced
from toolkit.trace.session import TracedContext
from toolkit.ui.choices import make_context, parse_devices
from toolkit.ui.controls import ControlTable, model_label
from toolkit.ui.layers import Collapse
from toolkit.ui.panels import ComparePanel, FigurePanel, FitArea, InspectPanel, RuntimePanel
from toolkit.ui.text import badge_html, badge_text
from toolkit.view import ContextSettings

if TYPE_CHECKING:
    from toolkit.ui.fitpanel import FitPanel


class SettingsContext(ContextView, Protocol):
    """A :class:`~toolkit.reuse.ContextView` that also says what it offers (``toolkit.view``)."""

    def settings(self) -> ContextSettings:
        """The controls, groupings, model and runtime of this context."""
        ...


def _as_context(ctx: SettingsContext | Traced, devices: str | None = None,
                budget_mib: float | None = None) -> SettingsContext:
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
    wrapped in one on ``devices``): the controls are those ``ctx.settings()`` offers, and "run"
    does what the context's runtime offers (decode a prompt, or run the function split by split
    against jax.jit).

    ``debounce_s`` is how long a burst of changes is collected before one reserve runs; with
    0 (or outside a running event loop, as in tests) every change reserves at once. ``collapse``:
    how the split map groups nodes (None: the first of the context's groupings). ``logged``: buffer
    sizes a llama.cpp log printed (``toolkit.explain``), kept as reference marks on the buffer figure.
    """

    def __init__(self, ctx: SettingsContext | Traced, *, model: str | None = None, devices: str | None = None,
                 budget_mib: float | None = None, debounce_s: float = 0.15, collapse: Collapse | None = None,
                 fig_width: int = 960, context_factory: Callable[..., Any] = make_context,
                 logged: Sequence[LoggedBuffer] = ()) -> None:
        self.ctx: SettingsContext = _as_context(ctx, devices, budget_mib)
        self.logged = tuple(logged)
        self.fig_width = fig_width
        self.debounce_s = debounce_s
        self.error: str | None = None
        self.exception: BaseException | None = None   # what made the last change fail (None: it applied)
        self.n_updates = 0                      # ctx.update / context rebuild calls (after coalescing)
        self.timings_ms: dict[str, float] = {}  # the last change: wait (coalescing), update, draw, total
        self._factory = context_factory
        self._pending: dict[str, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._hold = False
        self._t_change = time.perf_counter()
        s = self.ctx.settings()
        self._model = model or (model_label(s.model) if s.model is not None else s.title)
        if collapse is not None and collapse not in s.groupings:
            raise ParameterError("collapse", collapse, f"one of {', '.join(s.groupings)}")
        self._build(s, collapse)
        self.refresh()

    # ---------------------------------------------------------------- widgets
    def _build(self, s: ContextSettings, collapse: Collapse | None) -> None:
        self.table = ControlTable(s, self._on_change)
        self.controls = self.table.widgets
        self.badge = W.HTML(layout=W.Layout(min_height="3em")).add_class("toolkit-badge-widget")
        self.errors = W.HTML().add_class("toolkit-error")
        self.sched_info = W.HTML().add_class("toolkit-sched-info")
        groupings = s.groupings if collapse is None else (collapse, *(g for g in s.groupings if g != collapse))
        self.plots = FigurePanel(groupings, self.fig_width, self.explain, self.logged)
        self.figures, self.collapse = self.plots.figures, self.plots.collapse
        self.collapse.observe(lambda _ch: self._draw(force=True), names=["value"])
        # inspect: a click on a node (split map) or a tensor (memory layout) explains it here
        self.inspector = InspectPanel()
        self.inspect = self.inspector.html
        # compare: any two reserves as a diff; by default the previous and the newest one
        self.comparer = ComparePanel()
        self.compare_toggle, self.compare_box, self.compare_html = (self.comparer.toggle, self.comparer.box,
                                                                    self.comparer.html)
        # fit to budget (toolkit.ui.fitpanel): common_fit_params for the current model, built when opened
        self.fitter = FitArea(lambda: self.ctx.settings(), self.fig_width)   # the context a model pick made
        self.fit_toggle, self.fit_box = self.fitter.toggle, self.fitter.box
        self.runner = RuntimePanel()
        self.tokens, self.compile_button, self.run_button = (self.runner.tokens, self.runner.compile_button,
                                                             self.runner.run_button)
        self.runtime = self.runner.html
        self.compile_button.on_click(lambda _b: self._runtime_action("compile"))
        self.run_button.on_click(lambda _b: self._runtime_action("run"))
        self.widget = W.VBox([
            *self.table.rows({1: [self.sched_info]}),
            self.badge, self.errors,
            self.figures["timeline"], self.compare_toggle, self.compare_box, self.fit_toggle, self.fit_box,
            self.figures["buffers"],
            self.collapse, self.figures["split_map"], self.figures["memory_layout"], self.inspect,
            self.runner.row(s), self.runtime,
        ]).add_class("toolkit-dashboard")

    @property
    def inspected(self) -> NodeExplanation | None:
        return self.inspector.inspected

    @property
    def diff(self) -> EventDiff | None:
        return self.comparer.diff

    @property
    def fit_panel(self) -> FitPanel | None:
        return self.fitter.panel

    @property
    def last_run(self) -> Any:
        return self.runner.last_run

    # ---------------------------------------------------------------- change path
    def _on_change(self, key: str, value: Any) -> None:
        self._pending[key] = value
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
        t0 = self._t_change
        t_update = time.perf_counter()
        try:
            if self.table.picks_model(pending):
                self._new_context()
            else:
                self.ctx.update(**self.table.changes(pending))
            self.n_updates += 1
            self.error, self.exception = None, None
        except ToolkitError as e:  # a refused value: shown; the context keeps its previous state
            self.error, self.exception = f"{type(e).__name__}: {e}", e
            self.table.revert(pending)
        except Exception as e:  # a bug: the widget stays alive and says so (the traceback is kept)
            self.error, self.exception = f"internal error, please report it: {type(e).__name__}: {e}", e
            self.table.revert(pending)
        t_draw = time.perf_counter()
        self.refresh()
        if self.error is None:
            self.table.accept()
        t_end = time.perf_counter()
        # what the user waited for: the change (from its first observer call) until figures were sent
        self.timings_ms = {"wait": (t_update - t0) * 1e3, "update": (t_draw - t_update) * 1e3,
                           "draw": (t_end - t_draw) * 1e3, "total": (t_end - t0) * 1e3}

    def apply(self, **changes: Any) -> None:
        """Set controls as a user would (names of ``controls``), then apply them as one change."""
        self._hold = True                  # collect all of them first
        try:
            self.table.set(changes)
        finally:
            self._hold = False
        if self._timer is not None:
            self._timer.cancel()
        self.flush()

    def _new_context(self) -> None:
        """A model picker moved: a new context for that model, given the controls' values."""
        model = self.table.model_choice() or self._model
        devices = self.controls["devices"].value
        budget = float(self.controls["budget_mib"].value) or None
        # a new model starts from llama.cpp's pipeline-parallel rule; a typed max_nodes carries over
        ctx = self._factory(model, devices, budget, **self.table.carried())
        self.ctx, self._model = ctx, model
        self.table.show(ctx.settings())      # its own values: the layer count bounds n_gpu_layers

    # ---------------------------------------------------------------- drawing
    def refresh(self) -> None:
        """Badge, scheduler line and figures from the context's newest event."""
        events = list(self.ctx.events)
        ev = events[-1] if events else None
        held = self.ctx.scheduler.max_nodes
        self.errors.value = (f"<pre class='toolkit-error-text' style='color:#D55E00;white-space:pre-wrap'>"
                             f"{html.escape(self.error)}</pre>" if self.error else "")
        if ev is not None and self.error is None:
            g = ev.planned   # the graph reserved last, whose plan the figures draw
            auto = self.ctx.auto_max_nodes_text
            how = f"auto: {auto}" if self.controls["max_nodes"].value == "auto" else "typed"
            self.sched_info.value = (f"<span class='toolkit-max-nodes' data-event='{ev.index}' "
                                     f"data-value='{ev.params.max_nodes}' data-held='{held}'>"
                                     f"max_nodes {ev.params.max_nodes} ({how}) · scheduler "
                                     f"holds {held} · n_copies {ev.n_copies} · {g.n_nodes if g else 0} nodes, "
                                     f"{g.n_splits if g else 0} splits</span>")
            # the fallback of llama_context::sched_reserve clears pipeline_parallel: the checkboxes
            # show what the context uses
            self.table.show(self.ctx.settings(), kinds=("flag",))
        self._draw()
        # the badge last: the front end applies updates in order, so a page showing the badge of an
        # event shows that event's scheduler line and figures too
        self.badge.value = badge_html(ev, error=self.error, held_max_nodes=held)

    def _draw(self, force: bool = False) -> None:
        events = list(self.ctx.events)
        if self.plots.draw(self.ctx, events, self.ctx.compile_events, force):
            self.comparer.draw(events)

    def redraw(self) -> None:
        """Draw every figure again from the context's events (after an event was replaced)."""
        self._draw(force=True)

    # ---------------------------------------------------------------- inspect, compare, fit
    def explain(self, node: int | str) -> NodeExplanation | None:
        """Show one node (graph index or name) of the newest plan in the inspect panel, as a click does.

        A split input copy (``CUDA0#x#0``) or a graph input planned by the allocator that is not
        a node is shown with its allocation and the nodes that read it; ``"split:K"`` shows split
        K's inputs and their copies."""
        plan = self.plots.plan
        return None if plan is None else self.inspector.explain(plan, node)

    def compare(self, a: int | None = None, b: int | None = None) -> EventDiff | None:
        """Open the compare view on events ``a`` and ``b`` (indices; None: previous and newest)."""
        return self.comparer.open(list(self.ctx.events), a, b)

    def open_fit(self) -> FitPanel:
        """Open the fit-to-budget panel (a :class:`toolkit.ui.fitpanel.FitPanel` of the current model)."""
        return self.fitter.open()

    # ---------------------------------------------------------------- share
    def save_html(self, path: str | Path) -> Path:
        """One self-contained HTML file: figures (plotly.js embedded), event log, parameters, version."""
        from toolkit.ui import share

        devices = self.controls["devices"].value
        return share.save_html(path, [share.section_of(self.ctx, self._model, self.logged)],
                               title=f"toolkit report: {self._model} on {devices}", meta={"devices": str(devices)})

    # ---------------------------------------------------------------- runtime
    def _runtime_action(self, what: str) -> None:
        """What the context's runtime offers (toolkit.view.Runtime); redrawn when it recorded something."""
        if self.runner.act(what, self.ctx.settings(), self.ctx):
            self.refresh()
            self._draw(force=True)

    # ---------------------------------------------------------------- display
    def badge_text(self) -> str:
        events = self.ctx.events
        if self.error is not None:
            return f"ERROR · {self.error} · previous state kept"
        return badge_text(events[-1] if events else None)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        devices = self.controls["devices"].value
        return f"Dashboard(model={self._model!r}, devices={devices!r}, events={len(self.ctx.events)})"


def dashboard(model: Any = None, devices: str | None = "cpu", budget_mib: float | None = None, *,
              log: str | Path | None = None, debounce_s: float = 0.15, **cparams: Any) -> Dashboard:
    """One line in a notebook: a planning-only Context for ``model`` and its dashboard.

    ``model``: tiny (the default) / small / Llama-3-8B-shaped / 70B-shaped (or llama3_8b, llama3_70b), or a
    .gguf path; or a traced JAX function (``toolkit.trace(f, ...)``, on ``devices``; None keeps its backends) or
    a ``TracedContext``. ``devices``: cpu, rpc:N or sim:N; ``budget_mib``: each device's compute memory budget.
    Other keywords are context parameters (n_ctx=..., n_ubatch=..., flash_attn=...).

    ``log``: a llama.cpp start-up log (its text or a path): the dashboard opens on the context the log
    describes (:func:`toolkit.from_log`; ``model`` may name the run's GGUF file) with the log's buffer
    sizes as reference marks ("llama.cpp log") on the buffer figure, which stay where they are while
    the controls move. The log sets the devices and context parameters, so none may be given with it;
    a log that cannot be read raises from_log's :class:`~toolkit.errors.ToolkitError` before any widget
    is built.
    """
    if log is not None:
        return _dashboard_of_log(log, model, devices, budget_mib, debounce_s, cparams)
    if model is None:
        model = "tiny"
    if not isinstance(model, str):
        if cparams:
            raise ParameterError(", ".join(cparams), "given", "no context parameters for a traced function "
                                 "(its graph is fixed)")
        return Dashboard(_as_context(model, devices, budget_mib), debounce_s=debounce_s)
    if devices is None:
        devices = "cpu"
    ctx = make_context(model, devices, budget_mib, **cparams)
    return Dashboard(ctx, model=model, debounce_s=debounce_s)


def _dashboard_of_log(log: str | Path, model: Any, devices: str | None, budget_mib: float | None,
                      debounce_s: float, cparams: dict[str, Any]) -> Dashboard:
    """:func:`dashboard` with ``log=``: the rebuilt context, the logged buffer sizes as marks."""
    given = [*cparams, *(["devices"] if devices not in (None, "cpu") else []),
             *(["budget_mib"] if budget_mib is not None else [])]
    if given:
        raise ParameterError(", ".join(given), "given with log=", "no devices or context parameters besides "
                             "log= (the log sets them; move the controls once the dashboard is open)")
    if model is not None and not (isinstance(model, (str, Path)) and str(model).lower().endswith(".gguf")):
        raise ParameterError("model", model, "None or the .gguf file the logged run loaded, with log=")
    run = from_log(log, model)
    ctx = run.context()
    return Dashboard(ctx, debounce_s=debounce_s, logged=run.log.buffers())
