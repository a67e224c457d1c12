"""One verdict on a log: did the server come up, and if not, where and why, and what to change.

The question a user asks after a failed launch is "what do I change?", so :func:`diagnose` answers with
the outcome, the startup phase, the root cause in one sentence, the evidence lines and ranked fixes whose
arithmetic uses the log's own numbers. Memory is blamed only when an error *says* memory: a missing
kernel, a network/NCCL failure, an import or compile error wrapped in SGLang's "Capture cuda graph failed"
is a crash, however little memory was free. A log knows nothing about the process, so "stalled" only says
the log stopped mid-phase; the watcher adds liveness. Bad input (empty, binary, foreign, mixed engines)
gives outcome ``unknown`` with the reason, never an exception.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dsv4lab.logs.causes import MEMORY_KINDS, MODEL_INIT_FRAMES, frame_phase, tier
from dsv4lab.logs.errors import LogError
from dsv4lab.logs.events import Engine, ErrorEvent, ErrorKind, Event, OomFigures, Phase, RunStart
from dsv4lab.logs.fixes import Fix, MemoryFacts, fixes_for
from dsv4lab.logs.parse import LogParser
from dsv4lab.logs.patterns import CURRENT_FRACTION
from dsv4lab.logs.source import LogSource, iter_lines
from dsv4lab.logs.state import RankState, RunState

__all__ = ["Diagnosis", "Outcome", "diagnose", "diagnose_events"]

_MAX_EVIDENCE = 60
_MAX_EVIDENCE_CHARS = 600
#: Phases where a failure whose message is lost is most likely memory (the fit test's breaking terms).
_MEMORY_PHASES = (Phase.KV_CACHE_ALLOC, Phase.CUDA_GRAPH_CAPTURE, Phase.DRAFT_CUDA_GRAPH_CAPTURE)
_PHASE_WORDS = {
    Phase.STARTUP_OTHER: "startup (distributed init / setup)",
    Phase.WEIGHT_LOADING: "weight loading",
    Phase.KV_CACHE_ALLOC: "KV-cache allocation",
    Phase.CUDA_GRAPH_CAPTURE: "CUDA graph capture",
    Phase.DRAFT_CUDA_GRAPH_CAPTURE: "draft-model CUDA graph capture",
    Phase.WARMUP: "warmup",
    Phase.SERVING: "serving",
}


class Outcome(str, Enum):
    """How a run ended, as far as the log can tell."""

    READY = "ready"
    OOM = "oom"
    CRASH = "crash"
    STALLED = "stalled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one log (its last run). ``to_dict()`` is the JSON contract scripts rely on."""

    engine: Engine | None
    outcome: Outcome
    phase: Phase | None
    cause: str
    confidence: float
    gpu: int | None = None
    rank: int | None = None
    tried_to_allocate_gib: float | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    evidence: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()
    truncated: bool = False
    notes: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    lines_read: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: engine, outcome, phase, gpu, tried_to_allocate_gib, free_gib, total_gib,
        cause, evidence, fixes [{change, why}], confidence (+ rank, truncated, notes, figures, lines_read)."""
        return {
            "engine": self.engine.value if self.engine else None,
            "outcome": self.outcome.value,
            "phase": self.phase.value if self.phase else None,
            "gpu": self.gpu,
            "rank": self.rank,
            "tried_to_allocate_gib": _round(self.tried_to_allocate_gib),
            "free_gib": _round(self.free_gib),
            "total_gib": _round(self.total_gib),
            "cause": self.cause,
            "evidence": list(self.evidence),
            "fixes": [f.to_dict() for f in self.fixes],
            "confidence": round(self.confidence, 2),
            "truncated": self.truncated,
            "notes": list(self.notes),
            "figures": {k: _round(v) if isinstance(v, float) else v for k, v in self.figures.items()},
            "lines_read": self.lines_read,
        }

    def _repr_html_(self) -> str:
        colour = {
            Outcome.READY: "#1a7f37",
            Outcome.OOM: "#cf222e",
            Outcome.CRASH: "#cf222e",
            Outcome.STALLED: "#9a6700",
            Outcome.UNKNOWN: "#57606a",
        }[self.outcome]
        e = html.escape
        rows = [
            ("engine", self.engine.value if self.engine else "—"),
            ("phase", self.phase.value if self.phase else "—"),
            ("confidence", f"{self.confidence:.2f}" + (" (log truncated)" if self.truncated else "")),
        ]
        if self.gpu is not None:
            rows.append(("GPU", str(self.gpu)))
        for label, value in (
            ("tried to allocate", self.tried_to_allocate_gib),
            ("free", self.free_gib),
            ("total", self.total_gib),
        ):
            if value is not None:
                rows.append((label, f"{value:.2f} GiB"))
        table = "".join(f"<tr><th style='text-align:left'>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows)
        fixes = "".join(f"<li><code>{e(f.change)}</code> — {e(f.why)}</li>" for f in self.fixes)
        notes = "".join(f"<li>{e(n)}</li>" for n in self.notes)
        evidence = e("\n".join(self.evidence))
        return (
            f"<div><p><b style='color:{colour}'>{e(self.outcome.value.upper())}</b> {e(self.cause)}</p>"
            f"<table>{table}</table>"
            + (f"<p><b>Fixes</b></p><ol>{fixes}</ol>" if fixes else "")
            + (f"<p><b>Notes</b></p><ul>{notes}</ul>" if notes else "")
            + (f"<details><summary>evidence ({len(self.evidence)} lines)</summary><pre>{evidence}</pre></details>")
            + "</div>"
        )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _unknown(cause: str, lines: int = 0, engine: Engine | None = None, notes: tuple[str, ...] = ()) -> Diagnosis:
    return Diagnosis(
        engine=engine, outcome=Outcome.UNKNOWN, phase=None, cause=cause, confidence=0.0, lines_read=lines, notes=notes
    )


# -- the public entry points ---------------------------------------------------------------------------------


def diagnose(log: LogSource) -> Diagnosis:
    """Diagnose a log: a path (str / PathLike), an open file, or an iterable of lines. Never raises for bad
    input: unreadable, empty, binary, foreign or mixed-engine logs give outcome ``unknown`` and the reason."""
    try:
        lines = iter_lines(log)
        parser = LogParser()
        return _diagnose_stream(_events(parser, lines), parser)
    except LogError as exc:
        return _unknown(f"The log cannot be read: {exc}.")
    except UnicodeError as exc:  # pragma: no cover - decoding uses errors="replace"
        return _unknown(f"The log is not text: {exc}.")


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
    for ev in events:
        if isinstance(ev, RunStart):
            if run.content > 0:
                run.followed_by_run = True
                previous = run
            run = RunState()
            continue
        run.add(ev)
    lines = parser.line_no
    chosen = run
    notes: list[str] = []
    if run.content <= 0 and previous is not None:
        chosen = previous
        notes.append("The log continues with a fragment of another run; this verdict is about the run before it.")
    elif previous is not None:
        notes.append("The log holds more than one run; this verdict is about the last one.")
    if lines == 0:
        return _unknown("The log is empty.", 0)
    sg, vl = parser.votes[Engine.SGLANG], parser.votes[Engine.VLLM]
    if sg >= 3 and vl >= 3 and min(sg, vl) >= 0.2 * max(sg, vl):
        return _unknown(
            f"The log mixes SGLang ({sg} lines) and vLLM ({vl} lines) output; split it into one log per server.",
            lines,
        )
    engine = parser.engine
    if engine is None and chosen.content <= 0 and not chosen.errors:
        return _unknown(f"No SGLang or vLLM log lines were found in {lines} lines; is this a server log?", lines)
    return _judge(chosen, engine, parser.truncated, lines, notes)


# -- the verdict -------------------------------------------------------------------------------------------


def _survived(run: RunState, err: ErrorEvent) -> bool:
    """An error the server lived through: it became ready or kept serving, or the same rank made progress."""
    if run.ready_line > err.line_no or run.last_batch_line > err.line_no:
        return True
    if err.kind in (ErrorKind.TEARDOWN, ErrorKind.HOST_KILL):
        return False
    if err.rank is not None or (err.text and err.text.startswith("[")):
        st = run.ranks.get(err.rank)
        if st is not None and st.last_progress_line > err.line_no and st.last_progress is not None:
            return True
    return False


def _root(run: RunState) -> tuple[ErrorEvent | None, list[ErrorEvent]]:
    live = [e for e in run.errors if not _survived(run, e)]
    if not live:
        return None, []
    return min(live, key=lambda e: (tier(e.kind), e.line_no)), live


def _facts(run: RunState, rank: int | None, engine: Engine | None, oom: OomFigures | None) -> MemoryFacts:
    ranks = [st for st in run.ranks.values()]
    mine: RankState | None = run.ranks.get(rank) if rank is not None else None

    def pick(attr: str) -> float | None:
        if mine is not None and getattr(mine, attr) is not None:
            return float(getattr(mine, attr))
        vals = [getattr(st, attr) for st in ranks if getattr(st, attr) is not None]
        return float(min(vals)) if vals else None

    args = run.server_args
    fraction: float | None = None
    from_log = False
    max_bs = run.max_bs_seen
    tp = context = steps = drafts = None
    kv_dtype = None
    if args is not None:
        key = "gpu_memory_utilization" if engine is Engine.VLLM else "mem_fraction_static"
        v = args.get(key)
        if isinstance(v, (int, float)):
            fraction, from_log = float(v), True
        for k in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
            b = args.get(k)
            if isinstance(b, int):
                max_bs = b
                break
        t = args.get("tp_size", args.get("tensor_parallel_size"))
        tp = t if isinstance(t, int) else None
        c = args.get("context_length", args.get("max_model_len"))
        context = c if isinstance(c, int) else None
        s = args.get("speculative_num_steps")
        steps = s if isinstance(s, int) else None
        d = args.get("speculative_num_draft_tokens")
        drafts = d if isinstance(d, int) else None
        kd = args.get("kv_cache_dtype")
        kv_dtype = kd if isinstance(kd, str) else None
    if fraction is None and engine is Engine.VLLM and run.vllm_util is not None:
        fraction, from_log = run.vllm_util, True
    pre, post, pool_end = pick("pre"), pick("post"), pick("pool_end")
    if fraction is None:
        for err in run.errors:
            m = CURRENT_FRACTION.search(err.message)
            if m:
                fraction, from_log = float(m.group(1)), True
                break
    if fraction is None and engine is not Engine.VLLM and pre and pool_end is not None:
        fraction = round(1 - pool_end / pre, 3)
    if tp is None and run.max_rank is not None:
        tp = run.max_rank + 1
    graphs_vals = [st.graphs for st in ([mine] if mine else ranks) if st.graphs]
    if pre is None and post is not None:
        w = pick("weights")
        pre = post + w if w is not None else None
    total = oom.total_gib if oom and oom.total_gib is not None else run.vllm_total
    return MemoryFacts(
        pre=pre,
        post=post,
        weights=pick("weights"),
        kv=pick("kv") if engine is not Engine.VLLM else run.vllm_kv,
        slack_now=pool_end,
        capture_avail=pick("capture_avail"),
        graphs=max(graphs_vals) if graphs_vals else None,
        runtime_headroom=run.capacity.available_gib if run.capacity else None,
        fraction=fraction,
        fraction_from_log=from_log,
        max_bs=max_bs,
        tp=tp,
        context=context or (run.capacity.context_len if run.capacity else None),
        kv_dtype=kv_dtype,
        spec_steps=steps,
        spec_draft_tokens=drafts,
        new_flags=run.new_style,
        total=total,
    )


def _error_phase(run: RunState, err: ErrorEvent) -> tuple[Phase, bool]:
    """(phase, guessed) for a failure: the message, then the traceback frames, then the rank's progress."""
    msg = err.message
    if err.kind is ErrorKind.KV_BUDGET:
        return Phase.KV_CACHE_ALLOC, False
    if err.kind is ErrorKind.KV_EXHAUSTED:
        return Phase.SERVING, False
    st = run.ranks.get(err.rank)
    state_phase = (st.phase if st is not None and st.phase is not None else None) or run.phase
    if run.ready_line and run.ready_line < err.line_no:
        return Phase.SERVING, False
    from_frames = frame_phase(err.frames)
    if "Capture cuda graph failed" in msg or "graph capture failed" in msg.lower():
        if from_frames is Phase.DRAFT_CUDA_GRAPH_CAPTURE or state_phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE:
            return Phase.DRAFT_CUDA_GRAPH_CAPTURE, False
        return Phase.CUDA_GRAPH_CAPTURE, False
    if "warmup error" in msg or (err.head and "warmup" in err.head):
        return Phase.WARMUP, False
    if from_frames is not None and not (from_frames is Phase.SERVING and not run.ready_line and state_phase):
        return from_frames, False
    if state_phase is not None:
        return state_phase, False
    if any(f in MODEL_INIT_FRAMES for f in err.frames):
        # Inside model-runner construction with no line saying which step: the KV budget is where such
        # failures most often land (SGLang issue threads), so that is the best guess.
        return Phase.KV_CACHE_ALLOC, True
    return Phase.STARTUP_OTHER, True


def _clip(text: str) -> str:
    return text if len(text) <= 180 else text[:177] + "..."


def _cause(err: ErrorEvent, phase: Phase, oom: OomFigures | None, facts: MemoryFacts) -> str:
    where = _PHASE_WORDS[phase]
    msg = _clip(err.message.strip())
    k = err.kind
    if k is ErrorKind.OOM:
        gpu = f"GPU {oom.gpu}" if oom and oom.gpu is not None else "A GPU"
        figures = ""
        if oom and oom.tried_gib is not None:
            figures = f": a {oom.tried_gib:.2f} GiB allocation failed"
            if oom.free_gib is not None:
                figures += f" with {oom.free_gib:.2f} GiB free"
            if oom.total_gib is not None:
                figures += f" of {oom.total_gib:.2f} GiB"
        reason = {
            Phase.CUDA_GRAPH_CAPTURE: "; graph memory comes from the share outside --mem-fraction-static",
            Phase.DRAFT_CUDA_GRAPH_CAPTURE: "; draft graphs come from the share outside --mem-fraction-static",
            Phase.WEIGHT_LOADING: "; the weights do not fit in the free memory of one GPU",
            Phase.WARMUP: "; activations did not fit in the memory left after startup",
            Phase.SERVING: "; activations did not fit in the memory left after startup",
        }.get(phase, "")
        return f"{gpu} ran out of memory during {where}{figures}{reason}."
    if k is ErrorKind.KV_BUDGET:
        if facts.post is not None and facts.weights is not None:
            return (
                f"No memory was left for the KV cache: the weights took {facts.weights:.2f} GiB per GPU and left "
                f"{facts.post:.2f} GiB, so the KV budget inside the static fraction came out <= 0 ({msg})."
            )
        cap = "gpu_memory_utilization" if err.engine is Engine.VLLM else "the static memory fraction"
        return f"No memory was left for the KV cache under {cap} ({msg})."
    if k is ErrorKind.KV_EXHAUSTED:
        return f"The KV pool could not hold the running batch while serving ({msg})."
    texts = {
        ErrorKind.ARCH: "A kernel is missing for this GPU's architecture",
        ErrorKind.NCCL: "NCCL failed",
        ErrorKind.NETWORK: "A connection between ranks (gloo/TCP) failed",
        ErrorKind.IMPORT: "A Python import failed",
        ErrorKind.COMPILE: "A compile step (torch.compile / triton / inductor) failed",
        ErrorKind.IMBALANCE: "Free GPU memory differs across tensor-parallel ranks (another process uses some GPUs)",
        ErrorKind.HOST_KILL: (
            "A process was killed with SIGKILL (the host OOM killer is a common cause, not GPU memory)"
        ),
        ErrorKind.ARGS: "The launch flags were rejected",
        ErrorKind.FILE: "A model file or repository could not be found or fetched",
        ErrorKind.CUDA: "A CUDA runtime error stopped the server",
        ErrorKind.WATCHDOG: "A step or collective hung until a watchdog fired",
    }
    if k in texts:
        tail = " — not a memory problem" if k in (ErrorKind.ARCH, ErrorKind.NCCL, ErrorKind.NETWORK) else ""
        return f"{texts[k]} during {where}{tail}: {msg}."
    if k is ErrorKind.TEARDOWN:
        return (
            f"The engine tore itself down during {where} after a child process failed, but that process's own "
            f"error is not in the log ({msg})."
        )
    if k is ErrorKind.UNKNOWN:
        return f"A traceback during {where} is cut off before its exception line, so the log does not name the error."
    return f"The server failed during {where}: {msg}."


def _evidence(run: RunState, root: ErrorEvent, live: list[ErrorEvent]) -> tuple[str, ...]:
    lines: list[tuple[int, str]] = []
    st = run.ranks.get(root.rank)
    ctx = st.last_progress if st is not None and st.last_progress is not None else run.last_progress
    if ctx is not None and ctx.line_no < root.line_no and ctx.text:
        lines.append((ctx.line_no, ctx.text))
    for i, text in enumerate(root.traceback):
        lines.append((root.line_no + i, text))
    extra = [e for e in live if e is not root][:6]
    for e in extra:
        if e.text:
            lines.append((e.line_no, e.text))
    lines.sort(key=lambda t: t[0])
    out = [t if len(t) <= _MAX_EVIDENCE_CHARS else t[:_MAX_EVIDENCE_CHARS] + "..." for _, t in lines]
    return tuple(out[:_MAX_EVIDENCE])


def _judge(run: RunState, engine: Engine | None, truncated: bool, lines: int, notes: list[str]) -> Diagnosis:
    root, live = _root(run)
    if root is not None:
        return _failed(run, engine, truncated, lines, notes, root, live)
    return _no_error(run, engine, truncated, lines, notes)


def _failed(
    run: RunState,
    engine: Engine | None,
    truncated: bool,
    lines: int,
    notes: list[str],
    root: ErrorEvent,
    live: list[ErrorEvent],
) -> Diagnosis:
    phase, guessed = _error_phase(run, root)
    oom = root.oom
    if oom is None:
        oom = next((e.oom for e in live if e.oom is not None), None)
    kind = root.kind
    memory = kind in MEMORY_KINDS
    confidence = {0: 0.9, 1: 0.8, 2: 0.8, 3: 0.6, 4: 0.35, 5: 0.45}[tier(kind)]
    if kind is ErrorKind.OOM and oom is not None and oom.tried_gib is not None:
        confidence = 0.95
    if kind is ErrorKind.UNKNOWN:
        memory = phase in _MEMORY_PHASES
        notes.append(
            "The traceback is cut off before its exception line; the outcome is a best guess from the step it was "
            f"in ({phase.value}): {'memory is the commonest failure there' if memory else 'not a memory step'}."
        )
        confidence = 0.35 if memory else 0.3
        if guessed:
            confidence -= 0.05
        kind_for_fix = ErrorKind.KV_BUDGET if memory and phase is Phase.KV_CACHE_ALLOC else ErrorKind.OOM
    else:
        kind_for_fix = kind
    if kind is ErrorKind.TEARDOWN and phase in _MEMORY_PHASES:
        notes.append("Look in the failing rank's own output (stderr, other nodes) for the first error.")
    facts = _facts(run, root.rank, engine, oom)
    cause = _cause(root, phase, oom, facts)
    if kind is ErrorKind.UNKNOWN and memory:
        cause = cause[:-1] + "; by the step it was in, memory is the likeliest cause (a guess, see confidence)."
    if truncated:
        confidence *= 0.85
    if run.dropped_errors:
        notes.append(f"{run.dropped_errors} further error lines were not kept.")
    fixes = fixes_for(engine, phase, kind_for_fix, facts, oom, root.message, memory)
    free = oom.free_gib if oom else None
    if kind is ErrorKind.KV_BUDGET and free is None:
        free = facts.post
    return Diagnosis(
        engine=engine,
        outcome=Outcome.OOM if memory else Outcome.CRASH,
        phase=phase,
        cause=cause,
        confidence=round(max(0.05, min(confidence, 0.99)), 2),
        gpu=oom.gpu if oom else None,
        rank=root.rank,
        tried_to_allocate_gib=oom.tried_gib if oom else None,
        free_gib=free,
        total_gib=oom.total_gib if oom and oom.total_gib is not None else facts.total,
        evidence=_evidence(run, root, live),
        fixes=fixes,
        truncated=truncated,
        notes=tuple(notes),
        figures=facts.as_dict(),
        lines_read=lines,
    )


def _no_error(run: RunState, engine: Engine | None, truncated: bool, lines: int, notes: list[str]) -> Diagnosis:
    facts = _facts(run, None, engine, None)
    evidence: tuple[str, ...] = (run.last_progress.text,) if run.last_progress and run.last_progress.text else ()
    base: dict[str, Any] = {
        "engine": engine,
        "truncated": truncated,
        "lines_read": lines,
        "figures": facts.as_dict(),
        "evidence": evidence,
    }
    factor = 0.85 if truncated else 1.0
    if run.ready_line:
        return Diagnosis(
            outcome=Outcome.READY,
            phase=Phase.SERVING,
            cause="The server started and printed its ready line.",
            confidence=0.98,
            notes=tuple(notes),
            **base,
        )
    if run.batches and run.startup_events == 0:
        return Diagnosis(
            outcome=Outcome.READY,
            phase=Phase.SERVING,
            cause=f"The server is serving: {run.batches} batch-stats lines and no error.",
            confidence=round(0.9 * factor, 2),
            notes=tuple(notes),
            **base,
        )
    if run.api_up_line:
        return Diagnosis(
            outcome=Outcome.READY,
            phase=Phase.WARMUP,
            cause="Every scheduler reported ready and the HTTP server is up; the log ends before the ready line "
            "(warmup request still running, or the log was cut).",
            confidence=round(0.85 * factor, 2),
            notes=tuple(notes),
            **base,
        )
    done_sglang = run.capacity is not None
    done_vllm = engine is Engine.VLLM and run.kv_seen and (run.graph_finished or run.graph_bar_done)
    if done_sglang or done_vllm:
        what = (
            "the scheduler summary (weights, KV pool and graphs all allocated)"
            if done_sglang
            else "the KV cache size and finished CUDA-graph capture"
        )
        head = (
            f"; {run.capacity.available_gib:.2f} GiB is left for activations"
            if run.capacity and run.capacity.available_gib is not None
            else ""
        )
        return Diagnosis(
            outcome=Outcome.READY,
            phase=Phase.WARMUP,
            cause=f"Startup finished: the log shows {what}{head}, and no error; it ends before the server's ready "
            "line.",
            confidence=round(0.65 * factor, 2),
            notes=tuple(notes),
            **base,
        )
    phase = run.phase
    if phase is None:
        if run.content > 0:
            return Diagnosis(
                outcome=Outcome.UNKNOWN,
                phase=None,
                cause="The log has no startup progress, ready line or error to judge by.",
                confidence=0.2,
                notes=tuple(notes),
                **base,
            )
        return _unknown(f"No SGLang or vLLM progress or error lines were found in {lines} lines.", lines, engine)
    where = _PHASE_WORDS[phase]
    if run.followed_by_run or run.ended is not None:
        why = "another run follows it in the file" if run.followed_by_run else "the engine logged its own exit"
        return Diagnosis(
            outcome=Outcome.CRASH,
            phase=phase,
            cause=f"The run ended during {where} without reaching ready ({why}); its error is not in the log.",
            confidence=round(0.45 * factor, 2),
            notes=(*notes, "Check the process's stderr, dmesg (OOM killer) and other nodes' logs."),
            fixes=fixes_for(engine, phase, ErrorKind.OTHER, facts, None, "", False),
            **base,
        )
    bar = run.graph_bar_open
    detail = ""
    if bar is not None and phase in (Phase.CUDA_GRAPH_CAPTURE, Phase.DRAFT_CUDA_GRAPH_CAPTURE):
        detail = f" (capture bar at {bar.done}/{bar.total})"
    return Diagnosis(
        outcome=Outcome.STALLED,
        phase=phase,
        cause=f"The log stops during {where}{detail} with no error and no ready line; a log cannot tell whether the "
        "process is still working, hung or gone.",
        confidence=round(0.5 * factor, 2),
        notes=(
            *notes,
            "Check liveness (the watcher does): a capture that hangs with custom all-reduce shows no progress.",
        ),
        **base,
    )
