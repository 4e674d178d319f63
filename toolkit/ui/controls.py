"""The dashboard's control table: a context's :class:`~toolkit.view.Control` records as widgets, and back.

Each control kind (``toolkit.view.ControlKind``) has one widget and one conversion each way: a
context's value becomes what the widget shows (``max_nodes=None`` → ``"auto"``), and what the user
typed becomes the ``ctx.update`` keyword's value (``"512"`` → 512; the device picker and the
budget become one ``devices=`` change). A context with a llama model also gets the model
pickers, whose change builds a new context. Nothing here knows which kind of context it serves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import ipywidgets as W
import traitlets

from toolkit.errors import ParameterError
from toolkit.ui.choices import (
    MODEL_PRESETS,
    describe_placement,
    parse_devices,
    parse_placement,
    preset_label,
    preset_of,
)
from toolkit.view import ContextSettings, Control, ModelSettings

# the model pickers: a change builds a new context (the model is fixed at construction)
MODEL_PICKERS = ("model", "gguf")
# how the controls are laid out, row by row (a control no row names goes in a last row)
ROWS = (("model", "gguf", "devices", "budget_mib", "placement"), ("max_nodes", "parallel", "op_offload"),
        ("n_ctx", "n_batch", "n_ubatch"), ("flash_attn", "n_gpu_layers", "n_cpu_moe"))
LABELS = {"parallel": "pipeline parallelism", "op_offload": "op offload", "flash_attn": "flash attention",
          "budget_mib": "budget MiB (0 = none)", "n_cpu_moe": "n_cpu_moe (expert layers on CPU)"}
POW2 = tuple(2 ** k for k in range(0, 18))
STYLE = {"description_width": "initial"}


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


def size_stops(lo: int, hi: int, current: int) -> list[int]:
    """A size slider's stops: the powers of two in lo..hi, and the current value."""
    return sorted({v for v in POW2 if lo <= v <= hi} | {int(current)})


def parse_max_nodes(value: str) -> int | None:
    """``auto`` (the context's own rule, llama.cpp's ``llama_context::graph_max_nodes``) -> None;
    otherwise a positive integer."""
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


def shown(c: Control) -> Any:
    """What the widget of control ``c`` shows for its value."""
    if c.kind == "optional_count":
        return "auto" if c.value is None else str(c.value)
    if c.kind == "count":
        return min(int(c.value), c.hi)
    if c.kind == "budget":
        return c.value or 0
    if c.kind == "placement":
        return describe_placement(c.value)
    return c.value


def _widget(c: Control) -> W.Widget:
    label = LABELS.get(c.name, c.name)
    value = shown(c)
    if c.kind == "optional_count":
        return W.Text(value=value, description=label, continuous_update=False, style=STYLE,
                      placeholder="auto or a number", layout=W.Layout(width="200px"), tooltip=f"auto = {c.auto}")
    if c.kind == "flag":
        return W.Checkbox(value=bool(value), description=label, indent=False)
    if c.kind == "size":
        return _SizeSlider(options=size_stops(c.lo, c.hi, value), value=int(value), description=label, style=STYLE)
    if c.kind == "count":
        return W.IntSlider(value=value, min=c.lo, max=c.hi, description=label, style=STYLE)
    if c.kind == "choice":
        return W.Dropdown(options=list(c.options), value=value, description=label, style=STYLE)
    if c.kind == "devices":
        return W.Text(value=value, description=label, placeholder="cpu | rpc:N | sim:N", continuous_update=False,
                      style=STYLE, layout=W.Layout(width="200px"))
    if c.kind == "budget":
        return W.BoundedFloatText(value=value, min=0, max=1 << 30, step=64, description=label, style=STYLE,
                                  layout=W.Layout(width="220px"))
    return W.Text(value=value, description=label, placeholder="0 | -1 | fc1.*:0, fc2.*:1", continuous_update=False,
                  style=STYLE, layout=W.Layout(width="320px"),
                  tooltip="parameter path or glob -> backend index (-1 = CPU)")


def model_label(model: ModelSettings) -> str:
    """The model as the pickers name it: the GGUF path, else the preset whose shape it has, else its name."""
    return model.gguf_path or preset_of(model.hparams) or model.name


def _model_pickers(model: ModelSettings) -> dict[str, W.Widget]:
    return {"model": W.Dropdown(options=list(MODEL_PRESETS), description="model", style=STYLE,
                                value=preset_label(model_label(model))),
            "gguf": W.Text(value=model.gguf_path or "", placeholder="or a .gguf path", continuous_update=False,
                           layout=W.Layout(width="220px"))}


class ControlTable:
    """The widgets of one context's controls (``widgets``, by control name), what they mean as
    ``ctx.update`` keywords, and the values the context last accepted (shown again on a refusal).

    ``on_change(name, value)`` is called for every change a user makes (not for :meth:`show`)."""

    def __init__(self, settings: ContextSettings, on_change: Callable[[str, Any], None]) -> None:
        self.records = {c.name: c for c in settings.controls}
        self.widgets: dict[str, W.Widget] = _model_pickers(settings.model) if settings.model is not None else {}
        self.widgets.update({c.name: _widget(c) for c in settings.controls})
        self._on_change = on_change
        self._quiet = False
        for name, w in self.widgets.items():
            w.add_class(f"toolkit-control-{name}")
            w.observe(partial(self._observed, name), names=["value"])
        self.accept()

    def _observed(self, name: str, change: dict[str, Any]) -> None:
        if not self._quiet:
            self._on_change(name, change["new"])

    # ---- widgets -> ctx.update ------------------------------------------------------------------
    def picks_model(self, names: Iterable[str]) -> bool:
        """Whether a change of these controls needs a new context (a model picker moved)."""
        return any(n in MODEL_PICKERS for n in names)

    def changes(self, names: Iterable[str]) -> dict[str, Any]:
        """The ``ctx.update`` keywords (and values, from the widgets) that the named controls map to."""
        return {self.records[n].keyword: self.value_of(self.records[n].keyword) for n in names if n in self.records}

    def value_of(self, keyword: str) -> Any:
        """The value for ``ctx.update(keyword=...)`` that the widgets show now."""
        c = next(c for c in self.records.values() if c.keyword == keyword)
        v = self.widgets[c.name].value
        if c.kind in ("devices", "budget"):   # the picker spec and the budget: one devices= change
            group = {r.kind: self.widgets[r.name].value for r in self.records.values() if r.keyword == keyword}
            return parse_devices(group["devices"], float(group.get("budget", 0)) or None).cparams_devices()
        if c.kind == "optional_count":
            return parse_max_nodes(v)
        if c.kind == "placement":
            return parse_placement(v)
        if c.kind in ("size", "count"):
            return int(v)
        return bool(v) if c.kind == "flag" else v

    def carried(self) -> dict[str, Any]:
        """What a context built for another model is given (its ``carry`` controls): a count at its
        top stop passes what that stop means on any model (n_gpu_layers: every layer)."""
        out = {}
        for c in self.records.values():
            if c.carry:
                top = c.kind == "count" and c.every is not None and self.widgets[c.name].value >= c.hi
                out[c.keyword] = c.every if top else self.value_of(c.keyword)
        return out

    def model_choice(self) -> str | None:
        """The model the pickers name: the GGUF path typed, else the preset picked."""
        path = str(self.widgets["gguf"].value).strip()
        return path or MODEL_PRESETS.get(self.widgets["model"].value or "")

    # ---- the context -> widgets -----------------------------------------------------------------
    def show(self, settings: ContextSettings, kinds: Iterable[str] | None = None) -> None:
        """Show the context's values (all controls, or those of ``kinds``) without a change event:
        ranges first, then values."""
        only = None if kinds is None else set(kinds)
        self._quiet = True
        try:
            for c in settings.controls:
                if c.name not in self.widgets or (only is not None and c.kind not in only):
                    continue
                self.records[c.name] = c
                w, v = self.widgets[c.name], shown(c)
                if c.kind == "size":
                    w.options = size_stops(c.lo, c.hi, v)
                elif c.kind == "count":
                    w.max = c.hi
                w.value = v
        finally:
            self._quiet = False

    def accept(self) -> None:
        """The widgets' values are what the context runs with now."""
        self._accepted = {k: w.value for k, w in self.widgets.items()}

    def revert(self, names: Iterable[str]) -> None:
        """Put the named widgets back to what the context last accepted (no change event)."""
        self._quiet = True
        try:
            for n in names:
                self.widgets[n].value = self._accepted[n]
        finally:
            self._quiet = False

    def set(self, changes: dict[str, Any]) -> None:
        """Set widgets as a user would (each sends its change event)."""
        for k, v in changes.items():
            self.widgets[k].value = v

    def rows(self, extra: dict[int, list[W.Widget]]) -> list[W.HBox]:
        """One HBox per layout row with any of its controls (``extra``: widgets appended to row i)."""
        rows = [*ROWS, tuple(n for n in self.widgets if not any(n in r for r in ROWS))]
        return [W.HBox([self.widgets[n] for n in row if n in self.widgets] + extra.get(i, []))
                for i, row in enumerate(rows) if any(n in self.widgets for n in row)]


__all__ = ["LABELS", "MODEL_PICKERS", "ROWS", "ControlTable", "model_label", "parse_max_nodes", "shown",
           "size_stops"]
