"""Colours, units and the shared plotly layout of every toolkit figure.

Colours come from the Okabe–Ito palette, which stays distinguishable under the common forms of
colour blindness; decisions also get distinct marker symbols so colour is never the only cue.
Backgrounds are transparent and grid lines a mid grey at low opacity so one figure reads in
both the light and the dark JupyterLab theme.
"""

from __future__ import annotations

from typing import Any

# Okabe & Ito (2008), "Color Universal Design".
OKABE_ITO: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
    "#999999",  # grey (the palette's black replaced: black vanishes on a dark theme)
)

DECISION_COLOUR: dict[str, str] = {
    "reused": "#009E73",    # green: nothing was reallocated
    "rebuilt": "#0072B2",   # blue: a fresh scheduler
    "fallback": "#E69F00",  # orange: rebuilt again without pipeline parallelism
    "error": "#D55E00",     # vermillion: the reserve failed, previous state kept
}
DECISION_SYMBOL: dict[str, str] = {
    "reused": "circle",
    "rebuilt": "square",
    "fallback": "diamond",
    "error": "x",
}

# Buffer kinds in the buffer-size figure (the compute buffers and a reserve event's memory groups);
# fixed so a kind keeps its colour across events.
KIND_COLOUR: dict[str, str] = {
    "compute allocated": "#0072B2",
    "compute needed": "#56B4E9",
    "model": "#999999",
    "KV": "#CC79A7",
    "KV-SWA": "#D55E00",
    "RS": "#009E73",
    "output": "#F0E442",
    "sched host metadata": "#E69F00",
}

MIB = 1024 * 1024
NEUTRAL_GRID = "rgba(128,128,128,0.25)"
NEUTRAL_TEXT = "#888888"   # mid grey: readable on white and on JupyterLab's dark grey


def kind_colour(kind: str) -> str:
    """A buffer kind's colour: :data:`KIND_COLOUR`'s, else one of the palette picked by the name (the
    same in every event and every session)."""
    return KIND_COLOUR.get(kind) or OKABE_ITO[sum(map(ord, kind)) % len(OKABE_ITO)]


def backend_colour(index: int) -> str:
    """A stable colour per backend id (CPU is usually last, so it gets a distinct late colour)."""
    return OKABE_ITO[index % len(OKABE_ITO)]


def mib(nbytes: int | float) -> str:
    """``12.50 MiB``: llama.cpp logs compute buffers in MiB with two decimals."""
    return f"{nbytes / MIB:.2f} MiB"


def nbytes_exact(nbytes: int) -> str:
    """``13,107,200 B``: exact bytes for hover text."""
    return f"{int(nbytes):,} B"


def size_label(nbytes: int) -> str:
    return f"{mib(nbytes)} ({nbytes_exact(nbytes)})"


def onoff(flag: bool) -> str:
    return "on" if flag else "off"


def neutral_axis() -> dict[str, Any]:
    """An axis with the neutral grid and text: readable on JupyterLab's light and dark themes."""
    return {"gridcolor": NEUTRAL_GRID, "zerolinecolor": NEUTRAL_GRID, "linecolor": NEUTRAL_GRID,
            "tickfont": {"color": NEUTRAL_TEXT}, "title": {"font": {"color": NEUTRAL_TEXT}}}


def base_layout(title: str, height: int = 320, **extra: Any) -> dict[str, Any]:
    """Layout shared by all figures: transparent, neutral grid, theme-agnostic fonts."""
    axis = neutral_axis()
    layout: dict[str, Any] = {
        "title": {"text": title, "font": {"size": 14, "color": NEUTRAL_TEXT}, "x": 0.01},
        "height": height,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 40},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"color": NEUTRAL_TEXT, "size": 11},
        "legend": {"font": {"color": NEUTRAL_TEXT}, "bgcolor": "rgba(0,0,0,0)", "orientation": "h",
                   "y": -0.2},
        "hoverlabel": {"namelength": -1},
        "xaxis": dict(axis),
        "yaxis": dict(axis),
    }
    layout.update(extra)
    return layout
