"""toolkit: see and try how llama.cpp's backend scheduler splits, sizes and reuses.

``import toolkit`` is cheap: the JAX runtime (``toolkit.jaxrt``), the dashboard
(``toolkit.ui``) and the JAX-function tracer (``toolkit.trace(f, *args, params=...)``) load only
when used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # lazy heavy attributes: importing them pulls in jax (and plotly for the dashboard)
    if name == "trace":
        import importlib

        return importlib.import_module("toolkit.trace")  # a callable package: toolkit.trace(f, *args)
    if name == "dashboard":
        import importlib

        # toolkit.dashboard(model="tiny", ...): plotly + ipywidgets load here, not at import toolkit
        return importlib.import_module("toolkit.ui.dashboard").dashboard
    raise AttributeError(f"module 'toolkit' has no attribute {name!r}")
