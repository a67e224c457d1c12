"""Turn a log (a path, or any iterable of lines) into clean text lines, streaming.

A server log can be many GB and is often still growing, so nothing here reads a whole file: lines come one
at a time, each capped in length (a runaway line, or a binary blob, must not take the memory with it).
The clean-up every reader needs happens once, here: tqdm's ``\\r``-separated updates become separate
lines, ANSI colours go, bytes that are not UTF-8 become U+FFFD instead of an exception.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Union, cast

from dsv4lab.logs.errors import LogError
from dsv4lab.logs.patterns import ANSI

__all__ = ["MAX_LINE_CHARS", "LogSource", "clean_line", "iter_lines", "sniff_binary"]

#: A line longer than this is cut (the rest is skipped); real log lines are < 4 KiB, server_args ~10 KiB.
MAX_LINE_CHARS = 64 * 1024

#: What the readers accept: a path, an open text/binary file, or any iterable of str/bytes lines.
LogSource = Union[str, "os.PathLike[str]", IO[str], IO[bytes], Iterable[str], Iterable[bytes]]

_SNIFF_BYTES = 8192


def sniff_binary(head: bytes) -> bool:
    """True when the first bytes look like a binary file rather than text.

    NUL bytes never occur in text logs; a high share of control bytes means a core dump, a tarball or a
    model shard passed by mistake.
    """
    if not head:
        return False
    if b"\x00" in head:
        return True
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return control > len(head) // 10


def clean_line(raw: str) -> Iterator[str]:
    """One physical line -> the logical lines in it, without ANSI codes or line ends.

    tqdm rewrites its bar with ``\\r``, so one physical line may hold many updates; each is its own line.
    """
    if "\x1b" in raw:
        raw = ANSI.sub("", raw)
    raw = raw.rstrip("\r\n")
    if "\r" in raw:
        for part in raw.split("\r"):
            if part:
                yield part
        return
    yield raw


def _is_pathlike(log: object) -> bool:
    return isinstance(log, (str, os.PathLike))


def _cap(line: str) -> str:
    return line if len(line) <= MAX_LINE_CHARS else line[:MAX_LINE_CHARS]


def _iter_file(path: Path) -> Iterator[str]:
    try:
        with path.open("rb") as fb:
            head = fb.read(_SNIFF_BYTES)
    except FileNotFoundError:
        raise LogError(f"log file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise LogError(f"{str(path)!r} is a directory, not a log file") from None
    except OSError as exc:
        raise LogError(f"cannot read log file {str(path)!r}: {exc.strerror or exc}") from None
    if sniff_binary(head):
        raise LogError(f"{str(path)!r} looks like a binary file (NUL or control bytes), not a text log")
    # newline=None: "\r", "\n" and "\r\n" all end a line, so tqdm's "\r" updates arrive as separate lines.
    with path.open("r", encoding="utf-8", errors="replace", newline=None) as f:
        yield from _iter_text_stream(f)


def _iter_text_stream(f: IO[str]) -> Iterator[str]:
    readline = f.readline
    limit = MAX_LINE_CHARS
    ansi = ANSI.sub
    while True:
        line = readline(limit)
        if not line:
            return
        if len(line) >= limit and not line.endswith(("\n", "\r")):
            # Skip the rest of a runaway line without holding it.
            while True:
                more = readline(limit)
                if not more or more.endswith(("\n", "\r")):
                    break
        if "\x1b" in line:
            line = ansi("", line)
        if "\r" in line:
            yield from clean_line(line)
        elif line[-1:] == "\n":
            yield line[:-1]
        else:
            yield line


def _iter_binary_stream(f: IO[bytes]) -> Iterator[str]:
    first = True
    while True:
        raw = f.readline(MAX_LINE_CHARS)
        if not raw:
            return
        if first and sniff_binary(raw[:_SNIFF_BYTES]):
            raise LogError("the log stream looks binary (NUL or control bytes), not text")
        first = False
        if len(raw) >= MAX_LINE_CHARS and not raw.endswith((b"\n", b"\r")):
            while True:
                more = f.readline(MAX_LINE_CHARS)
                if not more or more.endswith((b"\n", b"\r")):
                    break
        yield from clean_line(raw.decode("utf-8", errors="replace"))


def _iter_iterable(lines: Iterable[str] | Iterable[bytes]) -> Iterator[str]:
    for checked, item in enumerate(lines):
        if isinstance(item, bytes):
            if checked < 4 and sniff_binary(item[:_SNIFF_BYTES]):
                raise LogError("the log looks binary (NUL or control bytes), not text")
            text = item.decode("utf-8", errors="replace")
        elif isinstance(item, str):
            if checked < 4 and "\x00" in item[:_SNIFF_BYTES]:
                raise LogError("the log looks binary (NUL bytes), not text")
            text = item
        else:
            raise LogError(f"log lines must be str or bytes, got {type(item).__name__}")
        if "\n" in text.rstrip("\r\n"):
            for sub in text.splitlines():
                yield from clean_line(_cap(sub))
        else:
            yield from clean_line(_cap(text))


def iter_lines(log: LogSource) -> Iterator[str]:
    """Yield the clean logical lines of ``log`` one by one (flat memory).

    ``log`` is a path (str or PathLike), an open file (text or binary), or an iterable of lines (str or
    bytes; a single str is treated as a path, wrap text in a list or ``str.splitlines()``). Raises
    :class:`LogError` for a missing, unreadable or binary file.
    """
    if _is_pathlike(log):
        return _iter_file(Path(log))  # type: ignore[arg-type]
    if isinstance(log, io.TextIOBase):
        return _iter_text_stream(log)  # type: ignore[arg-type]
    if isinstance(log, (io.RawIOBase, io.BufferedIOBase)):
        return _iter_binary_stream(cast(IO[bytes], log))
    if isinstance(log, (bytes, bytearray)):
        raise LogError("pass log bytes as a list of lines or an io.BytesIO, not one bytes object")
    if not isinstance(log, Iterable):
        raise LogError(f"cannot read a log from {type(log).__name__}; pass a path or an iterable of lines")
    return _iter_iterable(log)
