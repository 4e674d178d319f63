"""Bring your own JAX function: jaxpr → ggml graph → scheduler plan → split-by-split run.

``toolkit.trace`` is both this package and a function: ``toolkit.trace(f, *args, params=...)``
calls :func:`toolkit.trace.api.trace`.

>>> import toolkit, jax.numpy as jnp
>>> tr = toolkit.trace(lambda x: jnp.exp(x) * 2.0, jnp.ones((2, 3)))
>>> [(t.op_desc(), t.ne) for t in tr.graph.nodes]
[('EXP', (3, 2, 1, 1)), ('MUL', (3, 2, 1, 1))]
"""

from __future__ import annotations

import sys
import types
from typing import Any

from toolkit.trace.api import Traced, trace
from toolkit.trace.checks import check_plan
from toolkit.trace.convert import TracedGraph
from toolkit.trace.errors import UnsupportedPrimitive
from toolkit.trace.execute import RunReport, SplitRun
from toolkit.trace.layout import ggml_type, ne_of
from toolkit.trace.nodes import LeafInfo, Step
from toolkit.trace.placement import path_str, resolve
from toolkit.trace.schedule import Schedule, TracedFunction, device_of
from toolkit.trace.session import TracedContext
from toolkit.trace.support import lacking, offload_batch, only, primitive_of, support_table

__all__ = [
    "LeafInfo", "RunReport", "Schedule", "SplitRun", "Step", "Traced", "TracedContext", "TracedFunction", "TracedGraph",
    "UnsupportedPrimitive",
    "check_plan", "device_of", "ggml_type", "lacking", "ne_of", "offload_batch", "only", "path_str", "primitive_of",
    "resolve", "support_table", "trace",
]


class _CallableModule(types.ModuleType):
    """Lets ``toolkit.trace(f, ...)`` work although ``toolkit.trace`` is this package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Traced:
        return trace(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
