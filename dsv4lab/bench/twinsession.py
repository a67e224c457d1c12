"""A run against the twin, announced: the session that lets the twin place each request on its own clock.

Why: the twin serves in virtual time, ahead of the wall clock, so it cannot learn when a request arrives on
the modelled timeline from when its bytes came in. The client tells it the run's plan instead (each request's
scheduled send time and the concurrency cap, ``POST /twin/sessions``), sends each request with its place in
that plan (headers ``X-Twin-Session`` and ``X-Twin-Seq``), and closes the session when the run ends or is
stopped. The twin then computes every arrival itself (:mod:`dsv4lab.twin.sessions`), and the figures are
the same on any machine under any load. A real server is never sent any of this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from dsv4lab.bench.serverinfo import _post as post
from dsv4lab.errors import BenchError

__all__ = ["TwinSession", "close_twin_session", "open_twin_session"]

#: How long a session's opening or closing may take; both are answered at once by a live twin.
SESSION_TIMEOUT_S = 10.0
#: How long closing may take after the user's Stop, which must give control back within a second.
CLOSE_AFTER_STOP_S = 0.5


@dataclass(frozen=True)
class TwinSession:
    """An open session: its id and the headers request ``seq`` carries."""

    sid: str
    clock: str

    def headers(self, seq: int) -> dict[str, str]:
        return {"X-Twin-Session": self.sid, "X-Twin-Seq": str(seq)}


async def open_twin_session(
    base_url: str,
    schedule: Sequence[float],
    cap: int | None,
    key: str,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = SESSION_TIMEOUT_S,
) -> TwinSession:
    """Announce a run of ``len(schedule)`` requests; a refusal is a :class:`BenchError` naming why."""
    body = {"schedule": [float(t) for t in schedule], "cap": cap, "key": key}
    status, text = await post(f"{base_url}/twin/sessions", body=body, timeout_s=timeout_s, headers=headers)
    if status != 200:
        raise BenchError(f"the twin refused the benchmark's session (HTTP {status}: {text[:300]})")
    data = json.loads(text)
    return TwinSession(str(data["id"]), str(data.get("clock", "")))


async def close_twin_session(
    base_url: str,
    session: TwinSession,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = SESSION_TIMEOUT_S,
) -> None:
    """End a session (the twin stops waiting for its requests); a twin already gone is no error here."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError, TimeoutError):
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.delete(f"{base_url}/twin/sessions/{session.sid}", headers=dict(headers or {})) as resp,
        ):
            await resp.read()
