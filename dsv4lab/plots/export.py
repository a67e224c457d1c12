"""Charts out of the notebook with no network: validated specs, inline SVG for reports, PNG for slides.

Nothing here may reach the network: vl-convert renders with ``allowed_base_urls=[]`` (so a chart that
referenced a URL would fail instead of fetching it) and every chart embeds its data. In JupyterLab,
:func:`enable_offline_renderer` emits the Vega-Lite mimetype (Lab draws it natively, interactive) *and*
an SVG, so that an HTML export of the same notebook shows the chart without any CDN script.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert as vlc

from dsv4lab.errors import PlotError
from dsv4lab.plots.theme import THEME, register_theme, theme_enabled

__all__ = [
    "alt_text",
    "display_metadata",
    "enable_offline_renderer",
    "mimebundle",
    "save_png",
    "svg_figure",
    "to_spec",
    "to_svg",
]

RENDERER = "dsv4lab"


def _vl_version() -> str | None:
    """The Vega-Lite version Altair writes, in vl-convert's spelling, when vl-convert knows it."""
    major_minor = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    try:
        known = vlc.get_vegalite_versions()
    except AttributeError:
        return None
    return major_minor if major_minor in known else None


def to_spec(chart: alt.TopLevelMixin, *, validate: bool = True) -> dict[str, Any]:
    """The Vega-Lite spec with the dsv4lab theme, checked against the schema when ``validate``."""
    with theme_enabled():
        spec: dict[str, Any] = chart.to_dict(validate=validate)
    return spec


def _spec(chart: alt.TopLevelMixin | dict[str, Any]) -> dict[str, Any]:
    return chart if isinstance(chart, dict) else to_spec(chart)


def to_svg(chart: alt.TopLevelMixin | dict[str, Any]) -> str:
    """The chart as an SVG document, rendered locally (no network), named by its title: a ``<title>`` and
    ``role="img"`` with an ``aria-label`` on the root, so an inline chart (or its file) says what it shows."""
    spec = _spec(chart)
    try:
        svg: str = vlc.vegalite_to_svg(spec, vl_version=_vl_version(), allowed_base_urls=[])
    except Exception as exc:  # vl-convert raises ValueError/RuntimeError with the Vega error text
        raise PlotError(f"the chart could not be rendered: {exc}") from exc
    return _named_svg(svg, alt_text(spec))


def alt_text(chart: alt.TopLevelMixin | dict[str, Any]) -> str:
    """What a chart shows, in words, for a reader who cannot see it: its title and subtitle (the titles
    of its parts for a compound chart without one)."""
    spec = _spec(chart)
    own = _title_words(spec.get("title"))
    if own:
        return own
    parts = [spec.get(key) for key in ("layer", "hconcat", "vconcat", "concat")]
    titles = [_title_words(sub.get("title")) for part in parts if isinstance(part, list) for sub in part]
    titles = [t for t in titles if t]
    return "; ".join(dict.fromkeys(titles)) or "A chart without a title"


def _title_words(title: Any) -> str:
    """Vega-Lite's title (a string, lines, or ``{text, subtitle}``) as one line: "title — subtitle"."""

    def line(value: Any) -> str:
        if isinstance(value, (list, tuple)):
            return " ".join(str(v).strip() for v in value if str(v).strip())
        return str(value).strip() if isinstance(value, str) else ""

    if isinstance(title, dict):
        text, subtitle = line(title.get("text")), line(title.get("subtitle"))
        return f"{text} — {subtitle}" if text and subtitle else text or subtitle
    return line(title)


def _named_svg(svg: str, name: str) -> str:
    start = svg.find("<svg")
    end = svg.find(">", start)
    if start < 0 or end < 0:
        return svg
    label = html.escape(name, quote=True)
    root = svg[start:end].replace(" role=", " data-vega-role=")  # the root's accessible role is the image
    return f'{svg[:start]}{root} role="img" aria-label="{label}"><title>{label}</title>{svg[end + 1 :]}'


def save_png(chart: alt.TopLevelMixin | dict[str, Any], path: str | Path, *, scale: float = 2.0) -> Path:
    """Write a PNG (``scale`` x the chart's pixel size, 2 for slides) and return its path."""
    try:
        png: bytes = vlc.vegalite_to_png(_spec(chart), vl_version=_vl_version(), scale=scale, allowed_base_urls=[])
    except Exception as exc:
        raise PlotError(f"the chart could not be rendered: {exc}") from exc
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    return out


def svg_figure(chart: alt.TopLevelMixin | dict[str, Any], *, caption: str | None = None) -> str:
    """An inline ``<figure>`` for an HTML report: the SVG itself, no script, no external reference."""
    svg = to_svg(chart)
    start = svg.find("<svg")
    body = svg[start:] if start >= 0 else svg
    cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
    return f'<figure class="dsv4lab-chart">{body}{cap}</figure>'


def mimebundle(chart: alt.TopLevelMixin | dict[str, Any]) -> dict[str, Any]:
    """What the offline renderer displays for ``chart``: Vega-Lite JSON, SVG and a text line."""
    data, _ = _bundle(_spec(chart))
    return data


def display_metadata(chart: alt.TopLevelMixin | dict[str, Any]) -> dict[str, Any]:
    """The display metadata that goes with :func:`mimebundle`: the images' alt text (the report's
    template writes it on the chart's ``<img>``; without it nbconvert writes "No description...")."""
    words = alt_text(chart)
    return {"image/svg+xml": {"alt": words}, "image/png": {"alt": words}}


def _bundle(spec: dict[str, Any], **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    mime = f"application/vnd.vegalite.v{alt.SCHEMA_VERSION.lstrip('v').split('.')[0]}+json"
    title = spec.get("title")
    text = title.get("text") if isinstance(title, dict) else title
    data = {
        mime: spec,
        "image/svg+xml": to_svg(spec),
        "text/plain": f"<dsv4lab chart: {text or 'untitled'}>",
    }
    return data, display_metadata(spec)


def enable_offline_renderer() -> None:
    """Make Altair display every chart as Vega-Lite JSON + SVG + text (and use the dsv4lab theme).

    JupyterLab renders the Vega-Lite (interactive, no CDN); nbconvert drops that mimetype and keeps the
    SVG, so the exported HTML is complete offline.
    """
    register_theme()
    if RENDERER not in alt.renderers.names():
        alt.renderers.register(RENDERER, _bundle)
    alt.renderers.enable(RENDERER)
    theme_api = getattr(alt, "theme", None)
    if theme_api is not None and hasattr(theme_api, "enable"):
        theme_api.enable(THEME)
    else:
        alt.themes.enable(THEME)
