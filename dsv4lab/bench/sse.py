"""An incremental Server-Sent Events parser that does not care where the network cut the bytes.

TCP delivers a stream, not events: one read may end in the middle of an event, of a line, of a ``\\r\\n``
pair or of a multi-byte UTF-8 character, and one event may be megabytes long. Clients that split on
``data:`` per read, decode each read as UTF-8, or rescan the whole buffer per read get these wrong or get
slow; this parser keeps undecoded bytes until a line is complete (a line ending is ASCII, so a complete
line never ends inside a character) and only scans the bytes that are new.

It follows the WHATWG event-stream rules that matter to LLM servers: lines end with ``\\r\\n``, ``\\n`` or
``\\r``; a blank line dispatches the event; ``:`` starts a comment (keep-alive pings); ``data`` lines of
one event are joined with ``\\n``; one space after the colon is dropped; a field without a colon has an
empty value. ``[DONE]`` is an ordinary event here — its meaning belongs to the client.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser"]


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event: its ``data`` (lines joined with ``\\n``), and ``event``/``id`` when sent."""

    data: str
    event: str = "message"
    id: str | None = None


class SSEParser:
    """Feed bytes as they arrive; get back the events they complete."""

    __slots__ = ("_buf", "_data", "_event", "_has_data", "_id", "_pending_cr")

    def __init__(self) -> None:
        self._buf = bytearray()  # bytes of the current, incomplete line (line endings normalised to \n)
        self._pending_cr = False  # the last byte fed was \r: it may pair with a \n in the next read
        self._data: list[str] = []
        self._has_data = False
        self._event = ""
        self._id: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk`` and return the events completed by it (possibly none)."""
        return [SSEEvent(data, event, id_) for data, event, id_ in self._consume(chunk)]

    def feed_data(self, chunk: bytes) -> list[str]:
        """Like :meth:`feed`, returning only each event's data: the benchmark client's hot path."""
        return [data for data, _, _ in self._consume(chunk)]

    def _consume(self, chunk: bytes) -> list[tuple[str, str, str | None]]:
        if not chunk:
            return []
        if self._pending_cr:
            self._pending_cr = False
            if chunk[:1] == b"\n":  # the \n of a \r\n split across reads: the \r already ended the line
                chunk = chunk[1:]
        if b"\r" in chunk:
            if chunk.endswith(b"\r"):
                self._pending_cr = True
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in chunk:  # the common large-payload case: just accumulate, no rescanning
            self._buf += chunk
            return []
        events: list[tuple[str, str, str | None]] = []
        lines = chunk.split(b"\n")
        if self._buf:
            self._buf += lines[0]
            lines[0] = bytes(self._buf)
        self._buf = bytearray(lines.pop())
        for line in lines:
            if line[:6] == b"data: ":  # the common case, inlined
                self._data.append(line[6:].decode("utf-8", "replace"))
                self._has_data = True
            elif not line:
                if self._has_data:
                    data = self._data[0] if len(self._data) == 1 else "\n".join(self._data)
                    events.append((data, self._event or "message", self._id))
                    self._data = []
                    self._has_data = False
                self._event = ""
            else:
                self._line(line)
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: a last event not followed by a blank line is still delivered (servers omit it)."""
        self._pending_cr = False
        if self._buf:
            self._line(bytes(self._buf))
            self._buf = bytearray()
        events: list[SSEEvent] = []
        if self._has_data:
            events.append(SSEEvent("\n".join(self._data), self._event or "message", self._id))
        self._data = []
        self._has_data = False
        self._event = ""
        return events

    def _line(self, line: bytes) -> None:
        if line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._data.append(value.decode("utf-8", "replace"))
            self._has_data = True
            return
        if line[:1] == b":":
            return  # comment / keep-alive
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        text = value.decode("utf-8", "replace")
        if name == b"data":  # "data" without a colon: an empty data line
            self._data.append(text)
            self._has_data = True
        elif name == b"event":
            self._event = text
        elif name == b"id" and "\x00" not in text:
            self._id = text
        # "retry" and unknown fields are ignored, as the spec says.
