"""Fit to budget: ``common_fit_params`` (``toolkit.fit``) for one model, as a dashboard panel.

>>> from toolkit.ui.fitpanel import FitPanel
>>> panel = FitPanel("llama3_8b", budgets="24G", flags="-fa on -c 98304")   # doctest: +SKIP
>>> panel.fit().printed                                                      # doctest: +SKIP
'-c 98304 -ngl 28'

The controls are the inputs of ``llama-fit-params``: a memory budget per model device (free =
total memory of each simulated or CUDA-like device), the margin each device keeps
(``--fit-target``), the smallest context fit may shrink to (``--fit-ctx``) and further llama.cpp
flags. Every one of them goes through the one flag grammar (:func:`toolkit.args.parse_args`,
sizes through :func:`toolkit.models.devices.parse_bytes`), so the panel fits exactly what
``python -m toolkit fit`` fits for the same command line (:attr:`FitPanel.command`).

"fit" shows the printed line (``-c N -ngl N [-ts ..] [-ot ..]``), the probes of
``common_params_fit_impl`` against each device's target (:func:`toolkit.ui.figures.fit_probes`)
and, per device, llama.cpp's estimate (``llama_get_memory_breakdown`` with the pp reserve only)
next to the buffers of the full reserve sequence (:func:`toolkit.fit.real_run`). A fit that leaves
a device short of its margin shows :class:`~toolkit.fit.FitImpossible` (MiB missing per device);
a bad input shows a :class:`~toolkit.errors.ParameterError` naming the control. Both keep the
previous result on screen.
"""

from __future__ import annotations

import html
import re
import shlex
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go
import traitlets

from toolkit.args import (
    DEFAULT_FIT_CTX,
    DEFAULT_FIT_TARGET_MIB,
    LlamaArgs,
    context_flags,
    load_model_arg,
    parse_args,
)
from toolkit.errors import ParameterError, ToolkitError
from toolkit.fit import FitImpossible, FitResult, RealRun, fit_params, real_run
from toolkit.memory import MemoryRow, MiB, device_memory
from toolkit.models import presets
from toolkit.models.cparams import ContextParams
from toolkit.models.devices import MAX_DEVICES, parse_bytes
from toolkit.models.hparams import HParams
from toolkit.ui import figures, text
from toolkit.ui.choices import preset_of

FIT_KINDS = ("sim", "cuda")       # device kinds with a memory size in their string (toolkit.models.devices)
# flags the panel's own controls set: refused in the free-form flags so one value has one place
_OWN_FLAGS = {"-dev": "budgets", "--rpc": "budgets", "--device-memory": "budgets", "-fitt": "fit_target",
              "-fitc": "fit_ctx", "-m": "the panel's model", "-fit": "the fit button", "-fitp": "the fit button"}
_PLAIN_NUMBER = re.compile(r"\s*\d+(?:\.\d+)?\s*")

ModelSource = Callable[[], tuple[HParams, str | None]]


def budget_devices(budgets: str, kind: str = "sim", *, as_typed: bool = False) -> str:
    """``"24G,24G"`` (or MiB: ``"24576,24576"``) -> the ``--device`` value, each size in bytes
    (``sim:25769803776,...``), or as typed with ``as_typed`` (``sim:24G,sim:24G``; a plain number gets
    its ``M``), which reads back to the same bytes.

    Each size is read by :func:`toolkit.models.devices.parse_bytes`; a plain number is MiB here.
    Errors name the control (``budgets`` or ``kind``), the value and what is accepted."""
    accepted = (f"a memory size per device such as 24G or 24G,24G (a plain number is MiB), 1 to "
                f"{MAX_DEVICES - 1} devices")
    if kind not in FIT_KINDS:
        raise ParameterError("kind", kind, " or ".join(FIT_KINDS))
    items = [x.strip() for x in str(budgets).split(",")]
    if not budgets or not str(budgets).strip() or not all(items) or len(items) > MAX_DEVICES - 1:
        raise ParameterError("budgets", budgets, accepted)
    specs = []
    for item in items:
        size = f"{item}M" if _PLAIN_NUMBER.fullmatch(item) else item
        try:
            n = parse_bytes(size)
        except ParameterError:
            raise ParameterError("budgets", budgets, accepted, f"{item!r} is not a size") from None
        if n <= 0:
            raise ParameterError("budgets", budgets, accepted, f"{item!r} is not a positive size")
        specs.append(f"{kind}:{size if as_typed else n}")
    return ",".join(specs)


def fit_args(budgets: str, *, kind: str = "sim", fit_target: str | int = DEFAULT_FIT_TARGET_MIB,
             fit_ctx: int | str = DEFAULT_FIT_CTX, flags: str = "") -> LlamaArgs:
    """The ``llama-fit-params`` command line of the panel's controls, parsed by :func:`parse_args`.

    ``fit_target``: MiB each device keeps free (``--fit-target``, one value or one per device);
    ``fit_ctx``: the smallest context fit shrinks to (``--fit-ctx``); ``flags``: other llama.cpp
    flags (``-fa on -c 32768 -ub 1024``). A bad value raises ParameterError naming its control."""
    try:
        extra = shlex.split(str(flags))
    except ValueError as e:
        raise ParameterError("flags", flags, "llama.cpp flags such as -fa on -c 8192", str(e)) from None
    try:
        own = parse_args(extra)
    except ParameterError as e:
        raise ParameterError("flags", flags, "llama.cpp flags such as -fa on -c 8192", str(e)) from None
    taken = sorted(own.set_flags & _OWN_FLAGS.keys())
    if taken:
        raise ParameterError("flags", flags, "flags the panel's controls do not set",
                             ", ".join(f"{f} is set by {_OWN_FLAGS[f]}" for f in taken))
    devices = budget_devices(budgets, kind)
    for control, flag, value in (("fit_target", "--fit-target", fit_target), ("fit_ctx", "--fit-ctx", fit_ctx)):
        try:
            parse_args([flag, str(value).strip()])
        except ParameterError as e:
            raise ParameterError(control, value, e.accepted, str(e)) from None
    args = parse_args([*extra, "--device", devices, "--fit-target", str(fit_target).strip(),
                       "--fit-ctx", str(fit_ctx).strip()])
    n = len(devices.split(","))
    if len(args.fit_target_mib) > n:
        raise ParameterError("fit_target", fit_target, f"one value, or at most {n} (one per device)")
    return args


def flags_of(cp: ContextParams) -> str:
    """The llama.cpp flags of a context's settings that change a fit (the context size is left to fit):
    :func:`toolkit.args.context_flags` as the flags control's text."""
    return " ".join(context_flags(cp))


def _cell(row: MemoryRow) -> str:
    return (f"<td title='model {row.model:,} + context {row.context:,} + compute {row.compute:,} B'>"
            f"{row.total / MiB:.2f} MiB</td>")


def real_run_html(real: RealRun) -> str:
    """Per device: llama.cpp's estimate against the full reserve sequence (pp → tg → pp), in MiB."""
    head = ("<tr><th>device</th><th>free</th><th>target</th><th>estimate</th><th>real</th>"
            "<th>real − estimate</th><th></th></tr>")
    rows = []
    for d in real.devices:
        verdict = "keeps the margin" if d.keeps_margin else "fits, margin missed" if d.fits else "OUT OF MEMORY"
        e, r = d.estimate, d.real
        rows.append(
            f"<tr class='toolkit-fit-device' data-device='{html.escape(d.name)}' data-estimate='{e.total}' "
            f"data-real='{r.total}' data-difference='{d.difference}'>"
            f"<td>{html.escape(d.name)}</td><td>{d.free // MiB} MiB</td><td>{d.target // MiB} MiB</td>"
            f"{_cell(e)}{_cell(r)}"
            f"<td>{d.difference:+,d} B</td><td>{verdict}</td></tr>")
    notes = "".join(f"<div>{html.escape(line)}</div>" for line in real.lines() if not line.startswith(
        tuple(f"{d.name}:" for d in real.devices)))
    return (f"<table class='toolkit-fit-real'><caption>estimate (llama_get_memory_breakdown, pp reserve only) "
            f"vs real (pp → tg → pp, llama_context::sched_reserve)</caption>{head}{''.join(rows)}</table>{notes}")


class FitPanel:
    """Controls, printed line, probe figure and estimate-vs-real table for one model.

    ``model``: a HParams, a ``-m`` value (preset name, .gguf, .json) or a callable giving
    ``(hparams, name)`` at each fit (the dashboard passes its current model). The other keywords
    are the controls' initial values (see :func:`fit_args`).
    """

    def __init__(self, model: HParams | str | ModelSource, *, budgets: str = "24G", kind: str = "sim",
                 fit_target: str | int = DEFAULT_FIT_TARGET_MIB, fit_ctx: int = DEFAULT_FIT_CTX,
                 flags: str = "-fa on", name: str | None = None, fig_width: int = 900) -> None:
        if isinstance(model, str):
            hp = load_model_arg(model)
            self._source: ModelSource = lambda: (hp, model)
        elif isinstance(model, HParams):
            named = name or preset_of(model)
            self._source = lambda: (model, named)
        else:
            self._source = model
        self.fig_width = fig_width
        self.result: FitResult | None = None      # the last fit shown
        self.real: RealRun | None = None          # its real run
        self.args: LlamaArgs | None = None        # its command line
        self.refused: FitResult | None = None     # the last fit that left a device short (not shown)
        self.error: str | None = None
        self.exception: BaseException | None = None
        style = {"description_width": "initial"}
        self.controls: dict[str, W.Widget] = {
            "budgets": W.Text(value=budgets, description="budget per device", placeholder="24G,24G or MiB",
                              style=style, layout=W.Layout(width="260px")),
            "kind": W.Dropdown(options=list(FIT_KINDS), value=kind if kind in FIT_KINDS else "sim",
                               description="devices", style=style, layout=W.Layout(width="150px")),
            "fit_target": W.Text(value=str(fit_target), description="margin MiB (--fit-target)", style=style,
                                 layout=W.Layout(width="240px")),
            "fit_ctx": W.IntText(value=int(fit_ctx), description="--fit-ctx", style=style,
                                 layout=W.Layout(width="170px")),
            "flags": W.Text(value=flags, description="flags", placeholder="-fa on -c 32768", style=style,
                            layout=W.Layout(width="360px")),
        }
        for key, w in self.controls.items():
            w.add_class(f"toolkit-fit-{key}")
        self._accepted = {k: w.value for k, w in self.controls.items()}   # the shown result's inputs
        self.button = W.Button(description="fit", icon="compress", button_style="primary"
                               ).add_class("toolkit-fit-button")
        self.button.on_click(lambda _b: self.fit())
        self.line = W.HTML("<i>press fit: common_fit_params → common_params_fit_impl</i>").add_class("toolkit-fit-line")
        self.errors = W.HTML().add_class("toolkit-fit-error")
        self.figure = go.FigureWidget().add_class("toolkit-fit-probes")
        self.table = W.HTML().add_class("toolkit-fit-table")
        self.log = W.HTML().add_class("toolkit-fit-log")
        c = self.controls
        self.widget = W.VBox([
            W.HBox([c["budgets"], c["kind"], c["fit_target"], c["fit_ctx"]]), W.HBox([c["flags"], self.button]),
            self.errors, self.line, self.figure, self.table, self.log,
        ]).add_class("toolkit-fit-panel")

    # ---------------------------------------------------------------- fitting
    def inputs(self) -> LlamaArgs:
        """The controls' command line (raises ParameterError naming a bad control)."""
        c = self.controls
        return fit_args(c["budgets"].value, kind=c["kind"].value, fit_target=c["fit_target"].value,
                        fit_ctx=c["fit_ctx"].value, flags=c["flags"].value)

    def fit(self, **controls: Any) -> FitResult | None:
        """Set controls (names of ``controls``) as a user would, then fit as the button does.

        Returns the new result, or None when the fit was refused (``error``/``exception`` say why;
        the previous result stays shown)."""
        self.button.disabled, self.button.description = True, "fitting…"
        try:
            return self._fit(controls)
        finally:
            self.button.disabled, self.button.description = False, "fit"

    def _fit(self, controls: dict[str, Any]) -> FitResult | None:
        try:
            for k, v in controls.items():
                if k not in self.controls:
                    raise ParameterError("control", k, ", ".join(self.controls))
                w = self.controls[k]
                try:
                    w.value = str(v) if isinstance(w, W.Text) else v
                except traitlets.TraitError as e:     # e.g. a word for the integer --fit-ctx
                    raise ParameterError(k, v, "a value of the control's type", str(e)) from None
            args = self.inputs()
            hp, _ = self._source()
            r = fit_params(hp, args, device_memory(args))
            try:
                r.check()
            except FitImpossible:
                self.refused = r
                raise
            real = real_run(hp, args, r)
        except ToolkitError as e:   # a bad control or an impossible fit: shown, the previous result kept
            tried = ", ".join(f"{k}={w.value!r}" for k, w in self.controls.items())
            self.error, self.exception = f"{type(e).__name__}: {e}\n(fit with {tried})", e
            self._refuse()
            return None
        except Exception as e:  # a bug: the panel stays alive and says so
            self.error, self.exception = f"internal error, please report it: {type(e).__name__}: {e}", e
            self._refuse()
            return None
        self.result, self.real, self.args = r, real, args
        self._accepted = {k: w.value for k, w in self.controls.items()}
        self.error, self.exception = None, None
        self._show_error()
        self._draw()
        return r

    @property
    def printed(self) -> str:
        """The shown result's ``llama-fit-params`` line."""
        return self.result.printed if self.result is not None else ""

    @property
    def command(self) -> str:
        """``python -m toolkit fit ...`` for the controls (the model by its ``-m`` name)."""
        hp, name = self._source()
        if name and name.partition(":")[0] in presets.PRESETS:
            name = presets.spec(name, hp)     # a preset with another weight type: name:type
        c = self.controls
        devices = budget_devices(c["budgets"].value, c["kind"].value, as_typed=True)
        return (f"python -m toolkit fit -m {name or '<model>'} {c['flags'].value} --device {devices} "
                f"--fit-target {c['fit_target'].value} --fit-ctx {c['fit_ctx'].value}").replace("  ", " ")

    def _refuse(self) -> None:
        """A refused fit: the error is shown, the controls go back to the shown result's values."""
        for k, v in self._accepted.items():
            try:
                self.controls[k].value = v
            except Exception:   # noqa: S110 - a widget refusing its own previous value keeps the typed one
                pass
        self._show_error()

    # ---------------------------------------------------------------- drawing
    def _show_error(self) -> None:
        self.errors.value = ("" if self.error is None else
                             f"<pre class='toolkit-error-text' style='color:#D55E00;white-space:pre-wrap'>"
                             f"{html.escape(self.error)}\n(previous result kept)</pre>")

    def _draw(self) -> None:
        r, real = self.result, self.real
        if r is None or real is None:
            return
        unchanged = any(line.endswith("no changes needed") for line in r.log_lines)
        verdict = "fits as given: common_params_fit_impl changes nothing" if unchanged else "fits with these parameters"
        self.line.value = (f"<div>{html.escape(verdict)} ({len(r.probes)} probe(s), {r.seconds:.2f} s)</div>"
                           f"<code class='toolkit-fit-printed'>{html.escape(r.printed)}</code>"
                           f"<div style='opacity:0.7'>same as: <code>{html.escape(self.command)}</code></div>")
        fig = figures.fit_probes(r)
        fig.update_layout(width=self.fig_width)
        # a fresh widget per result: its synced state is the figure (a saved notebook shows this fit)
        old, self.figure = self.figure, go.FigureWidget(fig).add_class("toolkit-fit-probes")
        self.widget.children = tuple(self.figure if w is old else w for w in self.widget.children)
        old.close()
        self.table.value = real_run_html(real)
        log = "\n".join([text.fit_probes_text(r), "", *r.log_lines])
        self.log.value = (f"<details><summary>common_params_fit_impl log ({len(r.log_lines)} lines)</summary>"
                          f"<pre style='white-space:pre;font-size:11px'>{html.escape(log)}</pre></details>")

    def text(self) -> str:
        """The shown result as text: the printed line, the probes, the real run (and any error)."""
        out = [f"error: {self.error}"] if self.error else []
        if self.result is not None and self.real is not None:
            out += [self.result.printed, text.fit_probes_text(self.result), *self.real.lines()]
        return "\n".join(out)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"FitPanel(printed={self.printed!r}, error={self.error!r})"


__all__ = ["FIT_KINDS", "FitPanel", "budget_devices", "fit_args", "flags_of", "real_run_html"]
