"""Benchmark sessions: how the twin knows, in virtual time, when each request of a client's run arrives.

Why the twin needs to be told: in virtual time the scheduler runs ahead of the wall clock, so the moment a
request reaches it over HTTP says nothing about when it arrives on the modelled timeline. A benchmark says
instead what it would do: its requests' scheduled send times (seconds from the run's start) and its
concurrency cap. Request ``k`` then arrives at the later of its scheduled time and the moment a slot of the
cap came free (the finish of an earlier request), which is how a closed-loop client behaves on a real
server; the twin computes that moment itself, from its own finish times, and never reads it off the wall.

The scheduler is conservative: it does not run a step past the arrival of a request it has not received
yet, and waits (on the wall clock, up to :data:`SESSION_WAIT_S`) for the client to send it. A client that
leaves (its user pressed Stop, its process died) closes its session, or is dropped after that wait.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["REJECTED", "SESSION_WAIT_S", "Session", "SessionError"]

#: How long (wall seconds) the scheduler waits for a session's next request before it drops the session: a
#: client that is gone must not hold the twin for ever, and one that is merely slow sends within this.
SESSION_WAIT_S = 30.0
#: The most requests one session may announce.
MAX_SESSION_REQUESTS = 1_000_000

_ids = itertools.count(1)


class SessionError(ValueError):
    """A session announced with values the twin cannot use (the HTTP answer is 400 with this text)."""


class _Rejected:
    """A session request the twin refused before scheduling it (too long, for one): its slot frees at once."""


#: What a session holds for a request the twin refused before scheduling it (its slot frees at its arrival).
REJECTED = _Rejected()


@dataclass
class Session:
    """One client run's announced arrivals and the slots its cap allows."""

    schedule: tuple[float, ...]
    cap: int | None
    key: str
    #: The session's start on the scheduler's clock; every stamp its requests carry is relative to it.
    t0: float
    sid: str = field(default_factory=lambda: f"s{next(_ids)}")
    #: Index of the next request to arrive on the modelled timeline.
    next_seq: int = 0
    #: When each free slot came free (in the order they did), relative to the scheduler's clock.
    free: deque[float] = field(default_factory=deque)
    #: Requests received over HTTP and not yet arrived, by index (or :data:`REJECTED`).
    received: dict[int, object] = field(default_factory=dict)
    closed: bool = False
    waiter: asyncio.Event = field(default_factory=asyncio.Event)

    @classmethod
    def announce(cls, schedule: Sequence[object], cap: object, key: object, t0: float) -> Session:
        """A session from a client's announcement, checked: what is wrong is said, naming what is allowed."""
        if not isinstance(schedule, (list, tuple)) or len(schedule) > MAX_SESSION_REQUESTS:
            raise SessionError(f"schedule must be a list of at most {MAX_SESSION_REQUESTS:,} send times in seconds")
        times: list[float] = []
        for s in schedule:
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s >= 0):
                raise SessionError(f"schedule holds {s!r}: every send time must be a finite number of seconds >= 0")
            times.append(float(s))
        if any(b < a for a, b in itertools.pairwise(times)):
            raise SessionError("schedule must be in sending order (non-decreasing send times)")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise SessionError(f"cap must be a whole number >= 1 or null (no cap), not {cap!r}")
        session = cls(tuple(times), cap, str(key or ""), t0)
        if cap is not None:
            session.free.extend([t0] * min(cap, max(len(times), 1)))
        return session

    @property
    def done(self) -> bool:
        """Every announced request has arrived (or the session was closed)."""
        return self.closed or self.next_seq >= len(self.schedule)

    def next_arrival(self) -> float | None:
        """When the next request arrives on the scheduler's clock; None when that waits on a finish yet to
        come (every slot is in use) or when no request is left."""
        if self.done:
            return None
        scheduled = self.t0 + self.schedule[self.next_seq]
        if self.cap is None:
            return scheduled
        return max(scheduled, self.free[0]) if self.free else None

    def take(self) -> object | None:
        """The next request, arrived now (its slot taken), or None if it has not been received yet."""
        item = self.received.pop(self.next_seq, None)
        if item is None:
            return None
        self.next_seq += 1
        if self.cap is not None:
            self.free.popleft()
        return item

    def slot_freed(self, t: float) -> None:
        """A request of this session finished (or was refused) at ``t``: its slot is free for the next one."""
        if self.cap is not None and not self.closed:
            self.free.append(t)

    def receive(self, seq: int, item: object) -> None:
        if self.closed:
            return
        self.received[seq] = item
        self.waiter.set()

    async def wait_for_next(self, timeout_s: float) -> bool:
        """Wait until the next request is received; False when it was not within ``timeout_s``."""
        while self.next_seq not in self.received and not self.closed:
            self.waiter.clear()
            try:
                await asyncio.wait_for(self.waiter.wait(), timeout=timeout_s)
            except (asyncio.TimeoutError, TimeoutError):
                return False
        return True
