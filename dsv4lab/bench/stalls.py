"""How long the benchmark client itself stood still at a measured run's edges: a heartbeat on its event loop.

Why a benchmark needs this: the client timestamps a response when it reads it and ends the run at the last
read. If the client's process does not run for a while (the host's other jobs took both cores, a page
fault waited on the disk, the VM was descheduled), nothing is sent or read meanwhile. In the middle of a run
that costs little: the bytes wait in the socket and are read late, but the run still ends when the server
ends it. At the start (the first requests not yet sent) or at the end (the last bytes not yet read) the
stall adds its whole length to the run's duration. The server was not slower; the measurement was. On the
twin, whose durations are ``time_scale`` x the modelled hardware's, a 0.7-s stall at scale 0.02 reads as
35 s of GPU time: a repeat 20 % slower than its neighbours, enough to swing an A/B on three repeats
(reproduced by SIGSTOP-ing the client for 0.7 s every 3 s: the same repeat read 764 tok/s beside 856-876).

A heartbeat task wakes every :data:`HEARTBEAT_S` and records how late it woke. Anything that keeps the
client from reacting to a byte shows up as lateness: the process not being scheduled, and an event loop too
busy to keep up with its streams. Only the stalls at the edges count (:data:`EDGE_S` after the run's start,
and the one the run ended in or just after): counting every stall made a third of the runs of a CI
``make test`` "disturbed" (mid-run stalls of 0.1-1.4 s beside a real vLLM on 2 cores) and redoing them
added five minutes without changing a figure. A run whose edge stall is a sizeable share of its duration is
:func:`disturbed`, and the repeating loops (a sweep, an A/B) make that run again rather than feed it to the
statistics.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["EDGE_S", "HEARTBEAT_S", "STALL_FLOOR_S", "STALL_SHARE", "StallWatch", "disturbed", "stall_text"]

#: How often the heartbeat wakes. Each wake costs a few microseconds of the loop that reads the streams.
HEARTBEAT_S = 0.02
#: How close to the run's start a stall must begin, and how close to the run's end one must have ended, to
#: be at the run's edge: the first requests go out at once, and the run's end reaches :meth:`StallWatch.stop`
#: within a few turns of the event loop.
EDGE_S = 0.1
#: A run is disturbed when the client stood still at its edge for longer than this share of the run's
#: duration (a stall lengthens the run by at most its own length, so this bounds the error it put in the
#: throughput) and longer than :data:`STALL_FLOOR_S`.
STALL_SHARE = 0.05
#: Seconds a stall must also exceed to disturb a run: below it is the ordinary jitter of a loaded host (the
#: heartbeat woke at most 11 ms late here with four busy processes on two cores).
STALL_FLOOR_S = 0.1


def disturbed(stall_s: float | None, duration_s: float) -> bool:
    """Whether a run whose client stood still at its edge for ``stall_s`` (None: not measured) over
    ``duration_s`` seconds of the same clock measured the client rather than the server."""
    if stall_s is None or not duration_s > 0:
        return False
    return stall_s > max(STALL_FLOOR_S, STALL_SHARE * duration_s)


def stall_text(stall_s: float, duration_s: float) -> str:
    """The disturbance in a reader's words (on the wall clock of the client's host, which is what stalled)."""
    share = stall_s / duration_s if duration_s > 0 else 0.0
    return (
        f"the client itself stood still for {stall_s:.2f} s at the edge of a {duration_s:.2f}-s run "
        f"({share:.0%}, host clock)"
    )


class StallWatch:
    """The heartbeat over one measured run: :meth:`start` it when the run's clock starts, :meth:`stop` it
    at the run's end; :attr:`edge_s` is then the longest stall at the run's edges, :attr:`longest_s` the
    longest anywhere."""

    def __init__(self, interval_s: float = HEARTBEAT_S) -> None:
        if not interval_s > 0:
            raise ValueError(f"the heartbeat's interval must be positive, not {interval_s!r}")
        self.interval_s = interval_s
        self.longest_s = 0.0
        self.edge_s = 0.0
        self._start = 0.0
        self._due: float | None = None
        self._last: tuple[float, float] | None = None  # (when it ended, how long) of the latest real stall
        self._task: asyncio.Task[None] | None = None

    def start(self) -> StallWatch:
        """Begin beating on the running event loop (call it from a coroutine, when the run's clock starts)."""
        self._start = time.perf_counter()
        self._due = self._start + self.interval_s
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="dsv4lab-stall-watch")
        return self

    async def _beat(self) -> None:
        while self._due is not None:
            await asyncio.sleep(max(0.0, self._due - time.perf_counter()))
            self._note()

    def _note(self) -> float:
        """Record the lateness of the beat due now; the time it was noted."""
        now = time.perf_counter()
        if self._due is None:
            return now
        late = now - self._due
        self.longest_s = max(self.longest_s, late)
        if self._due - self.interval_s <= self._start + EDGE_S:  # the stall began at the run's start
            self.edge_s = max(self.edge_s, late)
        if late >= self.interval_s:
            self._last = (now, late)
        self._due = now + self.interval_s
        return now

    def stop(self) -> float:
        """End the heartbeat; the longest stall at the run's edges. A stall still under way when the run
        ended, or one that ended just before, is the stall the run ended in. Not a coroutine, so a
        ``finally`` that runs on the user's Stop can call it."""
        now = self._note() if self._due is not None and time.perf_counter() > self._due else time.perf_counter()
        if self._last is not None and now - self._last[0] <= EDGE_S:
            self.edge_s = max(self.edge_s, self._last[1])
        self._due = None
        if self._task is not None:
            self._task.cancel()
            self._task = None
        return self.edge_s
