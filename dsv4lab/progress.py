"""Progress that survives a report: live in JupyterLab and under papermill, plain text lines in scripts.

tqdm's notebook bars are widgets: their state is lost in a saved notebook and in HTML, and showing them
needs a widget manager from a CDN. Here a progress line is an ordinary display output updated in place
(``display_id``): JupyterLab redraws it live, papermill's client applies the same updates to the saved
notebook, so the notebook and its report keep the *final* state — in red when the server crashed — with
a plain-text twin beside the HTML, and need nothing to show it. In scripts (no kernel) it prints one
plain line per change of status to stderr instead. ``DSV4LAB_PROGRESS=html|text|off`` overrides.

Updates are throttled. They may come from any thread, but only the thread that created the progress (the
caller's, the one whose cell is running) draws: a worker's update is drawn at the owner's next
:meth:`Progress.tick`, so output cannot land in another cell.
"""

from __future__ import annotations

import html
import os
import sys
import threading
import time
import uuid
from typing import Any, Literal, TextIO

__all__ = ["Progress", "State", "progress_mode"]

#: How a progress line ends (or that it has not yet): its colour and symbol.
State = Literal["running", "ok", "warn", "fail"]
Mode = Literal["html", "text", "off"]

_COLOURS: dict[str, str] = {"running": "#0969da", "ok": "#1a7f37", "warn": "#9a6700", "fail": "#cf222e"}
_SYMBOLS: dict[str, str] = {"running": "…", "ok": "✓", "warn": "!", "fail": "✗"}

#: Least time between two in-place redraws (a redraw is a message to the front end).
_MIN_REDRAW_S = 0.25
#: Least time between two text lines that only move the fraction (status changes always print).
_MIN_TEXT_TICK_S = 10.0


def progress_mode() -> Mode:
    """``DSV4LAB_PROGRESS`` (html/text/off) if set, else html inside a Jupyter kernel, else text."""
    forced = os.environ.get("DSV4LAB_PROGRESS", "").strip().lower()
    if forced in ("html", "text", "off"):
        return forced  # type: ignore[return-value]
    if _in_kernel():
        return "html"
    return "text"


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with ipykernel, a dependency
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


class Progress:
    """One status line for a long call: ``update()`` while it runs, ``finish()`` with its outcome."""

    def __init__(
        self, title: str, *, enabled: bool = True, stream: TextIO | None = None, started: float | None = None
    ) -> None:
        """``started`` (a ``time.monotonic()`` value) counts the shown time from an earlier moment: a
        watch that begins after its launch shows the time since the launch, like its verdict."""
        self.title = title
        self.mode: Mode = progress_mode() if enabled else "off"
        self._stream = stream
        self._start = time.monotonic() if started is None else started
        self._status = "starting"
        self._state: State = "running"
        self._fraction: float | None = None
        self._detail = ""
        self._display_id = f"dsv4lab-{uuid.uuid4().hex}"
        self._shown = False
        self._last_draw = 0.0
        self._last_text = ("", 0.0)
        self._closed = False
        self._owner = threading.get_ident()
        self._dirty = False
        self._forced = False
        #: What the call this line reports on has made so far (finished runs of a sweep or an A/B), kept here
        #: as it is made so that a Stop hands it back even when the cancelled work is slow to wind down.
        self.kept: Any = None

    # -- public ------------------------------------------------------------------------------------------

    def update(self, status: str | None = None, *, fraction: float | None = None, detail: str | None = None) -> None:
        """Change the status text, the done fraction (0..1) or the detail; redrawn when it is worth it."""
        changed = status is not None and status != self._status
        if status is not None:
            self._status = status
        if fraction is not None:
            self._fraction = max(0.0, min(1.0, fraction))
        if detail is not None:
            self._detail = detail
        self._emit(force=changed)

    def finish(self, status: str, state: State = "ok", *, detail: str | None = None) -> None:
        """The final state: drawn once more whatever the throttle says, then the line is closed."""
        if self._closed:
            return
        self._status, self._state = status, state
        if detail is not None:
            self._detail = detail
        if state == "ok" and self._fraction is not None:
            self._fraction = 1.0
        self._emit(force=True)
        self._closed = True
        if threading.get_ident() != self._owner:
            self._dirty = True  # the owner's next tick() draws the final state

    def tick(self) -> None:
        """Draw what other threads changed since the last draw (call it from the owner thread)."""
        if self._dirty and threading.get_ident() == self._owner:
            self._dirty = False
            self._emit(force=False, pending=True)

    @property
    def state(self) -> State:
        return self._state

    @property
    def status(self) -> str:
        return self._status

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._start

    # -- drawing -----------------------------------------------------------------------------------------

    def _text(self) -> str:
        parts = [f"{self.title}: {_SYMBOLS[self._state]} {self._status}"]
        if self._fraction is not None:
            parts.append(f"{self._fraction:.0%}")
        if self._detail:
            parts.append(self._detail)
        parts.append(f"{self.elapsed_s:.1f} s wall clock")
        return " | ".join(parts)

    def _html(self) -> str:
        colour = _COLOURS[self._state]
        bar = ""
        if self._fraction is not None:
            width = f"{self._fraction * 100:.1f}%"
            bar = (
                "<span style='display:inline-block;width:8em;height:0.7em;background:#eaeef2;"
                "border-radius:3px;vertical-align:middle;margin:0 0.5em'>"
                f"<span style='display:block;width:{width};height:100%;background:{colour};"
                "border-radius:3px'></span></span>"
            )
        detail = f" <span style='color:#57606a'>{html.escape(self._detail)}</span>" if self._detail else ""
        return (
            "<div style='text-align:left;font-family:system-ui,sans-serif;font-size:0.9em'>"
            f"<b>{html.escape(self.title)}</b> "
            f"<span style='color:{colour};font-weight:600'>{_SYMBOLS[self._state]} {html.escape(self._status)}</span>"
            f"{bar}{detail} <span style='color:#57606a'>{self.elapsed_s:.1f} s wall clock</span></div>"
        )

    def _emit(self, *, force: bool, pending: bool = False) -> None:
        if self.mode == "off" or (self._closed and not pending):
            return
        if threading.get_ident() != self._owner:
            self._dirty = True
            self._forced = self._forced or force
            return
        force, self._forced = force or self._forced, False
        now = time.monotonic()
        if self.mode == "html":
            if not force and now - self._last_draw < _MIN_REDRAW_S:
                return
            self._last_draw = now
            self._draw_html()
            return
        status_text = f"{self._state}:{self._status}"
        last_status, last_at = self._last_text
        if not force and status_text == last_status and now - last_at < _MIN_TEXT_TICK_S:
            return
        self._last_text = (status_text, now)
        # In a kernel (papermill) the lines belong in the notebook's output; in a script on stderr, so that
        # stdout stays clean for --json.
        stream = self._stream or (sys.stdout if _in_kernel() else sys.stderr)
        print(self._text(), file=stream, flush=True)

    def _draw_html(self) -> None:
        from IPython.display import display, update_display

        bundle: dict[str, Any] = {"text/html": self._html(), "text/plain": self._text()}
        if not self._shown:
            display(bundle, raw=True, display_id=self._display_id)  # type: ignore[no-untyped-call]
            self._shown = True
        else:
            update_display(bundle, raw=True, display_id=self._display_id)  # type: ignore[no-untyped-call]
