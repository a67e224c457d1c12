"""The live log pane: the last lines of ``server.log``, each coloured by what the shared classifier says it is.

It is an HTML widget, not an ``Output``: the lines arrive from a worker thread, and an ``Output`` fed from a
thread with ``with out:`` captures whatever any thread prints at that moment (ipywidgets #2358, #3017);
setting an HTML value is one trait update with no capture at all, and it lets an OOM line be red and a
ready line green. The newest lines sit at the bottom and the box opens scrolled to them
(``flex-direction: column-reverse``), because redrawing would otherwise jump back to the top.
"""

from __future__ import annotations

import html
import threading
import time
from collections import deque
from collections.abc import Iterable

import ipywidgets as widgets

from dsv4lab.counts import plural
from dsv4lab.logs import LineKind, classify_line
from dsv4lab.secrets import redact_text

__all__ = ["LINE_STYLES", "LogPane"]

#: How each kind of line is drawn: fatal and OOM lines in red, warnings amber, startup phases blue.
LINE_STYLES: dict[LineKind, str] = {
    LineKind.OOM: "color:#cf222e;background:#ffebe9;font-weight:600",
    LineKind.FATAL: "color:#cf222e;background:#ffebe9",
    LineKind.WARNING: "color:#9a6700",
    LineKind.READY: "color:#1a7f37;font-weight:600",
    LineKind.SERVING: "color:#1a7f37",
    LineKind.DIST_INIT: "color:#0969da",
    LineKind.WEIGHTS: "color:#0969da",
    LineKind.KV_CACHE: "color:#0969da",
    LineKind.CUDA_GRAPH: "color:#0969da",
    LineKind.DRAFT_CUDA_GRAPH: "color:#0969da",
    LineKind.HTTP: "color:#0969da",
    LineKind.WARMUP: "color:#0969da",
}

_LEGEND = (
    "<span style='color:#cf222e'>■ fatal / OOM</span> <span style='color:#9a6700'>■ warning</span> "
    "<span style='color:#0969da'>■ startup phase</span> <span style='color:#1a7f37'>■ ready / serving</span>"
)


class LogPane:
    """The last ``max_lines`` lines of a server log, classified and highlighted; safe to feed from a thread."""

    def __init__(self, max_lines: int = 200, *, min_redraw_s: float = 0.25) -> None:
        self.max_lines = max_lines
        self.min_redraw_s = min_redraw_s
        self._lines: deque[tuple[LineKind, str]] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._dirty = False
        self._last_draw = 0.0
        self._pending: threading.Timer | None = None
        self._title = "server.log"
        self.count = 0
        self.header = widgets.HTML(self._header_html())
        self.body = widgets.HTML(self._body_html([]))
        self.body.add_class("dsv4lab-log")
        self.widget = widgets.VBox([self.header, self.body], layout=widgets.Layout(width="100%"))

    def reset(self, title: str) -> None:
        """Start over for another server's log."""
        with self._lock:
            self._lines.clear()
            self.count = 0
            self._title = title
        self.header.value = self._header_html()
        self.flush(force=True)

    def append(self, lines: Iterable[str]) -> None:
        """Add lines (classified here); drawn at most every ``min_redraw_s``."""
        added = [(classify_line(text), redact_text(text)) for text in lines]  # a pane is an output: no tokens
        if not added:
            return
        with self._lock:
            self._lines.extend(added)
            self.count += len(added)
            self._dirty = True
        self.flush()

    def flush(self, *, force: bool = False) -> None:
        """Draw what arrived since the last draw (``force``: whatever the throttle says).

        A draw the throttle holds back is made later by a timer: the last lines of a burst (a server's
        READY line, its fatal one) would otherwise stay undrawn until more lines came, and none may come."""
        now = time.monotonic()
        with self._lock:
            if not self._dirty and not force:
                return
            wait = self.min_redraw_s - (now - self._last_draw)
            if not force and wait > 0:
                if self._pending is None:
                    self._pending = threading.Timer(wait, self._deferred)
                    self._pending.daemon = True
                    self._pending.start()
                return
            snapshot = list(self._lines)
            self._dirty = False
            self._last_draw = now
        self.body.value = self._body_html(snapshot)

    def _deferred(self) -> None:
        with self._lock:
            self._pending = None
        self.flush()

    @property
    def lines(self) -> list[str]:
        with self._lock:
            return [text for _, text in self._lines]

    def kinds(self) -> list[LineKind]:
        with self._lock:
            return [kind for kind, _ in self._lines]

    def _header_html(self) -> str:
        return (
            f"<div style='font-size:0.85em;margin-top:0.4em'><b>{html.escape(self._title)}</b> "
            f"<span style='color:#57606a'>(last {plural(self.max_lines, 'line')})</span> &nbsp; {_LEGEND}</div>"
        )

    @staticmethod
    def _body_html(lines: list[tuple[LineKind, str]]) -> str:
        if not lines:
            inner = "<div style='color:#57606a'>no server yet: Launch starts one and its log streams here</div>"
        else:
            inner = "".join(
                f"<div class='dsv4lab-log-{kind.value}' style='{LINE_STYLES.get(kind, '')}'>{html.escape(text)}</div>"
                for kind, text in lines
            )
        return (
            "<div style='display:flex;flex-direction:column-reverse;height:16em;overflow:auto;background:#f6f8fa;"
            "border:1px solid #d0d7de;border-radius:4px;padding:0.3em 0.5em'>"
            "<div style='font-family:monospace;font-size:0.75em;line-height:1.35;white-space:pre-wrap;"
            f"word-break:break-all'>{inner}</div></div>"
        )
