"""One look for every dsv4lab chart: colour-blind-safe colours, readable type, quiet axes.

Colours carry meaning, so they are fixed per meaning rather than per chart: a budget category, a startup
phase or a config keeps its colour wherever it appears. Semantic colours come from Okabe & Ito's palette
(distinguishable under the common colour-vision deficiencies); series without a meaning of their own
(GPU 0..7) use Paul Tol's "muted" scheme, which stays distinct for nine lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt

__all__ = [
    "BUDGET_COLORS",
    "CONFIG_COLORS",
    "FONT",
    "GPU_COLORS",
    "KIND_COLORS",
    "OKABE_ITO",
    "PHASE_COLORS",
    "THEME",
    "WIDTH",
    "config_colors",
    "register_theme",
]

#: The name the theme is registered under with Altair.
THEME = "dsv4lab"
#: A font stack every renderer has: DejaVu Sans on Linux, Helvetica or Arial elsewhere.
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
#: Default chart width in pixels.
WIDTH = 640
HEIGHT = 300

#: Okabe & Ito's colour-blind-safe palette, by name: the source of every colour that carries a meaning.
OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky": "#56B4E9",
    "green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "purple": "#CC79A7",
}
#: Paul Tol's muted scheme: nine distinct series colours.
GPU_COLORS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677", "#882255", "#AA4499")

#: One colour per memory-budget category, the same in every chart.
BUDGET_COLORS = {
    "other": "#BBBBBB",
    "weights": OKABE_ITO["blue"],
    "draft weights": OKABE_ITO["sky"],
    "KV pool": OKABE_ITO["green"],
    "buffers": OKABE_ITO["purple"],
    "graph pools": OKABE_ITO["orange"],
    "free": "#F4F4F4",
    "short": OKABE_ITO["vermillion"],
}

#: One colour per startup phase (the memory timeline's bands), matching the budget categories they fill.
PHASE_COLORS = {
    "init": "#BBBBBB",
    "weights": OKABE_ITO["blue"],
    "draft weights": OKABE_ITO["sky"],
    "KV pool": OKABE_ITO["green"],
    "draft KV pool": "#66C2A5",
    "CUDA graph capture": OKABE_ITO["orange"],
    "draft CUDA graph capture": OKABE_ITO["yellow"],
    "warmup": OKABE_ITO["purple"],
    "serving": "#8CC084",
    "crash": OKABE_ITO["vermillion"],
}

#: One colour per kernel kind in the kernel breakdown.
KIND_COLORS = {
    "attention": OKABE_ITO["vermillion"],
    "moe": OKABE_ITO["blue"],
    "gemm": OKABE_ITO["sky"],
    "allreduce": OKABE_ITO["purple"],
    "other": "#999999",
}

#: Configs in the order a campaign meets them; other names get the remaining colours.
CONFIG_COLORS = (OKABE_ITO["blue"], OKABE_ITO["orange"], OKABE_ITO["green"], OKABE_ITO["purple"], OKABE_ITO["sky"])


def config_colors(names: Sequence[str]) -> list[str]:
    """Colours for configs in the order given, so A and B keep theirs across a campaign's charts."""
    return [CONFIG_COLORS[i % len(CONFIG_COLORS)] for i in range(len(names))]


def _theme() -> dict[str, Any]:
    axis = {
        "labelFont": FONT,
        "titleFont": FONT,
        "labelFontSize": 12,
        "titleFontSize": 13,
        "titleFontWeight": "normal",
        "titleColor": "#333333",
        "labelColor": "#333333",
        "gridColor": "#E8E8E8",
        "domainColor": "#888888",
        "tickColor": "#888888",
    }
    return {
        "config": {
            "font": FONT,
            "background": "white",
            "view": {"continuousWidth": WIDTH, "continuousHeight": HEIGHT, "stroke": None},
            "title": {
                "font": FONT,
                "fontSize": 16,
                "fontWeight": "bold",
                "anchor": "start",
                "subtitleFont": FONT,
                "subtitleFontSize": 12,
                "subtitleColor": "#555555",
                "offset": 10,
            },
            "axis": axis,
            "legend": {
                "labelFont": FONT,
                "titleFont": FONT,
                "labelFontSize": 12,
                "titleFontSize": 12,
                "titleFontWeight": "normal",
                "symbolSize": 120,
                "labelLimit": 260,
            },
            "header": {"labelFont": FONT, "titleFont": FONT, "labelFontSize": 13, "titleFontSize": 13},
            "text": {"font": FONT, "fontSize": 12},
            "line": {"strokeWidth": 2},
            "range": {"category": [*list(OKABE_ITO.values())[1:], "#000000"]},
        }
    }


def register_theme() -> None:
    """Register the theme with Altair (idempotent); enabling it is left to the caller or the renderers."""
    theme_api = getattr(alt, "theme", None)
    if theme_api is not None and hasattr(theme_api, "register"):
        if THEME not in theme_api.names():
            theme_api.register(THEME, enable=False)(_theme)
    else:  # altair < 5.5
        alt.themes.register(THEME, _theme)


def theme_enabled() -> Any:
    """A context manager with the dsv4lab theme active (for rendering outside a notebook)."""
    register_theme()
    theme_api = getattr(alt, "theme", None)
    if theme_api is not None and hasattr(theme_api, "enable"):
        return theme_api.enable(THEME)
    return alt.themes.enable(THEME)
