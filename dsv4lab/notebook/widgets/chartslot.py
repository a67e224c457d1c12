"""A place in the panel where one chart is shown, redrawn off the kernel thread, the newest request winning.

Rendering an Altair chart to SVG with vl-convert takes a few hundred milliseconds to a second — ten times
the budget of one slider move. So the panel never renders on the thread that handles the slider: it asks
the slot for a chart, the slot's worker builds and renders it, and if the user moved the slider again in
the meantime only the newest request is drawn. The chart arrives as inline SVG in an HTML widget, which
needs no Vega renderer in the front end and no network, and reads the same in a screenshot.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

__all__ = ["ChartSlot"]

#: Builds the chart (an Altair chart) when the worker gets to it; may raise PlotError.
Build = Callable[[], Any]


class ChartSlot:
    """An HTML widget holding one chart as inline SVG; :meth:`request` redraws it in a worker thread."""

    def __init__(self, placeholder: str = "", *, css_class: str = "") -> None:
        self.widget = widgets.HTML(self._message(placeholder) if placeholder else "")
        if css_class:
            self.widget.add_class(css_class)
        self._lock = threading.Lock()
        self._pending: Build | None = None
        self._worker: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        #: How many charts were drawn, and how long the last one took (build + SVG), for benchmarks.
        self.drawn = 0
        self.last_render_s: float | None = None
        self.last_error: str | None = None

    def request(self, build: Build) -> None:
        """Draw the chart ``build`` returns, soon, in the background (replacing any request not yet drawn)."""
        with self._lock:
            self._pending = build
            self._idle.clear()
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="dsv4lab-chart", daemon=True)
                self._worker.start()

    def show_message(self, text: str) -> None:
        """Replace the chart with a line of text (no chart to draw yet, or why there is none)."""
        with self._lock:
            self._pending = None
        self.widget.value = self._message(text)

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until every requested chart is drawn (tests and scripts); False on timeout."""
        return self._idle.wait(timeout_s)

    @property
    def svg(self) -> str:
        return str(self.widget.value)

    def _run(self) -> None:
        from dsv4lab.plots import to_svg

        while True:
            with self._lock:
                build, self._pending = self._pending, None
                if build is None:
                    self._idle.set()
                    self._worker = None
                    return
            start = time.perf_counter()
            try:
                svg = to_svg(build())
                body = svg[svg.find("<svg") :] if "<svg" in svg else svg
                # Shrink to the column (the SVG has a viewBox, so it scales without cropping).
                body = body.replace("<svg ", "<svg style='max-width:100%;height:auto' ", 1)
                value = f"<div style='max-width:100%'>{body}</div>"
                self.last_error = None
            except Exception as exc:  # a chart that cannot be drawn says why, in its place
                self.last_error = str(exc)
                value = self._message(f"no chart: {exc}")
            with self._lock:
                stale = self._pending is not None
            if not stale:  # a newer request is waiting: do not flash an outdated chart
                self.widget.value = value
                self.drawn += 1
                self.last_render_s = time.perf_counter() - start

    @staticmethod
    def _message(text: str) -> str:
        return f"<div style='color:#57606a;font-size:0.85em;padding:0.5em 0'>{html.escape(text)}</div>"
