"""How long the benchmark client itself stood still during a measured run: a heartbeat on its event loop.

Why a benchmark needs this: the client timestamps a response when it reads it and ends the run at the last
read. If the client's process does not run for a while (the host's other jobs took both cores, a page
fault waited on the disk, the VM was descheduled), nothing is sent or read meanwhile, and a stall that
covers the run's first requests or its last bytes adds its whole length to the run's duration. The server
was not slower; the measurement was. On the twin, whose durations are ``time_scale`` x the modelled
hardware's, a 0.7-s stall at scale 0.02 reads as 35 s of GPU time: a repeat 20 % slower than its
neighbours, enough to swing an A/B on three repeats (reproduced by SIGSTOP-ing the client for 0.7 s every
3 s: the same repeat read 764 tok/s beside 856-876).

A heartbeat task wakes every :data:`HEARTBEAT_S` and records how late it woke. Anything that keeps the
client from reacting to a byte shows up as lateness: the process not being scheduled, and an event loop too
busy to keep up with its streams. The longest lateness of a run is its ``client_stall_s``; a run where it
is a sizeable share of the duration is :func:`disturbed`, and the repeating loops (a sweep, an A/B) make
that run again rather than feed it to the statistics. Against the twin the same holds for the twin's own
process (:func:`twin_stalled_s`): it catches up a stall in the middle of a run, but not one that covers the
run's last step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["HEARTBEAT_S", "STALL_FLOOR_S", "STALL_SHARE", "StallWatch", "disturbed", "stall_text", "twin_stalled_s"]

#: How often the heartbeat wakes. Each wake costs a few microseconds of the loop that reads the streams.
HEARTBEAT_S = 0.02
#: A run is disturbed when the client stood still for longer than this share of the run's duration (a
#: stall can lengthen the run by at most its own length, so this bounds the error it put in the throughput)
#: and longer than :data:`STALL_FLOOR_S`.
STALL_SHARE = 0.05
#: Seconds a stall must also exceed to disturb a run: below it is the ordinary jitter of a loaded host (the
#: heartbeat woke at most 11 ms late here with four busy processes on two cores).
STALL_FLOOR_S = 0.1


def twin_stalled_s(info: Mapping[str, Any] | None) -> float | None:
    """The twin's running total of host stalls that made its steps end late (``twin.stalled_s`` in its
    ``/server_info``); None for any other server. A run's share is the difference across the run.

    Only the twin's: its durations are scaled, so a stall of its process is an artefact of the host that the
    scaling magnifies, while a real engine's stall is part of what a benchmark of it measures."""
    twin = (info or {}).get("twin")
    value = twin.get("stalled_s") if isinstance(twin, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def disturbed(stall_s: float | None, duration_s: float) -> bool:
    """Whether a run whose client stood still for ``stall_s`` (None: not measured) over ``duration_s``
    seconds of the same clock measured the client rather than the server."""
    if stall_s is None or not duration_s > 0:
        return False
    return stall_s > max(STALL_FLOOR_S, STALL_SHARE * duration_s)


def stall_text(stall_s: float, duration_s: float, who: str = "the client itself") -> str:
    """The disturbance in a reader's words (on the wall clock of the host, which is what stalled)."""
    share = stall_s / duration_s if duration_s > 0 else 0.0
    return f"{who} stood still for {stall_s:.2f} s of a {duration_s:.2f}-s run ({share:.0%}, host clock)"


class StallWatch:
    """The heartbeat over one measured run: :meth:`start` it when the run's clock starts, :meth:`stop` it
    at the run's end, then read :attr:`longest_s`."""

    def __init__(self, interval_s: float = HEARTBEAT_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"the heartbeat's interval must be positive, not {interval_s!r}")
        self.interval_s = interval_s
        self.longest_s = 0.0
        self._due: float | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> StallWatch:
        """Begin beating on the running event loop (call it from a coroutine, when the run's clock starts)."""
        self._due = time.perf_counter() + self.interval_s
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="dsv4lab-stall-watch")
        return self

    async def _beat(self) -> None:
        while self._due is not None:
            await asyncio.sleep(max(0.0, self._due - time.perf_counter()))
            self._note()

    def _note(self) -> None:
        if self._due is None:
            return
        now = time.perf_counter()
        self.longest_s = max(self.longest_s, now - self._due)
        self._due = now + self.interval_s

    def stop(self) -> float:
        """End the heartbeat (a stall still under way when the run ended counts too); the longest lateness.
        Not a coroutine, so a ``finally`` that runs on the user's Stop can call it."""
        if self._due is not None and time.perf_counter() > self._due:
            self._note()
        self._due = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return self.longest_s
