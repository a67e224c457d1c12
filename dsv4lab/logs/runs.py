"""One verdict on a log: did the server come up, and if not, where and why, and what to change.

The question a user asks after a failed launch is "what do I change?", so :func:`diagnose` answers with
the outcome, the startup phase, the root cause in one sentence, the evidence lines and ranked fixes whose
arithmetic uses the log's own numbers. Memory is blamed only when an error *says* memory: a missing
kernel, a network/NCCL failure, an import or compile error wrapped in SGLang's "Capture cuda graph failed"
is a crash, however little memory was free. A log knows nothing about the process, so a file that stops
mid-startup is ``unknown``, never "stalled" (the watcher adds liveness). Bad input (empty, binary, foreign,
mixed engines) gives outcome ``unknown`` with the reason, never an exception.

This module streams the events into run states and picks the run to judge; :mod:`~dsv4lab.logs.judge`
reads the verdict, :mod:`~dsv4lab.logs.verdict` holds its contract.
"""

from __future__ import annotations

from collections.abc import Iterator

from dsv4lab.counts import plural
from dsv4lab.logs.errors import LogError
from dsv4lab.logs.events import Engine, Event, RunStart
from dsv4lab.logs.judge import judge
from dsv4lab.logs.parse import LogParser
from dsv4lab.logs.source import LogSource, iter_lines
from dsv4lab.logs.state import RunState
from dsv4lab.logs.verdict import Diagnosis, Outcome, unknown

__all__ = ["Diagnosis", "Outcome", "diagnose", "diagnose_events"]


# -- the public entry points ---------------------------------------------------------------------------------


def diagnose(log: LogSource) -> Diagnosis:
    """Diagnose a log: a path (str / PathLike), an open file, or an iterable of lines. Never raises for bad
    input: unreadable, empty, binary, foreign or mixed-engine logs give outcome ``unknown`` and the reason."""
    try:
        lines = iter_lines(log)
        parser = LogParser()
        return _diagnose_stream(_events(parser, lines), parser)
    except LogError as exc:
        return unknown(f"The log cannot be read: {exc}.")
    except UnicodeError as exc:  # pragma: no cover - decoding uses errors="replace"
        return unknown(f"The log is not text: {exc}.")


def diagnose_events(events: Iterator[Event] | list[Event], truncated: bool = False) -> Diagnosis:
    """Diagnose already-parsed events (e.g. from a watcher's :class:`LogParser`)."""
    parser = LogParser()
    parser.truncated = truncated
    for ev in events:
        if ev.engine is not None:
            parser.votes[ev.engine] += 1
    return _diagnose_stream(iter(events), parser)


def _events(parser: LogParser, lines: Iterator[str]) -> Iterator[Event]:
    feed = parser._line
    for line in lines:
        evs = feed(line)
        if evs:
            yield from evs
    yield from parser.close()


def _diagnose_stream(events: Iterator[Event], parser: LogParser) -> Diagnosis:
    run = RunState()
    previous: RunState | None = None
    add = run.add
    for ev in events:
        if type(ev) is RunStart:
            if run.content > 0:
                run.followed_by_run = True
                previous = run
            run = RunState()
            add = run.add
            continue
        add(ev)
    lines = parser.line_no
    chosen = run
    notes: list[str] = []
    if run.content <= 0 and previous is not None:
        chosen = previous
        notes.append("The log continues with a fragment of another run; this verdict is about the run before it.")
    elif previous is not None:
        notes.append("The log holds more than one run; this verdict is about the last one.")
    if lines == 0:
        return unknown("The log is empty.", 0)
    sg, vl = parser.votes[Engine.SGLANG], parser.votes[Engine.VLLM]
    if sg >= 3 and vl >= 3 and min(sg, vl) >= 0.2 * max(sg, vl):
        return unknown(
            f"The log mixes SGLang ({plural(sg, 'line')}) and vLLM ({plural(vl, 'line')}) output; "
            "split it into one log per server.",
            lines,
        )
    engine = parser.engine
    if engine is None and chosen.content <= 0 and not chosen.errors:
        return unknown(
            f"No SGLang or vLLM log lines were found in {plural(lines, 'line')}; is this a server log?", lines
        )
    return judge(chosen, engine, parser.truncated, lines, notes)
