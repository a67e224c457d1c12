"""A small HTTP/1.1 client for one job: POST a request and hand the streamed body over as it arrives.

Why not aiohttp for the streaming requests: a benchmark client must be faster and better-timed than the
server it measures. With aiohttp every network read wakes a task through the response's stream reader,
and the arrival time is taken only when that task next runs — under 64 concurrent streams the wake-up
queue adds its delay to TTFT and ITL, and the per-read overhead caps the tokens/s one core can follow.
Here the arrival time is read in ``data_received``, the first Python code to see the bytes, and the whole
body pipeline (chunked decoding, SSE, JSON) runs in that callback with no task switch.
``benchmarks/client_capacity.py`` measures both effects.

Only what LLM servers use is supported: HTTP/1.1 (optionally TLS), ``Content-Length``, chunked and
read-until-close bodies, keep-alive reuse. A request that fails on a reused connection before any response
byte arrives is retried once on a new connection (the server may have closed an idle keep-alive
connection; that is not a failure of the server).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from dsv4lab.errors import BenchError

__all__ = ["BodySink", "ConnectionPool", "Endpoint", "HTTPStreamError", "ServerClosedError"]

#: Largest response head accepted; a server sending more is not an LLM server.
_MAX_HEAD = 64 * 1024


class HTTPStreamError(ConnectionError):
    """The response could not be read (bad framing or head). Not a BenchError: it is a per-request failure."""


class ServerClosedError(ConnectionError):
    """The server closed or reset the connection before the response ended."""


class BodySink(Protocol):
    """Receives one response. ``t`` is ``time.perf_counter()`` at the read that delivered the bytes."""

    def on_head(self, status: int, headers: Mapping[str, str], t: float) -> None: ...

    def on_body(self, data: bytes, t: float) -> None: ...

    def on_end(self, t: float) -> None: ...


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: scheme, host, port and the path prefix of a base URL."""

    scheme: str
    host: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchError(f"server URL must look like http://HOST:PORT, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}{self.prefix}"

    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


class _Inbox:
    """Reads waiting to be parsed, shared by a pool's connections.

    When 64 streams deliver a chunk in the same loop iteration, parsing each read inside its own callback
    would stamp the 64th read after 63 parses. Instead every read is stamped and queued, and one callback
    scheduled for the next iteration parses them all: the stamps are taken back to back.
    """

    __slots__ = ("items", "scheduled")

    def __init__(self) -> None:
        self.items: list[tuple[_Conn, bytes, float]] = []
        self.scheduled = False

    def put(self, conn: _Conn, data: bytes, t: float) -> None:
        self.items.append((conn, data, t))
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.drain)

    def drain(self) -> None:
        self.scheduled = False
        items, self.items = self.items, []
        for conn, data, t in items:
            conn.process(data, t)


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _UNTIL_CLOSE, _IDLE = range(7)


class _Conn(asyncio.Protocol):
    """One connection; one response at a time; the parsing state machine lives in ``data_received``."""

    def __init__(self, inbox: _Inbox | None = None) -> None:
        self.inbox = inbox
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False
        self.got_bytes = False
        self._sink: BodySink | None = None
        self._done: asyncio.Future[None] | None = None
        self._state = _IDLE
        self._buf = bytearray()
        self._need = 0
        self._keep_alive = True

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inbox is not None and self.inbox.items:
            self.inbox.drain()  # bytes that arrived before the close belong to the response
        self.closed = True
        if self._done is not None and not self._done.done():
            if self._state == _UNTIL_CLOSE and exc is None:
                self._finish(time.perf_counter())
            else:
                why = f": {exc}" if exc else ""
                self._fail(ServerClosedError(f"server closed the connection before the response ended{why}"))

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost() decides whether that ended or broke the body

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        if self.inbox is not None:
            self.inbox.put(self, data, t)
        else:
            self.process(data, t)

    def process(self, data: bytes, t: float) -> None:
        if self._sink is None:
            return  # bytes outside a response (should not happen); ignored
        self.got_bytes = True
        try:
            self._parse(data, t)
        except HTTPStreamError as exc:
            self._fail(exc)

    # -- one request --------------------------------------------------------------------------------

    def start(self, request: bytes, sink: BodySink) -> asyncio.Future[None]:
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._sink = sink
        self._done = loop.create_future()
        self._state = _HEAD
        self._buf = bytearray()
        self.got_bytes = False
        self.reusable = False
        self.transport.write(request)
        return self._done

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _finish(self, t: float) -> None:
        sink, done = self._sink, self._done
        self._sink = None
        self._state = _IDLE
        self.reusable = self._keep_alive and not self.closed
        if sink is not None:
            sink.on_end(t)
        if done is not None and not done.done():
            done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        self._sink = None
        self._state = _IDLE
        self.reusable = False
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def _head(self, t: float) -> bytes | None:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > _MAX_HEAD:
                raise HTTPStreamError("response head too large")
            return None
        head = bytes(self._buf[:end]).decode("latin-1")
        rest = bytes(self._buf[end + 4 :])
        self._buf = bytearray()
        lines = head.split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HTTPStreamError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        conn = headers.get("connection", "").lower()
        self._keep_alive = "close" not in conn if parts[0] == "HTTP/1.1" else "keep-alive" in conn
        if 100 <= status < 200:
            return rest  # an interim response (100 Continue): the real head follows
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._state = _CHUNK_SIZE
        elif "content-length" in headers:
            try:
                self._need = int(headers["content-length"])
            except ValueError:
                raise HTTPStreamError(f"bad Content-Length {headers['content-length']!r}") from None
            self._state = _LENGTH
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        assert self._sink is not None
        self._sink.on_head(status, headers, t)
        return rest

    def _parse(self, data: bytes, t: float) -> None:
        """Advance the response state machine over ``data``. Positions index into ``data`` (no slicing of
        the remainder: a 64 KiB read holding a thousand chunks must not be copied a thousand times)."""
        body: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            state = self._state
            if state == _HEAD:
                self._buf += data[pos:] if pos else data
                rest = self._head(t)
                if rest is None:
                    return
                data, pos, end = rest, 0, len(rest)
                if self._state == _LENGTH and self._need == 0:
                    break
            elif state in (_CHUNK_SIZE, _TRAILER):
                i = data.find(b"\n", pos)
                if i < 0:
                    self._buf += data[pos:]
                    if len(self._buf) > _MAX_HEAD:
                        raise HTTPStreamError("chunk-size line too long")
                    break
                line = (bytes(self._buf) + data[pos:i]).strip() if self._buf else data[pos:i].strip()
                self._buf = bytearray()
                pos = i + 1
                if state == _TRAILER:
                    if not line:
                        self._state = _IDLE
                        if pos < end:  # bytes after the response: the connection cannot be trusted any more
                            self._keep_alive = False
                        break
                    continue
                if not line:
                    continue  # the CRLF that ends the previous chunk's data
                try:
                    size = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise HTTPStreamError(f"bad chunk size {line[:40]!r}") from None
                if size == 0:
                    self._state = _TRAILER
                else:
                    self._state = _CHUNK_DATA
                    self._need = size
            elif state in (_CHUNK_DATA, _LENGTH):
                n = min(self._need, end - pos)
                body.append(data[pos : pos + n])
                pos += n
                self._need -= n
                if self._need == 0:
                    if state == _LENGTH:
                        break
                    self._state = _CHUNK_SIZE
            elif state == _UNTIL_CLOSE:
                body.append(data[pos:] if pos else data)
                break
            else:  # _IDLE cannot be seen here: every branch that ends a response breaks out of the loop
                break
        if body and self._sink is not None:
            self._sink.on_body(body[0] if len(body) == 1 else b"".join(body), t)
        if self._state == _IDLE or (self._state == _LENGTH and self._need == 0):
            self._finish(t)


class ConnectionPool:
    """Keep-alive connections to one endpoint, opened on demand; ``abort_all`` cuts every one at once."""

    def __init__(self, endpoint: Endpoint, *, connect_timeout_s: float) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []
        self._busy: set[_Conn] = set()
        self._inbox = _Inbox()
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if endpoint.scheme == "https" else None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Conn(self._inbox),
                    self.endpoint.host,
                    self.endpoint.port,
                    ssl=self._ssl,
                    server_hostname=self.endpoint.host if self._ssl else None,
                ),
                timeout=self.connect_timeout_s,
            )
        except (asyncio.TimeoutError, TimeoutError):
            raise ServerClosedError(
                f"no connection to {self.endpoint.url} within {self.connect_timeout_s:g} s"
            ) from None
        return conn

    async def preconnect(self, n: int) -> None:
        """Open up to ``n`` idle connections now, so timed requests do not pay for TCP (and TLS) setup.
        Failures are ignored here: the requests themselves will meet and report them."""
        missing = n - len([c for c in self._idle if not c.closed])
        if missing <= 0:
            return
        opened = await asyncio.gather(*(self._connect() for _ in range(missing)), return_exceptions=True)
        self._idle.extend(c for c in opened if isinstance(c, _Conn))

    async def request(self, request: bytes, sink: BodySink, *, timeout_s: float) -> None:
        """Send ``request``; the sink gets the response. Raises ConnectionError/OSError/TimeoutError."""
        conn: _Conn | None = None
        while self._idle:
            candidate = self._idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        reused = conn is not None
        if conn is None:
            conn = await self._connect()
        self._busy.add(conn)
        try:
            try:
                await asyncio.wait_for(conn.start(request, sink), timeout=timeout_s)
            except ConnectionError:
                if not (reused and not conn.got_bytes):
                    raise
                self._busy.discard(conn)
                conn = await self._connect()  # a stale keep-alive connection: one retry on a fresh one
                self._busy.add(conn)
                await asyncio.wait_for(conn.start(request, sink), timeout=timeout_s)
        except BaseException:
            conn.abort()
            raise
        finally:
            self._busy.discard(conn)
        if conn.reusable:
            self._idle.append(conn)
        else:
            conn.abort()

    def abort_all(self) -> None:
        for conn in [*self._busy, *self._idle]:
            with contextlib.suppress(Exception):
                conn.abort()
        self._idle.clear()

    def close(self) -> None:
        self.abort_all()


def build_post(endpoint: Endpoint, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """The bytes of an HTTP/1.1 POST with a JSON body."""
    lines = [
        f"POST {endpoint.prefix}{path} HTTP/1.1",
        f"Host: {endpoint.host_header()}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(body)}",
        "Connection: keep-alive",
        "User-Agent: dsv4lab-bench",
    ]
    lines.extend(f"{k}: {v}" for k, v in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
