"""Which engine wrote a log, from the lines themselves.

The launcher usually knows, but a pasted or downloaded log does not say; SGLang and vLLM differ in their
line prefixes and in their startup lines, so a few thousand lines decide it. Votes count only lines that
match an engine's own rules (a vLLM-formatted line inside an SGLang log, e.g. from an imported vLLM
module, matches none), and a log with many of both is reported as neither.
"""

from __future__ import annotations

from itertools import islice

from dsv4lab.logs.events import Engine
from dsv4lab.logs.parse import LogParser
from dsv4lab.logs.source import LogSource, iter_lines

__all__ = ["detect_engine", "engine_votes"]

#: Lines read before deciding; startup lines come first, so this is plenty.
DETECT_LINES = 20_000


def engine_votes(log: LogSource, max_lines: int = DETECT_LINES) -> dict[Engine, int]:
    """How many lines of the first ``max_lines`` look like each engine. Raises LogError for unreadable input."""
    parser = LogParser()
    feed = parser._line
    for line in islice(iter_lines(log), max_lines):
        feed(line)
    parser.close()
    return dict(parser.votes)


def detect_engine(log: LogSource, max_lines: int = DETECT_LINES) -> str | None:
    """``"sglang"``, ``"vllm"`` or None (no engine lines, both engines, or an unreadable log).

    Consumes up to ``max_lines`` of an iterable; pass a path to keep the log for a later parse.
    """
    from dsv4lab.logs.errors import LogError

    try:
        votes = engine_votes(log, max_lines)
    except LogError:
        return None
    sg, vl = votes[Engine.SGLANG], votes[Engine.VLLM]
    if sg == vl == 0:
        return None
    if sg >= 3 and vl >= 3 and min(sg, vl) >= 0.2 * max(sg, vl):
        return None
    return Engine.SGLANG.value if sg >= vl else Engine.VLLM.value
