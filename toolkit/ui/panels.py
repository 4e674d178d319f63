"""The dashboard's panels: figures, inspect, compare, fit to budget and the runtime row.

Each panel owns its widgets and draws from data it is handed (a context's events and plans, its
:class:`~toolkit.view.ContextSettings`); none of them computes a plan or changes the context.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import ipywidgets as W
import ipywidgets.widgets.widget as ipywidgets_widget
import numpy as np
import plotly.graph_objects as go

from toolkit.compare import EventDiff, compare, default_pair
from toolkit.errors import ParameterError, ToolkitError
from toolkit.explain.parse import LoggedBuffer
from toolkit.models.tokenizer import Vocab, top_tokens
from toolkit.reuse import CompileEvent, ReserveEvent
from toolkit.sched.explain import NodeExplanation, explain
from toolkit.sched.plan import Plan
from toolkit.ui import figures
from toolkit.ui.choices import parse_devices, preset_of
from toolkit.ui.inspect import diff_html, explanation_html, split_html, tensor_html
from toolkit.ui.layers import Collapse
from toolkit.view import COLLAPSES, ContextSettings

if TYPE_CHECKING:
    from toolkit.context import RunnableContext
    from toolkit.models.hparams import HParams
    from toolkit.ui.fitpanel import FitPanel

STYLE = {"description_width": "initial"}
FIGURES = ("timeline", "buffers", "split_map", "memory_layout")
# the reserves the live timeline and buffer history show (the latest ones): drawing them costs time per
# reserve shown, so a long session would slow every change; a shared report shows them all
HISTORY_SHOWN = 100


class FigurePanel:
    """The timeline, buffer, split-map and memory-layout figures of a context's newest reserve
    (with ``logged``, a llama.cpp log's buffer sizes marked on the buffer figure).

    A click on a node (split map) or a tensor (memory layout) calls ``on_pick`` with what the
    point names: a node index, a tensor name or ``"split:K"``."""

    def __init__(self, groupings: Sequence[Collapse], width: int, on_pick: Callable[[int | str], object],
                 logged: Sequence[LoggedBuffer] = ()) -> None:
        self.width = width
        self.logged = tuple(logged)   # a llama.cpp log's buffer sizes: reference marks, the same on every draw
        self.on_pick = on_pick
        self.figures: dict[str, go.FigureWidget] = {name: go.FigureWidget() for name in FIGURES}
        for name, fw in self.figures.items():
            fw.add_class(f"toolkit-fig-{name}")
        self.collapse = W.ToggleButtons(options=[g for g in COLLAPSES if g in groupings], value=groupings[0],
                                        description="split map by", style=STYLE)
        self.plan: Plan | None = None
        self._drawn: tuple[int, int] | None = None
        self._plan_drawn: tuple[Any, ...] | None = None

    def draw(self, owner: object, events: Sequence[ReserveEvent], compile_events: Sequence[CompileEvent],
             force: bool = False) -> bool:
        """Redraw from ``owner``'s (a context's) events; False when they are what is drawn already."""
        key = (id(owner), len(events))
        if not force and key == self._drawn:
            return False
        self._drawn = key
        plan = next((e.plan for e in reversed(events) if e.plan is not None), None)
        collapse: Collapse = self.collapse.value
        w = self.width
        replace_figure(self.figures["timeline"], figures.timeline(list(events), list(compile_events),
                                                                 last=HISTORY_SHOWN), w)
        replace_figure(self.figures["buffers"], figures.buffer_sizes(list(events), self.logged, last=HISTORY_SHOWN), w)
        self.plan = plan
        # the same placements and allocations draw the same split map and layout (a reuse that only
        # moved max_nodes, a CPU-only op offload toggle): compare the plans (frozen data, < 1 ms on
        # 1,000 nodes) and leave both figures alone
        plan_key = (plan, collapse, w)
        if force or plan_key != self._plan_drawn:
            self._plan_drawn = plan_key
            replace_figure(self.figures["split_map"], figures.split_map(plan, collapse, width=w), w)
            replace_figure(self.figures["memory_layout"], figures.memory_layout(plan), w)
            for name in ("split_map", "memory_layout"):
                for trace in self.figures[name].data:
                    trace.on_click(self._on_click)
        return True

    def _on_click(self, trace: Any, points: Any, _state: Any = None) -> None:
        """A plotly click: each clickable trace carries, per point, the node index or tensor name."""
        cd = trace.customdata
        if not points.point_inds or cd is None:
            return
        target = cd[points.point_inds[0]]
        if isinstance(target, (list, tuple)):
            target = target[0]
        self.on_pick(target)


class InspectPanel:
    """One node (or split, or planned tensor) of a plan explained: what a click shows."""

    def __init__(self) -> None:
        self.html = W.HTML("<i>click a node in the split map or a tensor in the memory layout</i>"
                           ).add_class("toolkit-inspect")
        self.inspected: NodeExplanation | None = None

    def explain(self, plan: Plan, node: int | str) -> NodeExplanation | None:
        """A split input copy (``CUDA0#x#0``) or a graph input planned by the allocator that is not
        a node is shown with its allocation and the nodes that read it; ``"split:K"`` shows split
        K's inputs and their copies."""
        self.inspected = None
        try:
            if isinstance(node, str) and node.startswith("split:") and node[6:].isdigit():
                self.html.value = split_html(plan, int(node[6:]))
                return None
            if isinstance(node, str) and not any(n.name == node for n in plan.nodes):
                self.html.value = tensor_html(plan, node)
                return None
            e = explain(plan, node if isinstance(node, str) else int(node))   # plotly may hand numpy numbers
        except ValueError as err:
            self.html.value = f"<span class='toolkit-inspect-error'>{html.escape(str(err))}</span>"
            return None
        self.inspected = e
        self.html.value = explanation_html(e)
        return e


class ComparePanel:
    """Any two reserves as a diff; by default the previous and the newest one, until a pick is made."""

    def __init__(self) -> None:
        self.toggle = W.ToggleButton(value=False, description="compare reserves", icon="columns",
                                     layout=W.Layout(width="190px")).add_class("toolkit-compare-toggle")
        self.a = W.Dropdown(description="from", style=STYLE, layout=W.Layout(width="340px")
                            ).add_class("toolkit-compare-a")
        self.b = W.Dropdown(description="to", style=STYLE, layout=W.Layout(width="340px")
                            ).add_class("toolkit-compare-b")
        self.html = W.HTML().add_class("toolkit-compare")
        self.box = W.VBox([W.HBox([self.a, self.b]), self.html],
                          layout=W.Layout(display="none")).add_class("toolkit-compare-box")
        self.diff: EventDiff | None = None
        self.events: Sequence[ReserveEvent] = ()
        self._follow = True
        self._syncing = False
        self.toggle.observe(self._on_toggle, names=["value"])
        self.a.observe(self._on_pick, names=["value"])
        self.b.observe(self._on_pick, names=["value"])

    def _on_toggle(self, change: dict[str, Any]) -> None:
        self.box.layout.display = "flex" if change["new"] else "none"
        self.draw(self.events)

    def _on_pick(self, _change: dict[str, Any]) -> None:
        if self._syncing:
            return
        self._follow = False
        self.draw(self.events)

    def open(self, events: Sequence[ReserveEvent], a: int | None = None, b: int | None = None) -> EventDiff | None:
        """Show events ``a`` and ``b`` (indices; None: previous and newest)."""
        if a is not None or b is not None:
            self._follow = False
            self._syncing = True
            try:
                if a is not None:
                    self.a.value = a
                if b is not None:
                    self.b.value = b
            finally:
                self._syncing = False
        self.events = events
        self.toggle.value = True
        self.draw(events)
        return self.diff

    def draw(self, events: Sequence[ReserveEvent]) -> None:
        self.events = events
        options = [(f"#{e.index} {e.decision} · {e.trigger}"[:80], e.index) for e in events]
        self._syncing = True
        try:
            if [o[1] for o in self.a.options] != [o[1] for o in options]:
                keep = (self.a.value, self.b.value)
                self.a.options = options
                self.b.options = options
                if not self._follow:
                    self.a.value, self.b.value = keep
            pair = default_pair(list(events))
            if self._follow and pair is not None:
                self.a.value = events[pair[0]].index
                self.b.value = events[pair[1]].index
        finally:
            self._syncing = False
        self.diff = None
        if not self.toggle.value:
            return                          # hidden: nothing to draw
        by_index = {e.index: e for e in events}
        ea, eb = by_index.get(self.a.value), by_index.get(self.b.value)
        if ea is None or eb is None:
            self.html.value = "<i>the compare view needs two reserves</i>"
            return
        self.diff = compare(ea, eb, list(events))
        self.html.value = diff_html(self.diff)


class FitArea:
    """Fit to budget (:class:`toolkit.ui.fitpanel.FitPanel`) for the model of ``current()``, built when opened;
    hidden for a context without a llama model."""

    def __init__(self, current: Callable[[], ContextSettings], width: int) -> None:
        self.current = current
        self.width = width
        self.toggle = W.ToggleButton(value=False, description="fit to budget", icon="compress",
                                     layout=W.Layout(width="190px")).add_class("toolkit-fit-toggle")
        self.box = W.VBox([], layout=W.Layout(display="none")).add_class("toolkit-fit-box")
        self.panel: FitPanel | None = None
        self.toggle.observe(self._on_toggle, names=["value"])
        if current().model is None:
            self.toggle.layout.display = "none"

    def _on_toggle(self, change: dict[str, Any]) -> None:
        if change["new"]:
            self.open()
        self.box.layout.display = "flex" if change["new"] else "none"

    def open(self) -> FitPanel:
        if self.panel is None:
            from toolkit.ui.fitpanel import FitPanel, flags_of

            s = self.current()
            if s.model is None:
                raise ParameterError("fit", s.title, "a context with a llama model (a traced graph has none to fit)")
            try:   # a 24G budget per simulated or CUDA-like device of the picker spec
                spec = parse_devices(str(s.control("devices").value))
                kind, n = (spec.kind, spec.count) if spec.kind in ("sim", "cuda") else ("sim", 1)
            except ParameterError:   # devices no picker spec describes (mixed kinds): one to start from
                kind, n = "sim", 1
            self.panel = FitPanel(self._model, budgets=",".join(["24G"] * n), kind=kind,
                                  flags=flags_of(s.model.cparams), fig_width=self.width)
            self.box.children = (self.panel.widget,)
        self.toggle.value = True
        return self.panel

    def _model(self) -> tuple[HParams, str | None]:
        model = self.current().model
        if model is None:
            raise ParameterError("fit", self.current().title, "a context with a llama model")
        return model.hparams, preset_of(model.hparams)


def parse_tokens(text: str, n_vocab: int | None) -> list[int]:
    """The tokens box: token ids separated by commas or spaces, each below ``n_vocab``."""
    accepted = "token ids" + (f" in 0..{n_vocab - 1}" if n_vocab else " >= 0") + " separated by commas or spaces"
    try:
        tokens = [int(t) for t in str(text).replace(",", " ").split()]
    except ValueError:
        raise ParameterError("tokens", text, accepted) from None
    if not tokens or any(t < 0 or (n_vocab is not None and t >= n_vocab) for t in tokens):
        raise ParameterError("tokens", text, accepted)
    return tokens


def parse_prompt(text: str, n_vocab: int | None, has_vocab: bool) -> list[int] | str:
    """The tokens box of a run: token ids (:func:`parse_tokens`), or, for a context made from a GGUF
    file (``has_vocab``), a text that is not a list of ids, for the file's own tokenizer."""
    try:
        return parse_tokens(text, n_vocab)
    except ParameterError:
        words = str(text).replace(",", " ").split()
        if has_vocab and words and not all(w.lstrip("-").isdigit() for w in words):
            return str(text)
        raise


class RuntimePanel:
    """The runtime row: what the context's :class:`~toolkit.view.Runtime` offers, and what it said."""

    def __init__(self) -> None:
        self.tokens = W.Text(value="1, 2, 3", description="tokens", style=STYLE,
                             tooltip="token ids, or a text when the context was made from a GGUF file",
                             layout=W.Layout(width="220px")).add_class("toolkit-tokens")
        self.compile_button = W.Button(description="compile", icon="cogs").add_class("toolkit-compile")
        self.run_button = W.Button(description="run prompt", icon="play").add_class("toolkit-run")
        self.html = W.HTML("JAX runtime: not started").add_class("toolkit-runtime")
        self.last_run: Mapping[str, Any] | None = None   # the last traced run's report

    def row(self, settings: ContextSettings) -> W.HBox:
        rt = settings.runtime
        if rt.run is not None:
            self.run_button.description = "run vs jax.jit"
            self.html.value = f"{html.escape(settings.title)}: not run yet"
            return W.HBox([self.run_button])
        return W.HBox([self.tokens, self.compile_button, self.run_button] if rt.jax else [])

    def act(self, what: str, settings: ContextSettings, ctx: object) -> bool:
        """compile: every split of the current scheduler for its device; run: decode the tokens, or
        the traced function against jax.jit. True when the context may have recorded an event."""
        rt = settings.runtime
        if rt.run is not None:
            self._run(settings.title, rt.run)
            return False
        try:
            if not rt.jax:
                raise ParameterError(what, settings.title, "a context the JAX runtime runs")
            t0 = time.perf_counter()
            from toolkit.jaxrt import runtime  # jax loads here
            runnable = cast("RunnableContext", ctx)   # what Runtime.jax says the context is
            if what == "compile":
                # compile_splits records a CompileEvent (the timeline's hover shows it)
                info = runtime.compile_splits(runnable)
                out = (f"{info['compiled']} split(s) compiled, {info['cache_hits']} cache hit(s), "
                       f"XLA {info['compile_ms']:.1f} ms")
            else:
                n_vocab = settings.model.hparams.n_vocab if settings.model is not None else None
                has_vocab = getattr(ctx, "gguf_path", None) is not None
                prompt = parse_prompt(self.tokens.value, n_vocab, has_vocab)
                vocab = None
                if has_vocab:
                    try:
                        vocab = runtime.vocab_of(runnable)
                    except ToolkitError:   # a tokenizer not ported: ids still run, shown as ids
                        if isinstance(prompt, str):
                            raise
                # a prompt, not a continuation: the cache starts empty (llama_memory_clear) at each run
                runtime.runtime_of(runnable).clear()
                if vocab is not None:
                    ids = runtime.prompt_ids(runnable, prompt)
                    logits = runtime.decode(runnable, ids, last_only=True)
                    ms = (time.perf_counter() - t0) * 1000
                    self.html.value = _prompt_result(ms, prompt, ids, logits, vocab)
                    return True
                out = _summary(runtime.decode(runnable, prompt))
            ms = (time.perf_counter() - t0) * 1000
            self.html.value = f"{what} took {ms:.1f} ms: {html.escape(out)}"
        except Exception as e:
            self.html.value = _failed(what, e)
        return True

    def _run(self, title: str, run: Callable[[], Mapping[str, Any]]) -> None:
        """Execute the traced function split by split with the current scheduler; compare with jax.jit."""
        try:
            r = run()
            self.last_run = r
            copies = f"{r['copies']} cop{'y' if r['copies'] == 1 else 'ies'}"
            out = (f"{r['ran_splits']} split(s) on {', '.join(r['devices'])}, {copies} between devices, "
                   f"{r['run_ms']:.1f} ms; max |diff| vs jax.jit = {r['max_abs_diff']:.3g}")
            self.html.value = (f"<span class='toolkit-run-result' data-max-abs-diff='{r['max_abs_diff']}'>"
                               f"run {html.escape(title)}: {html.escape(out)}</span>")
        except Exception as e:
            self.html.value = _failed("run", e)


def _failed(what: str, e: Exception) -> str:
    return f"<span style='color:#D55E00'>{what} failed: {html.escape(f'{type(e).__name__}: {e}')}</span>"


def _prompt_result(ms: float, prompt: str | list[int], ids: list[int], logits: object, vocab: Vocab) -> str:
    """A run of a GGUF context: the prompt's token ids (the text's, as the file's tokenizer gives them)
    and the five most likely next tokens as text, in a span whose data attributes hold the ids."""
    top = top_tokens(np.asarray(logits).ravel().tolist(), 5, vocab)
    said = f"{prompt!r} → " if isinstance(prompt, str) else ""
    nxt = ", ".join(f"{p!r} ({i})" for i, _, p in top)
    text = f"run took {ms:.1f} ms: {said}{len(ids)} tokens {ids}; next: {nxt}"
    return (f"<span class='toolkit-prompt-result' data-tokens='{json.dumps(ids)}' "
            f"data-top='{json.dumps([i for i, _, _ in top])}'>{html.escape(text)}</span>")


def _summary(out: object) -> str:
    arr = np.asarray(out)
    if arr.ndim == 0 or arr.size == 0:
        return f"shape {arr.shape}" if arr.ndim else str(out)[:300]
    return f"shape {arr.shape}, argmax of last row {int(arr.reshape(-1, arr.shape[-1])[-1].argmax())}"


def replace_figure(fw: go.FigureWidget, fig: go.Figure, width: int | None = None) -> None:
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


__all__ = ["ComparePanel", "FigurePanel", "FitArea", "InspectPanel", "RuntimePanel", "parse_prompt", "parse_tokens",
           "replace_figure"]
