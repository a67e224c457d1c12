"""SSE parsing and HTTP framing edge cases: splits anywhere, UTF-8, comments, [DONE], large payloads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Mapping

import pytest

from dsv4lab.bench.httpstream import ConnectionPool, Endpoint, ServerClosedError
from dsv4lab.bench.sse import SSEEvent, SSEParser

STREAM = (
    ": keep-alive comment\n\n"
    'data: {"text": "héllo 世界 🙂"}\n\n'
    "event: update\nid: 7\ndata: line one\ndata: line two\n\n"
    "data:no-space\n\n"
    ":ping\n"
    "retry: 100\n"
    "data: [DONE]\n\n"
).encode()
EXPECTED = [
    SSEEvent('{"text": "héllo 世界 🙂"}'),
    SSEEvent("line one\nline two", "update", "7"),
    SSEEvent("no-space", "message", "7"),
    SSEEvent("[DONE]", "message", "7"),
]


def parse_in_pieces(data: bytes, cuts: list[int]) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    last = 0
    for c in [*cuts, len(data)]:
        out += p.feed(data[last:c])
        last = c
    return out + p.close()


def test_whole_stream() -> None:
    assert parse_in_pieces(STREAM, []) == EXPECTED


def test_every_single_split_point_including_inside_utf8_characters() -> None:
    for cut in range(1, len(STREAM)):
        assert parse_in_pieces(STREAM, [cut]) == EXPECTED, cut


def test_byte_by_byte_and_random_chunks() -> None:
    assert parse_in_pieces(STREAM, list(range(1, len(STREAM)))) == EXPECTED
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(STREAM)), rng.randint(1, 12)))
        assert parse_in_pieces(STREAM, cuts) == EXPECTED


@pytest.mark.parametrize("eol", [b"\r\n", b"\r"])
def test_crlf_and_cr_line_endings_split_anywhere(eol: bytes) -> None:
    data = STREAM.replace(b"\n", eol)
    for cut in range(1, len(data)):
        assert parse_in_pieces(data, [cut]) == EXPECTED, cut


def test_trailing_event_without_blank_line_is_delivered_on_close() -> None:
    p = SSEParser()
    assert p.feed(b'data: {"a": 1}') == []
    assert p.close() == [SSEEvent('{"a": 1}')]


def test_comment_only_stream_and_empty_data() -> None:
    assert parse_in_pieces(b": ping\n\n: ping\n\n", [3]) == []
    assert parse_in_pieces(b"data\n\n", []) == [SSEEvent("")]


def test_large_payload_in_small_reads_is_linear() -> None:
    text = "x" * (8 << 20)  # one 8 MiB event
    data = b"data: " + json.dumps({"text": text}).encode() + b"\n\n" + b"data: [DONE]\n\n"
    p = SSEParser()
    events: list[SSEEvent] = []
    t0 = time.perf_counter()
    for i in range(0, len(data), 16 * 1024):
        events += p.feed(data[i : i + 16 * 1024])
    elapsed = time.perf_counter() - t0
    assert [json.loads(e.data)["text"] == text for e in events[:1]] == [True]
    assert events[1].data == "[DONE]"
    assert elapsed < 2.0  # a quadratic rescan of 8 MiB in 512 reads would take far longer


# -- HTTP/1.1 framing over a real socket --------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.ended = False

    def on_head(self, status: int, headers: Mapping[str, str], t: float) -> None:
        self.status = status

    def on_body(self, data: bytes, t: float) -> None:
        self.body += data

    def on_end(self, t: float) -> None:
        self.ended = True


class RawServer:
    """A server that answers any request with ``pieces``, written separately with pauses between; ``close``
    closes each connection after its answer (else the client reads until it has what it needs)."""

    def __init__(self, pieces: list[bytes], *, close: bool = True) -> None:
        self.pieces, self.close_after = pieces, close
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        for piece in self.pieces:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.002)
        if self.close_after:
            writer.close()

    async def stop(self) -> None:
        """Every connection closed and waited for, then the listener: nothing left for the loop's end."""
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def fetch(pieces: list[bytes], *, close: bool = True) -> Sink:
    server = RawServer(pieces, close=close)
    port = await server.start()
    pool = ConnectionPool(Endpoint.parse(f"http://127.0.0.1:{port}"), connect_timeout_s=5)
    sink = Sink()
    try:
        await pool.request(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", sink, timeout_s=10)
    finally:
        pool.close()
        await server.stop()
    return sink


def test_chunked_framing_split_everywhere() -> None:
    body = b"data: one\n\ndata: two\n\n"
    raw = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"b;ext=1\r\n"
        + body[:11]
        + b"\r\n"
        + f"{len(body) - 11:x}\r\n".encode()
        + body[11:]
        + b"\r\n0\r\nX-Trailer: 1\r\n\r\n"
    )
    pieces = [raw[i : i + 3] for i in range(0, len(raw), 3)]  # cuts inside sizes, CRLFs and the head
    sink = asyncio.run(fetch(pieces, close=False))
    assert sink.status == 200 and sink.ended and bytes(sink.body) == body


def test_content_length_and_read_until_close() -> None:
    sink = asyncio.run(fetch([b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbu", b"sy"], close=False))
    assert sink.status == 503 and bytes(sink.body) == b"busy"
    sink = asyncio.run(fetch([b"HTTP/1.0 200 OK\r\n\r\nall ", b"of it"]))
    assert bytes(sink.body) == b"all of it" and sink.ended


def test_connection_closed_mid_body_is_an_error() -> None:
    with pytest.raises(ServerClosedError):
        asyncio.run(fetch([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"]))
