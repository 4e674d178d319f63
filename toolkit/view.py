"""What a context offers the dashboard: one typed, frozen view of any context.

:class:`toolkit.context.Context` and :class:`toolkit.trace.session.TracedContext` each answer
``settings()`` with a :class:`ContextSettings`: the controls the context offers (each with its
current value, the values worth offering and the ``update(**{keyword: value})`` keyword it maps
to), the groupings its split map can show, the model it plans (a llama model's name, layers and
parameters, or none for a traced graph) and the JAX runtime's entry points. The dashboard builds
its widgets from this record alone and never asks which kind of context it holds.

>>> s = ContextSettings("f", scheduler_controls(None, "max(1024, 2·(nodes+leafs))", False, True), ("split",))
>>> [(c.name, c.value, c.keyword) for c in s.controls]
[('max_nodes', None, 'max_nodes'), ('parallel', False, 'parallel'), ('op_offload', True, 'op_offload')]
>>> s.control("parallel").kind, s.model is None
('flag', True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from toolkit.errors import ParameterError

if TYPE_CHECKING:
    from toolkit.models import ContextParams, HParams

# how the split map groups a plan's nodes: runs of one layer, of one split, or node by node
Collapse = Literal["layer", "split", "none"]
COLLAPSES: tuple[Collapse, ...] = ("layer", "split", "none")

# what a control's value is (and so which widget shows it):
#   optional_count  an integer > 0, or None for the context's own rule (described by ``auto``)
#   flag            a bool
#   size            an integer, offered as the powers of two in lo..hi (and the current value)
#   count           an integer in lo..hi; at hi it means ``every`` (n_gpu_layers: every layer)
#   choice          one of ``options``
#   devices         a device picker spec (toolkit.models.devices: cpu, rpc:N, sim:N, cuda:N)
#   budget          the compute memory budget per device in MiB, None for none (with ``devices``,
#                   one ``devices=`` change: the picker spec's cparams_devices)
#   placement       where a traced function's parameters live (toolkit.trace.placement)
ControlKind = Literal["optional_count", "flag", "size", "count", "choice", "devices", "budget", "placement"]


@dataclass(frozen=True)
class Control:
    """One setting a context offers: ``ctx.update(**{keyword: value})`` changes it.

    ``carry``: a context built for another model (the model picker) is given this value."""

    name: str
    kind: ControlKind
    value: Any
    keyword: str
    lo: int = 0
    hi: int = 0
    options: tuple[str, ...] = ()
    auto: str = ""               # optional_count: how the context picks the value when none is given
    every: int | None = None     # count: what ``hi`` stands for on any model (a new context is given it)
    carry: bool = False


@dataclass(frozen=True)
class ModelSettings:
    """The llama model a context plans: its name and layers, and what the fit-to-budget panel reads."""

    name: str
    n_layer: int
    hparams: HParams
    cparams: ContextParams
    gguf_path: str | None = None   # the GGUF file the model was read from (None: a preset or a dict)


@dataclass(frozen=True)
class Runtime:
    """What a context can run (jax loads on the first call).

    ``jax``: the context is a :class:`~toolkit.context.RunnableContext` that the JAX runtime compiles
    (``toolkit.jaxrt.compile_splits``) and decodes (``toolkit.jaxrt.decode``); ``run``: the traced
    function split by split against ``jax.jit`` (``TracedContext.run``); neither: nothing to run."""

    jax: bool = False
    run: Callable[[], Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class ContextSettings:
    """Everything the dashboard shows of a context besides its events.

    ``title``: the model's or the traced function's name; ``groupings``: the split map's
    groupings that mean something for this graph, the one it opens with first; ``model``: the
    llama model (None for a traced graph, whose graph is fixed)."""

    title: str
    controls: tuple[Control, ...]
    groupings: tuple[Collapse, ...]
    model: ModelSettings | None = None
    runtime: Runtime = Runtime()

    def __post_init__(self) -> None:
        names = [c.name for c in self.controls]
        if len(set(names)) != len(names):
            raise ParameterError("controls", names, "one control per name")
        if not self.groupings or not set(self.groupings) <= set(COLLAPSES):
            raise ParameterError("groupings", self.groupings, f"a non-empty tuple of {', '.join(COLLAPSES)}")

    def control(self, name: str) -> Control:
        """The control called ``name``."""
        for c in self.controls:
            if c.name == name:
                return c
        raise ParameterError("control", name, f"one of {', '.join(c.name for c in self.controls)}")


def scheduler_controls(max_nodes: int | None, auto: str, parallel: bool, op_offload: bool) -> tuple[Control, ...]:
    """The scheduler's params every context offers: ``max_nodes`` (None: the context's rule, ``auto``),
    pipeline parallelism and op offload (``llama_context::sched_params``)."""
    return (Control("max_nodes", "optional_count", max_nodes, "max_nodes", auto=auto, carry=True),
            Control("parallel", "flag", parallel, "parallel"),
            Control("op_offload", "flag", op_offload, "op_offload", carry=True))


def device_controls(spec: str, budget_mib: float | None) -> tuple[Control, ...]:
    """The device picker (a picker spec and a budget per device), one ``devices=`` change."""
    return (Control("devices", "devices", spec, "devices"), Control("budget_mib", "budget", budget_mib, "devices"))


__all__ = ["COLLAPSES", "Collapse", "Control", "ControlKind", "ContextSettings", "ModelSettings", "Runtime",
           "device_controls", "scheduler_controls"]
