"""toolkit: see and try how llama.cpp's backend scheduler splits, sizes and reuses.

``import toolkit`` is cheap: the pure core (scheduler, contexts, events, errors) loads on first
use of a name, and the JAX runtime (``toolkit.jaxrt``: ``toolkit.decode(ctx, tokens)``,
``toolkit.generate(ctx, prompt_ids, n)``, ``toolkit.compile_splits(ctx)``), the dashboard
(``toolkit.dashboard``) and the JAX-function tracer (``toolkit.trace(f, *args, params=...)``) only
when used — none of jax, plotly or ipywidgets is imported by ``import toolkit``.

>>> import toolkit
>>> ctx = toolkit.Context("tiny", toolkit.ContextParams(n_ctx=256, n_gpu_layers=0))
>>> ctx.update(max_nodes=512).decision, toolkit.SchedParams(512, False, True).can_reuse(ctx.sched_params_cur)
('reused', True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolkit.version import __version__ as __version__

# public name -> the module that defines it (imported on first access, PEP 562)
_LAZY: dict[str, str] = {
    # llama_context and its parameters
    "Context": "toolkit.context",
    "ContextParams": "toolkit.models.cparams",
    "HParams": "toolkit.models.hparams",
    # the reuse layer of llama.cpp #32009: params, rule, events, protocol
    "SchedParams": "toolkit.reuse",
    "Reason": "toolkit.reuse",
    "ReserveEvent": "toolkit.reuse",
    "CompileEvent": "toolkit.reuse",
    "BufferSize": "toolkit.reuse",
    "ContextView": "toolkit.reuse",
    "SchedulerHolder": "toolkit.reuse",
    # ggml_backend_sched and its plain results
    "Scheduler": "toolkit.sched",
    "Assignment": "toolkit.sched",
    "Plan": "toolkit.sched",
    # the exceptions a user's input can cause
    "ToolkitError": "toolkit.errors",
    "ParameterError": "toolkit.errors",
    "AllocationError": "toolkit.errors",
    "GGUFError": "toolkit.errors",
    "UnsupportedFeature": "toolkit.errors",
    "LogError": "toolkit.errors",
    # a llama.cpp start-up log read back (toolkit.explain)
    "from_log": "toolkit.explain",
    # heavy: jax (running a context, trace, TracedContext), plotly + ipywidgets (dashboard)
    "decode": "toolkit.jaxrt.runtime",
    "generate": "toolkit.jaxrt.runtime",
    "compile_splits": "toolkit.jaxrt.runtime",
    "TracedContext": "toolkit.trace.session",
    "dashboard": "toolkit.ui.dashboard",
}
# toolkit.trace is a callable package: toolkit.trace(f, *args); toolkit.jaxrt the runtime (jaxrt.runtime_of(ctx))
_LAZY_MODULES = {"jaxrt": "toolkit.jaxrt", "trace": "toolkit.trace"}

__all__ = [
    "AllocationError", "Assignment", "BufferSize", "CompileEvent", "Context", "ContextParams", "ContextView",
    "GGUFError", "HParams", "LogError", "ParameterError", "Plan", "Reason", "ReserveEvent", "SchedParams", "Scheduler",
    "SchedulerHolder", "ToolkitError", "TracedContext", "UnsupportedFeature", "compile_splits", "dashboard", "decode",
    "from_log", "generate", "jaxrt", "trace",
]

if TYPE_CHECKING:  # what type checkers see; at run time __getattr__ imports on first use
    from toolkit import jaxrt, trace
    from toolkit.context import Context
    from toolkit.errors import AllocationError, GGUFError, LogError, ParameterError, ToolkitError, UnsupportedFeature
    from toolkit.explain import from_log
    from toolkit.jaxrt.runtime import compile_splits, decode, generate
    from toolkit.models.cparams import ContextParams
    from toolkit.models.hparams import HParams
    from toolkit.reuse import BufferSize, CompileEvent, ContextView, Reason, ReserveEvent, SchedParams, SchedulerHolder
    from toolkit.sched import Assignment, Plan, Scheduler
    from toolkit.trace.session import TracedContext
    from toolkit.ui.dashboard import dashboard


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
