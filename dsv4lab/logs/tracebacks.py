"""Traceback blocks: collecting a traceback's lines, frames and exception, one process at a time.

Tracebacks are the evidence of most failures and the hardest lines to read: ranks interleave them, pastes
lose their indentation or their first lines, a site logging format wraps every line, faulthandler dumps
use another frame format, and the exception line is often cut. The parser feeds each traceback line to
:class:`TracebackReader`, which keeps the head and the tail, the ``file:function`` frames (plus the call on
each frame's code line, so a traceback cut right after it still names the step) and the exception lines,
and turns the block into one :class:`~dsv4lab.logs.events.ErrorEvent` when the block ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dsv4lab.logs import patterns as P
from dsv4lab.logs.causes import classify_error_text, oom_figures, tier
from dsv4lab.logs.events import Engine, ErrorEvent, ErrorKind, OomFigures

__all__ = ["CHAIN", "DUMP", "TB_START", "Block", "TracebackReader"]

#: Lines of one traceback kept for evidence: the head and the tail (where the exception is).
_TB_HEAD = 8
_TB_TAIL = 48
#: Lines of exception message after the exception line (SGLang's hint block, wrapped messages).
_MSG_TAIL = 12
#: The lines that chain one traceback to the next: a chain is one error, its last exception the cause.
CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
#: The first line of a Python traceback.
TB_START = "Traceback (most recent call last)"
#: Python's faulthandler dump (an abort or a hang): one stack per thread, frames without the comma.
DUMP = ("Thread 0x", "Current thread 0x")
_TRAILING_NAME = re.compile(r"([A-Za-z_]\w*)$")


@dataclass
class Block:
    """A traceback being collected."""

    key: str
    line_no: int
    ts: str | None
    rank: int | None
    dp: int | None
    engine: Engine | None
    head: str | None
    head_lines: list[str] = field(default_factory=list)
    tail_lines: list[str] = field(default_factory=list)
    n_lines: int = 0
    frames: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    expect_code: bool = False
    after_exc: int = 0
    cut_call: tuple[int, str] | None = None  # (line count when seen, trailing name) of a code line without "("
    last_line_no: int = 0
    wrapped: bool = False  # each line carries an unknown prefix (a site logging format)

    def add(self, line: str) -> None:
        self.n_lines += 1
        if len(self.head_lines) < _TB_HEAD:
            self.head_lines.append(line)
            return
        self.tail_lines.append(line)
        if len(self.tail_lines) > _TB_TAIL * 2:
            del self.tail_lines[:_TB_TAIL]

    def lines(self) -> tuple[str, ...]:
        tail = self.tail_lines[-_TB_TAIL:]
        skipped = self.n_lines - len(self.head_lines) - len(tail)
        middle = [f"... ({skipped} traceback lines omitted) ..."] if skipped > 0 else []
        return tuple(self.head_lines + middle + tail)


#: Folders whose name says which step their files belong to, so a frame keeps them: vLLM's ``compilation/``
#: (``backends.py`` alone says nothing), both engines' weight loaders (``sglang/srt/model_loader/``,
#: ``vllm/model_executor/model_loader/``), SGLang's speculative workers and draft runners
#: (``sglang/srt/speculative/``) and vLLM's drafters (``vllm/v1/spec_decode/``).
_STEP_FOLDERS = ("compilation", "model_loader", "speculative", "spec_decode")


def _basename(path: str) -> str:
    """The file name, with its folder when that folder names a step (see ``_STEP_FOLDERS``)."""
    head, _, name = path.rpartition("/")
    folder = head.rpartition("/")[2]
    if folder in _STEP_FOLDERS:
        return f"{folder}/{name}"
    return name


class TracebackReader:
    """The traceback half of the parser (mixed into :class:`~dsv4lab.logs.parse.LogParser`)."""

    votes: dict[Engine, int]
    truncated: bool
    line_no: int

    def _continues(self, block: Block, text: str) -> bool:
        """Add ``text`` to ``block`` if it belongs to it; False means the block has ended before it."""
        if self._continues_block(block, text):
            block.last_line_no = self.line_no
            return True
        return False

    def _continues_block(self, block: Block, text: str) -> bool:
        if block.wrapped:
            return self._continues_wrapped(block, text)
        stripped = text.strip()
        if not stripped:
            block.add(text)
            return True
        if stripped.startswith(TB_START) or stripped.startswith(CHAIN) or stripped.startswith(DUMP):
            block.add(text)
            block.after_exc = 0
            block.expect_code = False
            return True
        fm = P.FRAME.match(text)
        if fm:
            block.add(text)
            block.frames.append(f"{_basename(fm.group('file'))}:{fm.group('func')}")
            block.expect_code = True
            block.after_exc = 0
            if "/sglang/" in fm.group("file"):
                self.votes[Engine.SGLANG] += 1
            elif "/vllm/" in fm.group("file"):
                self.votes[Engine.VLLM] += 1
            return True
        if text[:1] in (" ", "\t"):
            block.add(text)
            if block.expect_code:
                self._code_line(block, stripped)
            if 0 < block.after_exc < _MSG_TAIL:
                block.exceptions[-1] += " " + stripped
            return True
        if P.EXCEPTION_LINE.match(stripped):
            block.add(text)
            block.exceptions.append(stripped)
            block.expect_code = False
            block.after_exc = 1
            return True
        if block.expect_code:
            # A pasted traceback that lost its indentation: the line after a frame is its code.
            block.add(text)
            self._code_line(block, stripped)
            block.expect_code = False
            return True
        if block.after_exc and block.after_exc <= _MSG_TAIL and "%|" not in text:
            block.add(text)
            if stripped.startswith(("Possible solutions", "Possible suggestions")):
                block.after_exc = _MSG_TAIL  # SGLang's generic hint list: kept as evidence, never as cause
            elif block.after_exc < _MSG_TAIL:
                block.exceptions[-1] += " " + stripped
            block.after_exc += 1
            return True
        return False

    def _continues_wrapped(self, block: Block, text: str) -> bool:
        """A wrapped traceback: frames and the exception are searched for; a line after a frame is its code."""
        if TB_START in text:
            block.add(text)
            block.expect_code = False
            return True
        fm = P.FRAME_ANY.search(text)
        if fm:
            block.add(text)
            block.frames.append(f"{_basename(fm.group('file'))}:{fm.group('func')}")
            block.expect_code = True
            return True
        em = P.EXCEPTION_ANY.search(text)
        if em:
            block.add(text)
            block.exceptions.append(em.group(1).strip())
            block.expect_code = False
            block.after_exc = 1
            return True
        if block.expect_code:
            block.add(text)
            self._code_line(block, text.strip())
            return True
        return False

    @staticmethod
    def _code_line(block: Block, code: str) -> None:
        block.expect_code = False
        # Name the call on the frame's code line: a traceback cut right after it still says where it was.
        i = code.find("(")
        if i > 0:
            receiver, _, name = code[:i].rpartition(".")
            name = name.rsplit(" ", 1)[-1].strip()
            if name.isidentifier():
                block.frames.append(f"call:{name}")
                if receiver.endswith("model_runner"):
                    # vLLM's worker calling into its model runner: which of the runner's methods the worker
                    # calls (and from where) tells steps apart that share the method (see steps.py).
                    block.frames.append(f"call:model_runner.{name}")
        elif i < 0:
            m = _TRAILING_NAME.search(code)
            if m:  # possibly a call cut mid-name ("self.init_cu"); only trusted if the block ends here
                block.cut_call = (block.n_lines, m.group(1))

    def _finish(self, block: Block, at_eof: bool = False) -> ErrorEvent:
        lines = block.lines()
        # The log's very last line is this block's exception line: its message may be cut mid-sentence.
        cut = at_eof and bool(block.exceptions) and block.after_exc == 1 and block.last_line_no == self.line_no
        if not block.exceptions and block.cut_call is not None and block.cut_call[0] == block.n_lines:
            block.frames.append(f"cut:{block.cut_call[1]}")
        frames = tuple(block.frames)
        if block.exceptions:
            best = min(
                enumerate(block.exceptions),
                key=lambda ie: (tier(classify_error_text(ie[1])), -ie[0]),
            )[1]
            kind = classify_error_text(best)
            message = best
            complete = True
        else:
            kind = ErrorKind.UNKNOWN
            message = (block.head or "traceback") + " (cut off before its exception line)"
            complete = False
            self.truncated = True
        oom: OomFigures | None = None
        if kind is ErrorKind.OOM:
            oom = oom_figures(message)
            if oom is None:
                for exc in block.exceptions:
                    oom = oom_figures(exc)
                    if oom is not None:
                        break
            if oom is not None and oom.total_gib is not None and "total capacity of" in message:
                tail = message.split("total capacity of", 1)[1].strip()
                if tail and not any(u in tail for u in ("iB", "bytes")):
                    self.truncated = True
        return ErrorEvent(
            line_no=block.line_no,
            text=lines[0] if lines else "",
            ts=block.ts,
            rank=block.rank,
            dp=block.dp,
            engine=block.engine,
            kind=kind,
            message=message,
            traceback=lines,
            frames=frames,
            oom=oom,
            complete=complete,
            head=block.head,
            cut=cut,
        )
