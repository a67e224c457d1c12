"""The streaming parser: clean lines in, typed events out, one line at a time.

:class:`LogParser` keeps only what a line cannot be understood without: the traceback blocks still open
(one per writing process, since ranks interleave), the last timestamp (to notice a second run appended to
the same file) and engine votes. Everything else is emitted at once, so a multi-GB log parses in flat
memory. The live watcher feeds it line by line; :func:`parse_log` wraps it for files and line iterables.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator

from dsv4lab.logs import patterns as P
from dsv4lab.logs.causes import classify_error_text, oom_figures
from dsv4lab.logs.devices import parse_visible
from dsv4lab.logs.events import (
    DecodeBatch,
    DeviceMap,
    Engine,
    ErrorEvent,
    ErrorKind,
    Event,
    Phase,
    PhaseChange,
    PrefillBatch,
    RunStart,
    ServerArgs,
)
from dsv4lab.logs.serverargs import parse_server_args
from dsv4lab.logs.sglang import parse_progress_line, parse_sglang_message
from dsv4lab.logs.source import LogSource, iter_lines
from dsv4lab.logs.tracebacks import CHAIN, DUMP, TB_START, Block, TracebackReader
from dsv4lab.logs.vllm import VllmPrefix, parse_vllm_message, split_vllm_prefix

__all__ = ["LogParser", "parse_line", "parse_log"]

#: Timestamps that go back by more than this start a new run; less is rank interleaving jitter.
_REWIND_S = 120.0
_EMPTY: tuple[Event, ...] = ()
#: Substrings of vLLM messages worth reading when a paste lost the line prefix.
_BARE_MESSAGE_HINTS = ("took", "blocks:", "KV cache", "Memory profiling", "Graph capturing", "Maximum concurrency")
#: Substrings of a line that may report a failure on its own (checked only on unprefixed lines).
_BARE_FATAL_HINTS = (
    "rror",
    "out of memory",
    "max seq len",
    "Fatal Python",
    "undefined symbol",
    "No module named",
    "xception",
    "ailed",
    "already in use",
    "To serve at least",
)
#: torch's standard advice after a CUDA error: it names assertions and errors without being one.
_HINT_LINES = ("CUDA kernel errors might be", "For debugging consider", "Compile with `TORCH_USE", "Search for `")


def _ts_seconds(ts: str) -> float | None:
    """Seconds of an SGLang (``YYYY-MM-DD HH:MM:SS``) or vLLM (``MM-DD HH:MM:SS``) timestamp."""
    try:
        if len(ts) >= 19 and ts[4] == "-":
            return _dt.datetime.strptime(ts[:19], "%Y-%m-%d %H:%M:%S").timestamp()
        return _dt.datetime.strptime("2000-" + ts[:14], "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return None


_LATEST = "9999-19-39 29:59:59"


class LogParser(TracebackReader):
    """Incremental parser: :meth:`feed` one raw line, get the events it completes; :meth:`close` at EOF.

    Lines may still carry ANSI codes and ``\\r`` (they are cleaned here); one call may return events of
    earlier lines (a traceback is emitted when the line after it arrives).
    """

    def __init__(self) -> None:
        self.line_no = 0
        self.votes: dict[Engine, int] = {Engine.SGLANG: 0, Engine.VLLM: 0}
        self.truncated = False  # a line cut mid-prefix or a traceback without its exception was seen
        self._blocks: dict[str, Block] = {}
        self._bare: Block | None = None
        self._last_ts: str | None = None
        self._last_ts_engine: Engine | None = None
        self._server_args_seen = False
        self._content_since_start = 0
        # A ready line was parsed and no request has been served since: the next HTTP request line is the
        # evidence that the server is serving (one event, so a serving log's access lines stay cheap).
        self._await_request = False

    # -- public -------------------------------------------------------------------------------------------

    def feed(self, raw: str) -> tuple[Event, ...]:
        """Parse one raw line (which may hold several ``\\r`` updates)."""
        if "\x1b" in raw or "\r" in raw or raw.endswith("\n"):
            out: list[Event] = []
            for line in _clean(raw):
                out.extend(self._line(line))
            return tuple(out)
        return self._line(raw)

    def close(self) -> tuple[Event, ...]:
        """Flush open tracebacks (a log cut inside one gives an event with ``complete=False``)."""
        out: list[Event] = []
        if self._bare is not None:
            out.append(self._finish(self._bare, at_eof=True))
            self._bare = None
        for key in list(self._blocks):
            out.append(self._finish(self._blocks.pop(key), at_eof=True))
        return tuple(out)

    @property
    def engine(self) -> Engine | None:
        """The engine with the most votes so far (None when neither has any)."""
        sg, vl = self.votes[Engine.SGLANG], self.votes[Engine.VLLM]
        if sg == vl == 0:
            return None
        return Engine.SGLANG if sg >= vl else Engine.VLLM

    # -- one clean line --------------------------------------------------------------------------------------

    def _line(self, line: str) -> tuple[Event, ...]:
        self.line_no += 1
        n = self.line_no
        c = line[:1]
        if c == "[":
            if line[1:2].isdigit():
                pre = P.split_sglang_prefix(line)
                if pre is not None:
                    if "T" in pre[0]:  # an ISO timestamp added by CI / container tooling
                        inner = P.FOREIGN_WRAPPER.sub("", line, count=1)
                        if inner != line:
                            self.line_no -= 1
                            return self._line(inner)
                    return self._sglang(line, pre, n)
                m = P.PARTIAL_PREFIX.match(line)
                if m:
                    return self._fragment(m.group(1), n)
                if line[3:4] == ":":
                    old = self._old_sglang(line, n)
                    if old is not None:
                        return old
            elif line.startswith(("[gpu_id=", "[rank=")):
                old = self._old_sglang(line, n)
                if old is not None:
                    return old
            else:
                vp = split_vllm_prefix(line)  # "[rank0]: ..." and a VLLM_LOGGING_PREFIX like "[Stage-1] INFO ..."
                if vp is not None:
                    return self._vllm(line, vp, n)
                if line[1:2].isupper():
                    old = self._old_sglang(line, n)
                    if old is not None:
                        return old
        elif c == "(" or (c and c in "DIWEC"):
            vp = split_vllm_prefix(line)
            if vp is not None:
                return self._vllm(line, vp, n)
        elif c and c not in " \t" and "| " in line[:50]:
            inner = P.FOREIGN_WRAPPER.sub("", line, count=1)
            if inner != line:
                self.line_no -= 1
                return self._line(inner)
        return self._bare_line(line, n)

    def _sglang(self, line: str, pre: P.SglangPrefix, n: int) -> tuple[Event, ...]:
        ts, rank, dp, msg = pre
        last = self._last_ts
        if self._bare is not None or (last is not None and ts < last):
            return self._sglang_slow(line, pre, n)
        if ts != last:
            self._last_ts = ts
            self._last_ts_engine = Engine.SGLANG
        # The commonest lines of a serving log, without a call.
        c0 = msg[:1]
        ev: Event | None
        if c0 == "D" and msg.startswith("Decode batch"):
            ev = DecodeBatch.fast(n, line, ts, rank, dp, Engine.SGLANG)
        elif c0 == "P" and msg.startswith("Prefill batch"):
            ev = PrefillBatch.fast(n, line, ts, rank, dp, Engine.SGLANG)
        elif c0 == "I" and msg.startswith("INFO:") and "Uvicorn" not in msg and "startup" not in msg:
            if self._await_request and P.is_request(msg):
                return self._request(n, line, ts, rank, dp, Engine.SGLANG)
            return _EMPTY  # uvicorn access log
        else:
            if TB_START in msg or msg.startswith("server_args="):
                return self._sglang_slow(line, pre, n)
            ev = parse_sglang_message(msg, n, line, ts, rank, dp)
            if ev is None:
                return _EMPTY
            if isinstance(ev, PhaseChange) and ev.ready:
                self._await_request = True
        self.votes[Engine.SGLANG] += 1
        self._content_since_start += 1
        return (ev,) if ev is not None else _EMPTY

    def _sglang_slow(self, line: str, pre: P.SglangPrefix, n: int) -> tuple[Event, ...]:
        ts, rank, dp, msg = pre
        out: list[Event] = []
        if self._bare is not None:
            out.append(self._finish(self._bare))
            self._bare = None
        last = self._last_ts
        if last is not None and ts < last and self._last_ts_engine is Engine.SGLANG:
            t_new, t_last = _ts_seconds(ts), _ts_seconds(last)
            if t_new is not None and t_last is not None and t_last - t_new > _REWIND_S:
                out.append(self._run_start(n, line, ts, "timestamps go back: a new run starts"))
        if last is None or ts > last or out:
            self._last_ts = ts
            self._last_ts_engine = Engine.SGLANG
        if TB_START in msg:
            self._bare = Block(
                key="bare",
                line_no=n,
                ts=ts,
                rank=rank,
                dp=dp,
                engine=Engine.SGLANG,
                head=msg.split(TB_START, 1)[0].rstrip(": ").strip() or None,
            )
            self._bare.add(line)
            self.votes[Engine.SGLANG] += 1
            return tuple(out)
        if msg.startswith("server_args="):
            out.extend(self._server_args(msg[len("server_args=") :], n, line, ts, rank, dp, Engine.SGLANG))
            return tuple(out)
        if self._await_request and msg.startswith("INFO:") and P.is_request(msg):
            out.extend(self._request(n, line, ts, rank, dp, Engine.SGLANG))
            return tuple(out)
        ev = parse_sglang_message(msg, n, line, ts, rank, dp)
        if ev is not None:
            if isinstance(ev, PhaseChange) and ev.ready:
                self._await_request = True
            self.votes[Engine.SGLANG] += 1
            self._content_since_start += 1
            out.append(ev)
        return tuple(out) if out else _EMPTY

    def _old_sglang(self, line: str, n: int) -> tuple[Event, ...] | None:
        """SGLang before 0.4 (``[23:17:01 TP7]``, ``[gpu_id=0]``, ``[rank=1]``) or a paste that dropped the
        timestamp (``[TP0] msg``): short logs, no fast path."""
        m = P.OLD_SGLANG_PREFIX.match(line)
        if m is None:
            return None
        rank: int | None = None
        dp: int | None = None
        tags = m.group("tags") or m.group("only")
        if tags:
            rank, dp = P.parse_tags(" " + tags)
        for g in ("gpu", "rank"):
            if m.group(g) is not None:
                rank = int(m.group(g))
        ts, msg = m.group("time"), m.group("msg")
        out: list[Event] = []
        if self._bare is not None:
            out.append(self._finish(self._bare))
            self._bare = None
        if TB_START in msg:
            head = msg.split(TB_START, 1)[0].rstrip(": ").strip() or None
            self._bare = Block(key="bare", line_no=n, ts=ts, rank=rank, dp=dp, engine=Engine.SGLANG, head=head)
            self._bare.add(line)
            self.votes[Engine.SGLANG] += 1
            return tuple(out)
        ev = parse_sglang_message(msg, n, line, ts, rank, dp)
        if ev is not None:
            if isinstance(ev, PhaseChange) and ev.ready:
                self._await_request = True
            self.votes[Engine.SGLANG] += 1
            self._content_since_start += 1
            out.append(ev)
        return tuple(out)

    def _vllm(self, line: str, vp: VllmPrefix, n: int) -> tuple[Event, ...]:
        key = vp.key
        block = self._blocks.get(key)
        msg = vp.msg
        out: list[Event] = []
        if block is not None:
            if self._continues(block, msg):
                return _EMPTY
            out.append(self._finish(self._blocks.pop(key)))
        if vp.ts is not None:
            last = self._last_ts
            if last is not None and self._last_ts_engine is Engine.VLLM and vp.ts < last:
                t_new, t_last = _ts_seconds(vp.ts), _ts_seconds(last)
                if t_new is not None and t_last is not None and t_last - t_new > _REWIND_S:
                    out.append(self._run_start(n, line, vp.ts, "timestamps go back: a new run starts"))
            if last is None or vp.ts > last or self._last_ts_engine is not Engine.VLLM:
                self._last_ts = vp.ts
                self._last_ts_engine = Engine.VLLM
        if TB_START in msg:
            b = Block(key=key, line_no=n, ts=vp.ts, rank=vp.rank, dp=vp.dp, engine=Engine.VLLM, head=None)
            b.add(line)
            self._blocks[key] = b
            return tuple(out)
        if msg.startswith("non-default args:") or msg.startswith("args:"):
            body = msg.split(":", 1)[1].strip()
            out.extend(self._server_args(body, n, line, vp.ts, vp.rank, vp.dp, Engine.VLLM))
            return tuple(out)
        if vp.level is None and (msg.startswith("Capturing") or msg.startswith("Loading safetensors")):
            ev = parse_progress_line(msg, n)
        elif vp.level is None and "Capturing " in msg:  # a tqdm bar glued to a nested tag (Ray Serve)
            ev = parse_progress_line(msg[msg.index("Capturing ") :], n)
        elif self._await_request and vp.level is None and msg.startswith("INFO:") and P.is_request(msg):
            out.extend(self._request(n, line, vp.ts, vp.rank, vp.dp, Engine.VLLM))
            return tuple(out)
        else:
            ev = parse_vllm_message(vp, n, line)
            if isinstance(ev, PhaseChange) and ev.ready:
                self._await_request = True
        if ev is not None:
            self.votes[Engine.VLLM] += 1
            self._content_since_start += 1
            out.append(ev)
        elif P.FRAME.match(msg):  # a traceback whose "Traceback" line is above the excerpt
            blk = Block(key=key, line_no=n, ts=vp.ts, rank=vp.rank, dp=vp.dp, engine=Engine.VLLM, head=None)
            self._blocks[key] = blk
            self._continues(blk, msg)
        elif vp.level == "ERROR" and msg.startswith("    ") and "(" in msg:
            # vLLM logs a worker's traceback one ERROR record per line: an indented record is a frame's code
            # line whose frame line is above the excerpt. Its call still names the step.
            blk = Block(key=key, line_no=n, ts=vp.ts, rank=vp.rank, dp=vp.dp, engine=Engine.VLLM, head=None)
            blk.expect_code = True
            self._blocks[key] = blk
            self._continues(blk, msg)
        return tuple(out) if out else _EMPTY

    def _bare_line(self, line: str, n: int) -> tuple[Event, ...]:
        block = self._bare
        if block is not None:
            if self._continues(block, line):
                return _EMPTY
            ev0 = self._finish(block)
            self._bare = None
            return (ev0, *self._bare_line_new(line, n))
        return self._bare_line_new(line, n)

    def _bare_line_new(self, line: str, n: int) -> tuple[Event, ...]:
        if line.startswith(TB_START) or line.startswith(CHAIN) or line.startswith(DUMP) or P.FRAME.match(line):
            self._bare = Block(key="bare", line_no=n, ts=None, rank=None, dp=None, engine=None, head=None)
            self._continues(self._bare, line)
            return _EMPTY
        if self._await_request and line.startswith("INFO:") and P.is_request(line):
            # vLLM's uvicorn access lines carry no prefix.
            return self._request(n, line, None, None, None, None)
        if line.startswith("usage: "):
            return (_usage_error(line, n),)
        if "VISIBLE_DEVICES" in line:
            visible = parse_visible(line)
            if visible is not None:
                return (DeviceMap(line_no=n, text=line, visible=visible),)
        if line.startswith(("Capturing", "Loading safetensors", "Loading pt")):
            ev = parse_progress_line(line, n)
            if ev is not None:
                self._content_since_start += 1
                return (ev,)
            return _EMPTY
        m = P.EXCEPTION_LINE.match(line)
        if m:
            kind = classify_error_text(line)
            if kind is not ErrorKind.OTHER or line.startswith(("RuntimeError", "Exception", "ValueError")):
                return (_bare_error(line, n, kind),)
        e = P.EMBEDDED.search(line)
        if e is not None and e.start() > 0:  # an engine line behind an unknown wrapper: read the engine line
            self.line_no -= 1
            return self._line(line[e.start() :])
        if line.startswith(("new fill batch", "#running-req:")):  # SGLang 0.1's serving lines
            self.votes[Engine.SGLANG] += 1
            self._content_since_start += 1
            batch = PrefillBatch if line[0] == "n" else DecodeBatch
            return (batch.fast(n, line, None, None, None, Engine.SGLANG),)
        if any(h in line for h in _BARE_MESSAGE_HINTS):
            # A vLLM message whose prefix the user cut off when pasting.
            ev = parse_vllm_message(VllmPrefix("bare", None, None, None, None, line), n, line)
            if isinstance(ev, PhaseChange) and ev.ready:
                self._await_request = True
            if ev is not None and not isinstance(ev, ErrorEvent):
                self.votes[Engine.VLLM] += 1
                self._content_since_start += 1
                return (ev,)
        if any(h in line for h in _BARE_FATAL_HINTS) and not line.lstrip().startswith(_HINT_LINES):
            # An error printed outside any logger or traceback: C++ CUDA errors, uvicorn, runpy, a cut prefix.
            kind = classify_error_text(line)
            if kind is not ErrorKind.OTHER:
                return (_bare_error(line, n, kind),)
            if line.startswith("Fatal Python error"):
                return (_bare_error(line, n, ErrorKind.OTHER),)
        i = line.find(TB_START)
        if i > 0 or (i < 0 and P.FRAME_ANY.search(line)):
            # A traceback behind a wrapper (a site logging format): its frames and exception are found anywhere.
            head = line[:i].rstrip(": ").strip()[-80:] if i > 0 else None
            self._bare = Block(key="bare", line_no=n, ts=None, rank=None, dp=None, engine=None, head=head or None)
            self._bare.wrapped = True
            self._continues(self._bare, line)
        return _EMPTY

    # -- runs and arguments ------------------------------------------------------------------------------

    def _fragment(self, partial: str, n: int) -> tuple[Event, ...]:
        """A line cut inside its timestamp. If even its latest completion is long before the last
        timestamp, a different (earlier) run was pasted after this one: the previous run ended here."""
        self.truncated = True
        out: list[Event] = []
        if self._bare is not None:
            out.append(self._finish(self._bare))
            self._bare = None
        last = self._last_ts
        if last is not None and self._last_ts_engine is Engine.SGLANG:
            latest = partial.rstrip() + _LATEST[len(partial.rstrip()) :]
            b = _ts_seconds(last)
            if b is not None:
                cutoff = _dt.datetime.fromtimestamp(b - _REWIND_S).strftime("%Y-%m-%d %H:%M:%S")
                if latest < cutoff:
                    out.append(self._run_start(n, "[" + partial, partial, "timestamps go back: another run follows"))
        return tuple(out)

    def _request(
        self, n: int, line: str, ts: str | None, rank: int | None, dp: int | None, engine: Engine | None
    ) -> tuple[Event, ...]:
        self._await_request = False
        return (
            PhaseChange(
                line_no=n, text=line, ts=ts, rank=rank, dp=dp, engine=engine, phase=Phase.SERVING, what=P.REQUEST_SERVED
            ),
        )

    def _run_start(self, n: int, line: str, ts: str, reason: str) -> RunStart:
        self._content_since_start = 0
        self._server_args_seen = False
        self._await_request = False
        return RunStart(line_no=n, text=line, ts=ts, reason=reason)

    def _server_args(
        self, body: str, n: int, line: str, ts: str | None, rank: int | None, dp: int | None, engine: Engine
    ) -> list[Event]:
        out: list[Event] = []
        if self._server_args_seen and self._content_since_start > 0:
            out.append(self._run_start(n, line, ts or "", "the server was launched again"))
        self._server_args_seen = True
        args = parse_server_args(body)
        self.votes[engine] += 3
        out.append(ServerArgs.from_mapping(args, line_no=n, text=line[:2000], ts=ts, rank=rank, dp=dp, engine=engine))
        return out


def _bare_error(line: str, n: int, kind: ErrorKind) -> ErrorEvent:
    return ErrorEvent(
        line_no=n,
        text=line,
        kind=kind,
        message=line,
        traceback=(line,),
        oom=oom_figures(line) if kind is ErrorKind.OOM else None,
    )


def _usage_error(line: str, n: int) -> ErrorEvent:
    """argparse's usage block (``usage: PROG [-h] ...``): printed by ``parse_args`` when it rejects the command
    line (and by ``--help``). The ``PROG: error: ...`` line after it is the decisive one; when the excerpt
    stops before it, the usage line still says the launch died parsing its arguments."""
    return ErrorEvent(
        line_no=n,
        text=line,
        kind=ErrorKind.UNKNOWN,
        message="argparse printed its usage block (the error line after it is not in the log)",
        traceback=(line,),
        frames=("argparse.py:print_usage",),
        complete=False,
        head="argument parsing",
    )


def _clean(raw: str) -> Iterator[str]:
    from dsv4lab.logs.source import clean_line

    if "\n" in raw.rstrip("\r\n"):
        for part in raw.splitlines():
            yield from clean_line(part)
    else:
        yield from clean_line(raw)


def parse_line(line: str, line_no: int = 0) -> Event | None:
    """Stateless single-line parse (no traceback grouping): the event one line carries, or None.

    For one-off checks and the live watcher; use :class:`LogParser` or :func:`parse_log` for whole logs.
    """
    parser = LogParser()
    parser.line_no = line_no - 1 if line_no > 0 else 0
    events = parser.feed(line) + parser.close()
    return events[0] if events else None


def parse_log(log: LogSource) -> Iterator[Event]:
    """All events of a log, streaming (flat memory). ``log`` is a path or an iterable of lines.

    Raises :class:`~dsv4lab.logs.errors.LogError` if the file is missing, unreadable or binary.
    """
    parser = LogParser()
    feed = parser._line  # lines from iter_lines are already clean
    for line in iter_lines(log):
        events = feed(line)
        if events:
            yield from events
    yield from parser.close()
