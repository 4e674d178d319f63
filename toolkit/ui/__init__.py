"""The live dashboard and its figures (imports plotly and ipywidgets; load lazily).

>>> import toolkit
>>> toolkit.dashboard(model="tiny")      # doctest: +SKIP
"""

from __future__ import annotations

from toolkit.ui import figures, text
from toolkit.ui.figures import badge, buffer_sizes, memory_layout, split_map, timeline

__all__ = ["Dashboard", "badge", "buffer_sizes", "dashboard", "figures", "memory_layout", "split_map",
           "text", "timeline"]


def __getattr__(name: str) -> object:
    # ipywidgets loads only when the dashboard itself is asked for.
    if name in ("Dashboard", "dashboard"):
        from toolkit.ui import dashboard as _d

        return getattr(_d, name)
    raise AttributeError(f"module 'toolkit.ui' has no attribute {name!r}")
