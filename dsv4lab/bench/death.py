"""Deciding that the server died mid-run, from the client's side.

A server that dies must not leave a benchmark waiting for its request timeout. Any connection-level failure
(refused connect, reset, a stream cut before its end) triggers a probe of the server's HTTP port; a refused
or reset probe — or three connection failures within two seconds — counts as death, and the run aborts
(see :mod:`.runner`). A hung server that accepts and never answers is the request timeout's business.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from dsv4lab.bench.httpstream import Endpoint

__all__ = ["DEATH_ERRORS", "DEATH_WINDOW_S", "PROBE_TIMEOUT_S", "DeathWatch"]

#: Connection failures within this window that abort a run without waiting for the probe.
DEATH_ERRORS, DEATH_WINDOW_S = 3, 2.0
#: How long the liveness probe may take to connect before the server counts as dead.
PROBE_TIMEOUT_S = 2.0


class DeathWatch:
    """Decides, from connection failures, that the server is gone; then fires ``on_dead`` once."""

    def __init__(self, endpoint: Endpoint, on_dead: Callable[[str], None]) -> None:
        self.endpoint = endpoint
        self._on_dead = on_dead
        self._times: collections.deque[float] = collections.deque(maxlen=DEATH_ERRORS)
        self._probe: asyncio.Task[None] | None = None
        self.dead_reason: str | None = None

    def connection_error(self, exc: BaseException) -> None:
        if self.dead_reason is not None:
            return
        if isinstance(exc, ConnectionRefusedError):  # a refused connect already is the probe's answer
            self._dead(f"server at {self.endpoint.url} refuses connections: {exc}")
            return
        now = time.monotonic()
        self._times.append(now)
        if len(self._times) == DEATH_ERRORS and now - self._times[0] <= DEATH_WINDOW_S:
            self._dead(f"{DEATH_ERRORS} connection failures within {DEATH_WINDOW_S:g} s (last: {exc})")
            return
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._check(exc))

    def server_gone(self, reason: str) -> None:
        """The caller knows the server is dead (its process ended): the run ends now."""
        if self.dead_reason is None:
            self._dead(reason)

    async def _check(self, cause: BaseException) -> None:
        """Ask the HTTP server for ``/v1/models``: any answer means alive. A refused connect, a reset or EOF
        means dead — a bare connect is not enough, because a process being killed can still complete a
        handshake from its listen backlog. No answer within the timeout decides nothing (a hung server is
        the request timeout's business)."""
        ep = self.endpoint
        probe = (
            f"GET {ep.prefix}/v1/models HTTP/1.1\r\nHost: {ep.host_header()}\r\nConnection: close\r\n\r\n"
        ).encode()
        writer: asyncio.StreamWriter | None = None
        try:
            reader, w = await asyncio.wait_for(asyncio.open_connection(ep.host, ep.port), PROBE_TIMEOUT_S)
            writer = w
            w.write(probe)
            first = await asyncio.wait_for(reader.read(1), PROBE_TIMEOUT_S)
        except (asyncio.TimeoutError, TimeoutError):
            return
        except OSError as exc:
            self._dead(f"server at {ep.url} does not accept connections after a failed request ({cause}); {exc!r}")
            return
        finally:
            if writer is not None:
                writer.close()
        if not first:
            self._dead(f"server at {ep.url} closes connections without answering after a failed request ({cause})")

    async def settle(self) -> None:
        """Wait for a probe in progress (so a run does not start against a server being found dead)."""
        if self._probe is not None and not self._probe.done():
            await asyncio.gather(self._probe, return_exceptions=True)

    def _dead(self, reason: str) -> None:
        if self.dead_reason is None:
            self.dead_reason = reason
            self._on_dead(reason)

    def cancel(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
