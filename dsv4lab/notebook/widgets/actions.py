"""Long actions off the kernel thread, and the panes they report into.

A button's callback runs on the kernel's thread: while it runs, the kernel cannot handle the next comm
message, so a Stop click would wait for the launch it should stop (ipywidgets #642, #3468). Every action
here therefore runs in a worker thread (:class:`Jobs`, one at a time), reports through widget values set
from that thread (never ``with out:``, which captures any thread's prints), and turns every exception into
a card in the results pane rather than a traceback nobody sees. :class:`ServerMonitor` follows a launched
server's log into the log pane and redraws its GPU memory chart while it starts.
"""

from __future__ import annotations

import contextlib
import html
import threading
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets

from dsv4lab import htmlview as hv
from dsv4lab.notebook.widgets.chartslot import ChartSlot
from dsv4lab.notebook.widgets.logpane import LogPane

if TYPE_CHECKING:
    from dsv4lab.model.memory import Preflight
    from dsv4lab.notebook.server import Server

__all__ = ["STATE_COLOURS", "Jobs", "ResultsPane", "ServerMonitor", "StateBadge"]

#: Badge colour per server state (``Server.state``): red for the states that need the user.
STATE_COLOURS: dict[str, str] = {
    "no server": "#57606a",
    "starting": "#0969da",
    "QUEUED": "#8250df",  # ``QUEUED (Resources)``: its Slurm job waits; coloured by the first word
    "READY": "#1a7f37",
    "CRASHED": "#cf222e",
    "STALLED": "#cf222e",
    "TIMEOUT": "#cf222e",
    "STOPPED": "#9a6700",
    "INTERRUPTED": "#9a6700",
    "stopped": "#57606a",
}


class StateBadge:
    """The server's state in one coloured word, and the running action beside it."""

    def __init__(self) -> None:
        self.state = "no server"
        self.activity = ""
        self.widget = widgets.HTML(self._html())
        self.widget.add_class("dsv4lab-badge")

    def set(self, state: str | None = None, activity: str | None = None) -> None:
        if state is not None:
            self.state = state
        if activity is not None:
            self.activity = activity
        self.widget.value = self._html()

    def _html(self) -> str:
        colour = STATE_COLOURS.get(self.state) or STATE_COLOURS.get(self.state.split(" ")[0], "#57606a")
        busy = (
            f" <span style='color:#57606a;font-size:0.85em'>{html.escape(self.activity)}</span>"
            if self.activity
            else ""
        )
        return (
            f"<span data-state='{html.escape(self.state)}' style='display:inline-block;min-width:6em;"
            f"text-align:center;padding:0.15em 0.6em;border-radius:1em;background:{colour};color:white;"
            f"font-weight:700;font-family:system-ui,sans-serif'>{html.escape(self.state)}</span>{busy}"
        )


class ResultsPane:
    """Cards appended below the panel (bench tables, charts, diagnoses, scripts), newest last, capped."""

    def __init__(self, max_items: int = 40) -> None:
        self.max_items = max_items
        # No margin: ipywidgets gives an Output 2 px each side, and 100 % plus 4 px is a horizontal
        # scrollbar under the whole panel.
        self.widget = widgets.Output(layout=widgets.Layout(width="100%", margin="0"))
        self.widget.add_class("dsv4lab-results")
        self._lock = threading.Lock()

    def add(self, markup: str, text: str = "") -> None:
        """Append one HTML block (``text`` is its plain-text form for logs and tests)."""
        item = {
            "output_type": "display_data",
            "data": {"text/html": markup, "text/plain": text or _strip(markup)},
            "metadata": {},
        }
        with self._lock:
            outputs = (*self.widget.outputs, item)[-self.max_items :]
            self.widget.outputs = outputs

    def error(self, what: str, exc: BaseException) -> None:
        """An action that failed: its message in red, the traceback folded under it."""
        lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
        body = hv.p(str(exc) or type(exc).__name__) + hv.fold("".join(lines).splitlines(), keep=0, summary="traceback")
        self.add(hv.card(f"{what} failed", body, state="fail", status=type(exc).__name__), f"{what} failed: {exc}")

    def clear(self) -> None:
        with self._lock:
            self.widget.outputs = ()

    @property
    def texts(self) -> list[str]:
        """The plain-text form of every card (what tests assert on)."""
        return [str(o.get("data", {}).get("text/plain", "")) for o in self.widget.outputs]

    @property
    def htmls(self) -> list[str]:
        return [str(o.get("data", {}).get("text/html", "")) for o in self.widget.outputs]


def _strip(markup: str) -> str:
    import re

    return html.unescape(re.sub(r"<[^>]+>", " ", markup)).strip()


class Jobs:
    """Runs one action at a time in a worker thread; failures become cards, never raised into a cell."""

    def __init__(self, results: ResultsPane, on_change: Callable[[], None]) -> None:
        self.results = results
        self.on_change = on_change
        self.current: str | None = None
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        return self.current is not None

    def start(self, name: str, action: Callable[[], None]) -> bool:
        """Run ``action`` in the background; False (and a note) when another action is still running."""
        with self._lock:
            if self.current is not None:
                self.results.add(hv.card(f"{name} not started", hv.p(f"{self.current} is still running")), "")
                return False
            self.current = name
            self._idle.clear()
        self._safe_change()
        self._thread = threading.Thread(target=self._run, args=(name, action), name=f"dsv4lab-{name}", daemon=True)
        self._thread.start()
        return True

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until the running action ends (tests, scripts); False on timeout."""
        return self._idle.wait(timeout_s)

    def _run(self, name: str, action: Callable[[], None]) -> None:
        try:
            action()
        except BaseException as exc:  # KeyboardInterrupt/Interrupted included: a card, not a dead thread
            self.results.error(name, exc)
        finally:
            with self._lock:
                self.current = None
                self._idle.set()
            self._safe_change()

    def _safe_change(self) -> None:
        try:
            self.on_change()
        except Exception as exc:  # a redraw that fails must not hide the action's own result
            self.results.error("redraw", exc)


class ServerMonitor:
    """Follows one server's log into the log pane and redraws its GPU memory chart while it starts.

    Runs in its own thread from launch until the server is stopped or has crashed (plus a final drain),
    independent of the action thread that waits for the verdict, so the log streams while ``wait`` blocks.
    """

    def __init__(
        self,
        server: Server,
        log: LogPane,
        chart: ChartSlot,
        *,
        preflight: Preflight | None = None,
        label: str = "",
        chart_every_s: float = 2.0,
        poll_s: float = 0.3,
    ) -> None:
        self.server = server
        self.log = log
        self.chart = chart
        self.preflight = preflight
        self.label = label
        self.chart_every_s = chart_every_s
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"dsv4lab-monitor-{server.name}", daemon=True)
        self.error: str | None = None

    def start(self) -> ServerMonitor:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def finish(self, timeout_s: float = 5.0) -> None:
        """Wait for the monitor to drain the log of a server that has ended (it stops by itself then)."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def _over(self) -> bool:
        s = self.server
        return s.stopped is not None or s.state in ("CRASHED", "STALLED", "TIMEOUT", "STOPPED")

    def _run(self) -> None:
        handle = self.server.handle
        follower: Any = None
        next_chart = time.monotonic() + 1.0
        charted_final = False
        try:
            follower = handle.host.follow(handle.log_path, 0)
            while not self._stop.is_set():
                self.log.append(line.text for line in follower.poll(self.poll_s))
                self.log.flush()
                starting = self.server.state == "starting" or self.server.state.startswith("QUEUED")
                now = time.monotonic()
                if starting and now >= next_chart:
                    next_chart = now + self.chart_every_s
                    self._draw_chart()
                elif not starting and not charted_final:
                    charted_final = True
                    self._draw_chart()
                if self._over():
                    self.log.append(line.text for line in follower.poll(0.2))
                    break
        except Exception as exc:  # the pane says the log could not be followed; the server is unaffected
            self.error = str(exc)
            self.log.append([f"[dsv4lab: the log could not be followed: {exc}]"])
        finally:
            self.log.flush(force=True)
            if follower is not None:
                with contextlib.suppress(Exception):
                    follower.close()

    def _draw_chart(self) -> None:
        server, preflight, label = self.server, self.preflight, self.label

        def build() -> Any:
            from dsv4lab import plots
            from dsv4lab.errors import PlotError

            frame = server.gpu_memory()
            if frame.empty:
                raise PlotError("waiting for the first GPU memory samples")
            log = server.local_dir / "server.log"
            return plots.memory_timeline(
                frame,
                log=str(log) if log.exists() else None,
                preflight=preflight,
                config=label,
                title=f"GPU memory while {label or server.name} starts ({server.state})",
            )

        self.chart.request(build)
