"""The look every MoE Bench chart shares: the palette and the plotly layout template.

The dashboard's charts (``dashboard/charts.py``) and the HTML report (``bench/report/html.py``)
both register their template from here, so a colour or a font changes in one place.
"""

from __future__ import annotations

from typing import Any

PRIMARY = "#4F46E5"  # indigo, the theme's primary colour
COLORS: tuple[str, ...] = (
    "#4F46E5",  # indigo
    "#0EA5E9",  # sky
    "#10B981",  # emerald
    "#F59E0B",  # amber
    "#EF4444",  # red
    "#8B5CF6",  # violet
    "#EC4899",  # pink
    "#14B8A6",  # teal
)
# One colour per engine and one marker per mode, on every chart that sets runs side by side.
ENGINE_COLORS: dict[str, str] = {
    "native": "#4F46E5",  # indigo
    "vllm": "#10B981",  # emerald
    "triton": "#F59E0B",  # amber
    "lmdeploy": "#8B5CF6",  # violet
    "openai": "#0EA5E9",  # sky
}
MODE_SYMBOLS: dict[str, str] = {
    "latency": "circle",
    "concurrency": "square",
    "profile": "diamond",
    "sweep": "triangle-up",
}


def engine_color(engine: str) -> str:
    """The engine's colour (an unknown kind gets a stable one from the palette)."""
    if engine in ENGINE_COLORS:
        return ENGINE_COLORS[engine]
    return COLORS[sum(map(ord, engine)) % len(COLORS)]


P50_COLOR = "#059669"
P99_COLOR = "#DC2626"


def register_template(name: str, margin: dict[str, int], legend: dict[str, Any] | None = None) -> None:
    """Register the shared layout template as ``name`` (``margin`` and ``legend`` differ by use)."""
    import plotly.graph_objects as go
    import plotly.io as pio

    # Layout only: plotly_white's per-trace-type defaults would be deep-copied into every
    # figure (about 20 ms each) and none of our traces needs them.
    # Only the parts of plotly_white's layout our 2-D charts use: the template is copied into
    # every figure, and polar/ternary/scene/geo/colorscale defaults made that copy most of a
    # live redraw's build time (heat maps set their colorscale themselves).
    base = pio.templates["plotly_white"].layout.to_plotly_json()
    keep = ("autotypenumbers", "hovermode", "hoverlabel", "xaxis", "yaxis", "shapedefaults", "annotationdefaults")
    tpl = go.layout.Template(layout={k: base[k] for k in keep if k in base})
    tpl.layout.colorway = list(COLORS)
    tpl.layout.font = {"family": "Inter, 'Source Sans Pro', 'Segoe UI', sans-serif", "size": 13, "color": "#1F2937"}
    tpl.layout.title = {"font": {"size": 15, "color": "#111827"}, "x": 0.0, "xanchor": "left"}
    tpl.layout.margin = margin
    tpl.layout.hoverlabel = {"bgcolor": "white", "font": {"size": 12}}
    if legend is not None:
        tpl.layout.legend = legend
    tpl.layout.xaxis = {"gridcolor": "#EEF0F6", "zeroline": False, "linecolor": "#D1D5DB"}
    tpl.layout.yaxis = {"gridcolor": "#EEF0F6", "zeroline": False, "linecolor": "#D1D5DB", "rangemode": "tozero"}
    tpl.layout.paper_bgcolor = "white"
    tpl.layout.plot_bgcolor = "white"
    pio.templates[name] = tpl
