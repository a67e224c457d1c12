"""The one small HTML vocabulary every object's ``_repr_html_`` is built from.

Results show themselves in JupyterLab and in the HTML reports nbconvert writes from executed notebooks,
so the markup must stand on its own: inline styles only (no stylesheet to load), text left-aligned
(JupyterLab centres table cells by default, which makes numbers and names hard to read), every value
escaped, and long lists folded into ``<details>`` so a 4,000-line traceback does not bury the verdict.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

__all__ = ["Raw", "State", "badge", "card", "esc", "fmt", "fold", "kv_table", "p", "pre", "raw", "table"]

#: What a badge or card says about its subject; each state has one colour everywhere.
State = Literal["ok", "warn", "fail", "info", "running"]

_COLOURS: dict[str, str] = {
    "ok": "#1a7f37",
    "warn": "#9a6700",
    "fail": "#cf222e",
    "info": "#57606a",
    "running": "#0969da",
}
_CELL = "text-align:left;padding:0.15em 0.8em 0.15em 0;vertical-align:top;border:none"
_TABLE = "border-collapse:collapse;margin:0.3em 0;font-size:0.9em"


def esc(value: object) -> str:
    """``value`` as HTML text: a log line holding ``<script>`` stays text in a report."""
    return html.escape(str(value), quote=True)


def fmt(value: object, digits: int = 2) -> str:
    """A value as a reader wants it: ``–`` for missing, thousands separators, a few significant digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if math.isinf(value):
            return "∞"
        if value != 0 and abs(value) < 10 ** (-digits):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt(v, digits) for v in value)
    return str(value)


def badge(text: str, state: State = "info") -> str:
    """A small coloured label (READY, CRASHED), styled inline so it survives nbconvert and needs no stylesheet."""
    colour = _COLOURS[state]
    return (
        f"<span style='display:inline-block;padding:0 0.45em;border-radius:0.6em;border:1px solid {colour};"
        f"color:{colour};font-weight:600;font-size:0.85em'>{esc(text)}</span>"
    )


def kv_table(pairs: Iterable[tuple[str, object]], *, digits: int = 2) -> str:
    """Two columns, name and value (values already containing markup must be passed through :func:`raw`)."""
    name_style = f"{_CELL};color:#57606a;font-weight:normal"
    rows = "".join(
        f"<tr><th style='{name_style}'>{esc(k)}</th><td style='{_CELL}'>{_cell(v, digits)}</td></tr>" for k, v in pairs
    )
    return f"<table style='{_TABLE}'>{rows}</table>"


def table(
    rows: Sequence[Mapping[str, object]], columns: Sequence[str] | None = None, *, max_rows: int = 20, digits: int = 2
) -> str:
    """Rows as a left-aligned table; rows past ``max_rows`` are folded under a "more" summary."""
    if not rows:
        return "<p><i>no rows</i></p>"
    cols = list(columns) if columns is not None else list(rows[0].keys())
    head = "".join(f"<th style='{_CELL};border-bottom:1px solid #d0d7de'>{esc(c)}</th>" for c in cols)

    def body(chunk: Sequence[Mapping[str, object]]) -> str:
        return "".join(
            "<tr>" + "".join(f"<td style='{_CELL}'>{_cell(r.get(c), digits)}</td>" for c in cols) + "</tr>"
            for r in chunk
        )

    shown = f"<table style='{_TABLE}'><thead><tr>{head}</tr></thead><tbody>{body(rows[:max_rows])}</tbody></table>"
    if len(rows) <= max_rows:
        return shown
    rest = f"<table style='{_TABLE}'><tbody>{body(rows[max_rows:])}</tbody></table>"
    return shown + _details(f"{len(rows) - max_rows} more rows", rest)


def fold(lines: Sequence[str], *, keep: int = 12, summary: str = "") -> str:
    """Lines in a ``<pre>``; beyond ``keep`` the last ``keep`` stay visible and the rest fold away."""
    if len(lines) <= keep:
        return pre(lines)
    hidden = lines[:-keep]
    label = summary or f"{len(hidden)} earlier lines"
    return _details(label, pre(hidden)) + pre(lines[-keep:])


def pre(lines: Sequence[str]) -> str:
    """Log lines as an escaped, wrapped, scrollable block, so a long excerpt does not push a card off screen."""
    text = "\n".join(esc(line) for line in lines)
    return (
        "<pre style='text-align:left;white-space:pre-wrap;font-size:0.8em;background:#f6f8fa;"
        f"padding:0.4em;margin:0.2em 0;max-height:30em;overflow:auto'>{text}</pre>"
    )


def card(title: str, body: str, *, state: State = "info", status: str = "") -> str:
    """A bordered block with a coloured title line: how every result presents itself."""
    colour = _COLOURS[state]
    head = f"<b>{esc(title)}</b>" + (f" {badge(status, state)}" if status else "")
    return (
        f"<div style='text-align:left;border-left:4px solid {colour};padding:0.3em 0.8em;margin:0.4em 0;"
        f"font-family:system-ui,sans-serif'>"
        f"<div style='margin-bottom:0.3em'>{head}</div>{body}</div>"
    )


class Raw(str):
    """Markup that :func:`kv_table` and :func:`table` insert as is (already escaped by its maker)."""


def raw(markup: str) -> Raw:
    """Mark markup this module built as safe to embed: table cells escape everything else."""
    return Raw(markup)


def _cell(value: object, digits: int) -> str:
    if isinstance(value, Raw):
        return str(value)
    return esc(fmt(value, digits))


def _details(summary: str, inner: str) -> str:
    head = f"<summary style='cursor:pointer;color:#57606a'>{esc(summary)}</summary>"
    return f"<details style='text-align:left'>{head}{inner}</details>"


def p(text: str) -> str:
    """A paragraph of plain text (escaped)."""
    return f"<p style='text-align:left;margin:0.2em 0'>{esc(text)}</p>"
