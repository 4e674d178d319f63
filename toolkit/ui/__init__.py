"""The live dashboard and its figures (imports plotly and ipywidgets; load lazily).

>>> import toolkit
>>> dash = toolkit.dashboard(model="tiny")            # doctest: +SKIP
>>> from toolkit.ui import figures
>>> figures.buffer_sizes(dash.ctx.events)             # doctest: +SKIP

``toolkit.ui.figures`` builds each view from ReserveEvents / Plans, ``toolkit.ui.text`` gives
the same views as text, ``toolkit.ui.dashboard`` holds :class:`Dashboard` and ``dashboard()`` (composed of
the control table ``toolkit.ui.controls``, built from a context's ``settings()``, and ``toolkit.ui.panels``),
``toolkit.ui.fitpanel`` the fit-to-budget panel :class:`FitPanel` (``common_fit_params``).
"""

from __future__ import annotations

import importlib

from toolkit.ui import figures, text
from toolkit.ui.figures import badge, buffer_sizes, memory_layout, split_map, timeline

__all__ = ["Dashboard", "FitPanel", "badge", "buffer_sizes", "figures", "memory_layout", "split_map", "text",
           "timeline"]


def __getattr__(name: str) -> object:
    # ipywidgets loads only when the dashboard itself is asked for
    if name == "Dashboard":
        return importlib.import_module("toolkit.ui.dashboard").Dashboard
    if name == "FitPanel":
        return importlib.import_module("toolkit.ui.fitpanel").FitPanel
    raise AttributeError(f"module 'toolkit.ui' has no attribute {name!r}")
