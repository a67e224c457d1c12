"""From a run's state to a verdict: the root error, the phase it happened in, the outcome and a confidence.

Confidence is the chance the verdict is right, so it is the weaker of two readings: how sure the outcome
is (an OOM line with figures is certain; a traceback cut before its exception line is a guess) and how
sure the phase is (a message or traceback frame that names the step is strong; the last progress line of
another process is weaker; nothing at all leaves the phase unknown). Guesses stay below 0.5 — the
corpus check (``tools/diagnosis_accuracy.py``) holds the rules to "never confidently wrong".

A missing decisive line is said in ``cause``; free memory at the failing step moves the memory guess
(2.8 GiB free at capture makes an OOM likely, 18.6 GiB makes it unlikely). A file that simply ends
mid-startup is ``unknown``: a file cannot say whether the process is still alive.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dsv4lab.counts import plural
from dsv4lab.logs.causes import MEMORY_KINDS, MODEL_INIT_FRAMES, tier
from dsv4lab.logs.devices import failing_gpu
from dsv4lab.logs.events import Engine, ErrorEvent, ErrorKind, OomFigures, Phase
from dsv4lab.logs.facts import memory_facts
from dsv4lab.logs.fixes import fixes_for
from dsv4lab.logs.patterns import METHOD, VLLM_FREE_ON_START, VLLM_KV_SPACE
from dsv4lab.logs.state import RunState
from dsv4lab.logs.steps import (
    allocates,
    ambiguous_dummy_run,
    entry_step,
    frame_step,
    import_time,
    sglang_compile_guess,
)
from dsv4lab.logs.verdict import Diagnosis, Outcome, unknown
from dsv4lab.logs.wording import cause_sentence, evidence_lines, where

__all__ = ["judge"]

#: Steps where a failure whose message is lost is most likely memory (the fit test's breaking terms).
_MEMORY_PHASES = (Phase.KV_CACHE_ALLOC, Phase.CUDA_GRAPH_CAPTURE, Phase.DRAFT_CUDA_GRAPH_CAPTURE)
#: How sure an error's own text makes the outcome.
_KIND_CONFIDENCE: dict[ErrorKind, float] = {
    ErrorKind.OOM: 0.85,
    ErrorKind.KV_BUDGET: 0.9,
    ErrorKind.FREE_MEMORY: 0.9,
    ErrorKind.KV_EXHAUSTED: 0.85,
    ErrorKind.CUDA: 0.8,
    ErrorKind.NCCL: 0.65,  # often a peer's symptom: the rank that failed first may be missing
    ErrorKind.NETWORK: 0.65,
    ErrorKind.WATCHDOG: 0.65,
    ErrorKind.HOST_KILL: 0.6,
    ErrorKind.OTHER: 0.6,
}
_PRIMARY = 0.9  # import, arch, compile, args, file, port, capture-illegal, imbalance: the text is the cause
_NO_PHASE = 0.45  # a verdict whose step the log does not show is incomplete, whatever the outcome
_NO_READY_LINE = 0.45  # "ready" without the engine's ready line
_LOW_FREE_GIB = 3.0
_PLENTY_FREE_GIB = 10.0


@dataclass(frozen=True)
class _PhaseReading:
    phase: Phase | None
    strength: float
    source: str


@dataclass(frozen=True)
class _OutcomeReading:
    outcome: Outcome
    confidence: float
    memory: bool
    guess: str = ""  # why, when the outcome is a guess


def judge(run: RunState, engine: Engine | None, truncated: bool, lines: int, notes: list[str]) -> Diagnosis:
    """The verdict on one run (see the module docstring)."""
    root, live = _root(run)
    if root is not None:
        return _failed(run, engine, truncated, lines, notes, root, live)
    return _no_error(run, engine, truncated, lines, notes)


# -- which error ----------------------------------------------------------------------------------------------


def _after(line: int, ts: str, err: ErrorEvent) -> bool:
    """Progress at ``line``/``ts`` came after ``err``: a later line, and not stamped the same instant. A
    batch line racing the traceback out of another thread (same millisecond, or the same second in logs
    without milliseconds) is not a server that lived on: the kill chain follows it."""
    if line <= err.line_no:
        return False
    return not (ts and err.ts and len(ts) == len(err.ts) and ts <= err.ts)


def _survived(run: RunState, err: ErrorEvent) -> bool:
    """An error the server lived through: it became ready or kept serving, or the same rank made progress."""
    if run.ready_line > err.line_no or _after(run.last_batch_line, run.last_batch_ts, err):
        return True
    if err.kind in (ErrorKind.TEARDOWN, ErrorKind.HOST_KILL):
        return False
    if err.rank is not None or (err.text and err.text.startswith("[")):
        st = run.ranks.get(err.rank)
        if st is not None and st.last_progress is not None and _after(st.last_progress_line, st.last_progress_ts, err):
            return True
    return False


def _root(run: RunState) -> tuple[ErrorEvent | None, list[ErrorEvent]]:
    live = [e for e in run.errors if not _survived(run, e)]
    if not live:
        return None, []
    return min(live, key=lambda e: (tier(e.kind), e.line_no)), live


# -- where --------------------------------------------------------------------------------------------------


def _read_phase(run: RunState, root: ErrorEvent, live: list[ErrorEvent]) -> _PhaseReading:
    msg, kind = root.message, root.kind
    own = run.ranks.get(root.rank) if root.rank is not None else None
    own_phase = own.phase if own is not None else None
    if run.ready_line and run.ready_line < root.line_no:
        return _PhaseReading(Phase.SERVING, 0.95, "the error follows the ready line")
    fixed = {
        ErrorKind.KV_BUDGET: Phase.KV_CACHE_ALLOC,
        ErrorKind.FREE_MEMORY: Phase.STARTUP_OTHER,
        ErrorKind.KV_EXHAUSTED: Phase.SERVING,
        ErrorKind.IMBALANCE: Phase.STARTUP_OTHER,  # checked when distributed init measures free memory
        ErrorKind.ARGS: Phase.STARTUP_OTHER,
    }.get(kind)
    if "Failed to load model" in msg:  # vLLM 0.13+ names the step before re-raising a load OOM
        fixed = Phase.WEIGHT_LOADING
    if fixed is not None:
        return _PhaseReading(fixed, 0.95, "the error message")
    steps = frame_step(root.frames)
    draft = (steps is not None and steps.phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE) or (
        (own_phase or run.phase) is Phase.DRAFT_CUDA_GRAPH_CAPTURE
    )
    low = msg.lower()
    if "capture cuda graph failed" in low or "graph capture failed" in low or "cuda graph failed" in low:
        # A graph wrapper's message ("Piecewise CUDA Graph failed with error") is capture, unless the
        # accompanying traceback shows the scheduler's serving loop (a graph that failed at run time).
        if any(_serving_frames(e) for e in live if e is not root):
            return _PhaseReading(Phase.SERVING, 0.8, "the frames of the accompanying traceback (serving loop)")
        phase = Phase.DRAFT_CUDA_GRAPH_CAPTURE if draft else Phase.CUDA_GRAPH_CAPTURE
        return _PhaseReading(phase, 0.95, "the error message")
    if kind is ErrorKind.GRAPH_CAPTURE:
        phase = Phase.DRAFT_CUDA_GRAPH_CAPTURE if draft else Phase.CUDA_GRAPH_CAPTURE
        return _PhaseReading(phase, 0.95, "the error message")
    if "warmup error" in msg or (root.head and "warmup" in root.head):
        return _PhaseReading(Phase.WARMUP, 0.95, "the error message")
    if steps is not None and not steps.guessed:
        if steps.phase is Phase.SERVING and not run.ready_line and (run.api_up_line or run.capacity is not None):
            return _PhaseReading(Phase.WARMUP, 0.8, "the traceback frames (the warmup request)")
        return _PhaseReading(steps.phase, steps.strength, steps.source)
    for other in sorted(live, key=lambda e: (e.rank != root.rank, e.line_no)):
        if other is not root and other.frames:
            s = frame_step(other.frames)
            if s is not None and not s.guessed:
                return _PhaseReading(s.phase, 0.8, "the frames of the accompanying traceback")
    for other in live:  # vLLM names the worker method that failed: "while processing method X", "method 'X'"
        m = METHOD.search(other.message)
        s = frame_step((f"call:{m.group(1)}",)) if m else None
        if s is not None and not s.guessed:
            return _PhaseReading(s.phase, 0.85, "the worker method the error names")
    vllm = root.engine is Engine.VLLM or run.engines == {Engine.VLLM}
    if vllm and _kv_exists(run) and any(ambiguous_dummy_run(e.frames) for e in live):
        # The profiling pass runs before the KV cache is sized; once the log shows the cache (or the
        # captured graphs), a dummy run is the warm-up's.
        return _PhaseReading(Phase.WARMUP, 0.8, "vLLM's dummy-run frames after the log's KV-cache lines (the warm-up)")
    for other in sorted(live, key=lambda e: e is not root):
        entry = entry_step(other.frames) if other.complete else None
        if entry is not None:
            return _PhaseReading(entry.phase, entry.strength, entry.source)
    state = own_phase or run.phase
    if kind is ErrorKind.PORT or (kind is ErrorKind.IMPORT and state is None):
        if state is not None:
            return _PhaseReading(state, 0.8, "the last step the log shows")
        return _PhaseReading(Phase.STARTUP_OTHER, 0.85, "the kind of error (it happens at start)")
    if steps is not None:
        return _PhaseReading(steps.phase, 0.45, "a call name cut off mid-word (a guess)")
    if root.engine is not Engine.VLLM and run.engines != {Engine.VLLM} and sglang_compile_guess(root.frames):
        return _PhaseReading(
            Phase.CUDA_GRAPH_CAPTURE, 0.45, "torch.compile frames (SGLang compiles for graphs; a guess)"
        )
    if import_time(root.frames):
        return _PhaseReading(Phase.STARTUP_OTHER, 0.8, "the traceback (module imports only)")
    if own_phase is not None:
        return _PhaseReading(own_phase, 0.8, "the failing rank's last step")
    if run.phase is not None:
        return _PhaseReading(run.phase, 0.7, "the last step the log shows")
    if any(f in MODEL_INIT_FRAMES for f in root.frames):
        # Inside model-runner construction with no line saying which step: the KV budget is where such
        # failures most often land (SGLang issue threads), so that is the best guess.
        return _PhaseReading(Phase.KV_CACHE_ALLOC, 0.4, "model-runner construction frames (a guess)")
    return _PhaseReading(None, _NO_PHASE, "nothing in the log")


def _kv_exists(run: RunState) -> bool:
    """The log shows the KV cache sized (or later steps: captured graphs, the engine's init line)."""
    return run.kv_seen or run.graph_finished or run.graph_bar_done or run.engine_ready


def _serving_frames(err: ErrorEvent) -> bool:
    s = frame_step(err.frames)
    return s is not None and s.phase is Phase.SERVING


# -- what ---------------------------------------------------------------------------------------------------


def _step_free(run: RunState, rank: int | None, phase: Phase | None) -> tuple[float | None, float | None]:
    """(free GiB when the failing step began, free GiB before weights) for the rank, else the tightest rank."""
    attrs = (
        {
            Phase.CUDA_GRAPH_CAPTURE: ("capture_avail", "pool_end"),
            Phase.DRAFT_CUDA_GRAPH_CAPTURE: ("capture_avail", "pool_end"),
            Phase.KV_CACHE_ALLOC: ("post",),
            Phase.WEIGHT_LOADING: ("pre",),
        }.get(phase)
        if phase is not None
        else None
    )
    if not attrs:
        return None, None
    own = run.ranks.get(rank)
    ranks = [own] if own is not None else list(run.ranks.values())
    for attr in attrs:
        vals = [getattr(st, attr) for st in ranks if st is not None and getattr(st, attr) is not None]
        if vals:
            pres = [st.pre for st in ranks if st is not None and st.pre is not None]
            return float(min(vals)), (float(min(pres)) if pres else None)
    return None, None


def _guess(run: RunState, root: ErrorEvent, phase: Phase | None) -> _OutcomeReading:
    """The outcome when the error itself is not in the log: from the step, the code and the free memory."""
    if import_time(root.frames):
        return _OutcomeReading(Outcome.CRASH, 0.35, False, "it stopped while importing modules")
    if phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE and not allocates(root.traceback):
        # The draft's graphs are a fraction of the target's (one or a few draft layers, bs x topk or
        # bs x (steps + 1) tokens) and are captured after the target's fitted: memory is no likelier than
        # another failure there unless the log shows memory was short.
        free, _ = _step_free(run, root.rank, phase)
        if free is not None and free <= _LOW_FREE_GIB:
            return _OutcomeReading(Outcome.OOM, 0.4, True, f"only {free:.2f} GiB was free when the step began")
        return _OutcomeReading(
            Outcome.CRASH, 0.3, False, "the draft's graphs are small, so memory is no likelier than another failure"
        )
    if phase in _MEMORY_PHASES or allocates(root.traceback):
        free, pre = _step_free(run, root.rank, phase)
        if free is not None and (free <= _LOW_FREE_GIB or (pre and free <= 0.05 * pre)):
            return _OutcomeReading(Outcome.OOM, 0.45, True, f"only {free:.2f} GiB was free when the step began")
        if free is not None and free >= _PLENTY_FREE_GIB and (pre is None or free >= 0.15 * pre):
            return _OutcomeReading(
                Outcome.CRASH, 0.3, False, f"{free:.2f} GiB was still free when the step began, so memory is unlikely"
            )
        why = "the failing code allocates memory" if phase not in _MEMORY_PHASES else "memory is the commonest failure"
        return _OutcomeReading(Outcome.OOM, 0.35, True, f"{why} there")
    return _OutcomeReading(Outcome.CRASH, 0.3, False, "not a memory step")


def _read_outcome(
    run: RunState, root: ErrorEvent, phase: Phase | None, oom: OomFigures | None, lines: int
) -> _OutcomeReading:
    kind = root.kind
    if kind in (ErrorKind.UNKNOWN, ErrorKind.TEARDOWN):
        g = _guess(run, root, phase)
        return (
            g if kind is ErrorKind.UNKNOWN else _OutcomeReading(g.outcome, min(g.confidence, 0.35), g.memory, g.guess)
        )
    conf = _KIND_CONFIDENCE.get(kind, _PRIMARY)
    if kind is ErrorKind.OOM and oom is not None and oom.tried_gib is not None:
        conf = 0.95
    memory = kind in MEMORY_KINDS
    if kind is ErrorKind.OTHER and (root.cut or root.line_no == lines):
        # An exception the rules do not know, on the log's last line: its message may be cut before the
        # words that say what it is ("RuntimeError: CUDA out of").
        return _OutcomeReading(Outcome.CRASH, 0.45, False, "the last line may be cut before it says more")
    return _OutcomeReading(Outcome.OOM if memory else Outcome.CRASH, conf, memory)


def _failed(
    run: RunState,
    engine: Engine | None,
    truncated: bool,
    lines: int,
    notes: list[str],
    root: ErrorEvent,
    live: list[ErrorEvent],
) -> Diagnosis:
    reading = _read_phase(run, root, live)
    phase = reading.phase
    oom = root.oom or next((e.oom for e in live if e.oom is not None), None)
    out = _read_outcome(run, root, phase, oom, lines)
    kind = root.kind
    facts = memory_facts(run, root.rank, engine, oom)
    gpu = None
    if out.memory or kind is ErrorKind.CUDA:  # a failure of one device (not of the host, a peer or the launch)
        ordered = [root, *(e for e in live if e is not root)]
        gpu = failing_gpu(root.engine or engine, ordered, run.server_args, run.visible)
    if kind in (ErrorKind.UNKNOWN, ErrorKind.TEARDOWN):
        if root.head == "argument parsing":
            cause = (
                "The decisive line is not in the log: the command-line parser printed its usage, which it does "
                "when it rejects the launch command, and the error line after it is cut off"
            )
        elif kind is ErrorKind.UNKNOWN:
            cause = f"The decisive line is not in the log: a traceback during {where(phase)} is cut off before its "
            cause += "exception line"
        else:
            cause = (
                f"A process failed during {where(phase)} and the engine reported it ({root.message.strip()[:160]}), "
                "but the failing process's own error is not in the log"
            )
        verdict = "memory is the likelier cause" if out.memory else "the guess is a crash, not memory"
        cause += f"; {verdict} ({out.guess}) — a guess, see confidence."
        kind_for_fix = ErrorKind.KV_BUDGET if out.memory and phase is Phase.KV_CACHE_ALLOC else ErrorKind.OOM
        if not out.memory:
            kind_for_fix = kind
        if phase in _MEMORY_PHASES:
            notes.append("Look in the failing rank's own output (stderr, other nodes) for the first error.")
    else:
        cause = cause_sentence(root, kind, phase, oom, facts, gpu)
        kind_for_fix = kind
        if out.guess:
            cause = cause[:-1] + (
                "; the log ends on this line, so the decisive part of the message may not be in the log "
                "(a guess, see confidence)."
            )
    if reading.strength < 0.9:
        notes.append(f"The phase is read from {reading.source}.")
    confidence = min(out.confidence, reading.strength)
    if truncated:
        confidence *= 0.85
    if run.dropped_errors:
        notes.append(f"{run.dropped_errors} further error lines were not kept.")
    free, total = _free_total(root, oom, facts.post, kind)
    return Diagnosis(
        engine=engine,
        outcome=out.outcome,
        phase=phase,
        cause=cause,
        confidence=round(max(0.05, min(confidence, 0.99)), 2),
        gpu=gpu,
        rank=root.rank,
        tried_to_allocate_gib=oom.tried_gib if oom else None,
        free_gib=free,
        total_gib=total if total is not None else facts.total,
        evidence=evidence_lines(run, root, live),
        fixes=fixes_for(engine, phase, kind_for_fix, facts, oom, root.message, out.memory),
        truncated=truncated,
        notes=tuple(notes),
        figures=facts.as_dict(),
        lines_read=lines,
    )


def _free_total(
    root: ErrorEvent, oom: OomFigures | None, post: float | None, kind: ErrorKind
) -> tuple[float | None, float | None]:
    if oom is not None:
        return oom.free_gib, oom.total_gib
    m = VLLM_KV_SPACE.search(root.message)
    if m:
        return float(m.group(1)), float(m.group(2))
    if kind is ErrorKind.KV_BUDGET:
        return post, None
    if kind is ErrorKind.FREE_MEMORY:
        m = VLLM_FREE_ON_START.search(root.message)
        if m:
            return float(m.group(1)), float(m.group(2))
    return None, None


# -- no error ---------------------------------------------------------------------------------------------------


def _no_error(run: RunState, engine: Engine | None, truncated: bool, lines: int, notes: list[str]) -> Diagnosis:
    facts = memory_facts(run, None, engine, None)
    evidence: tuple[str, ...] = (run.last_progress.text,) if run.last_progress and run.last_progress.text else ()
    base: dict[str, Any] = {
        "engine": engine,
        "truncated": truncated,
        "lines_read": lines,
        "figures": facts.as_dict(),
        "evidence": evidence,
    }
    factor = 0.85 if truncated else 1.0

    def verdict(outcome: Outcome, phase: Phase | None, cause: str, confidence: float, **kw: Any) -> Diagnosis:
        return Diagnosis(outcome=outcome, phase=phase, cause=cause, confidence=round(confidence, 2), **base, **kw)

    if run.ready_line:
        if run.traffic_line:
            cause = (
                f"The server started, printed its ready line and is serving ({run.traffic_what} after it, "
                f"line {run.traffic_line})."
            )
            return verdict(Outcome.READY, Phase.SERVING, cause, 0.98, notes=tuple(notes))
        # Up, with no request served in the log yet: the labels' "warmup" (no traffic has reached it).
        cause = (
            "The server started and printed its ready line; no request has been served in the log yet (no "
            "request's batch stats or POST access line after it, health probes aside), so it is up and waiting "
            "for traffic."
        )
        return verdict(Outcome.READY, Phase.WARMUP, cause, 0.9, notes=tuple(notes))
    # Without the ready line a file cannot say the server is (still) healthy: the warmup request can fail
    # after the HTTP server is up, a serving excerpt can stop just before a crash. READY stays a guess.
    until = "; the file ends with no error, so whether it stayed up is not in the log."
    if run.batches and run.startup_events == 0:
        cause = f"The server was serving ({plural(run.batches, 'batch-stats line')}, no error){until}"
        return verdict(Outcome.READY, Phase.SERVING, cause, _NO_READY_LINE * factor, notes=tuple(notes))
    if run.api_up_line:
        if run.batches_after_api >= 2:
            cause = f"The HTTP server is up and served {plural(run.batches_after_api, 'batch')} with no error{until}"
            return verdict(Outcome.READY, Phase.SERVING, cause, _NO_READY_LINE * factor, notes=tuple(notes))
        cause = (
            "Every scheduler reported ready and the HTTP server is up, but the log ends before the ready line: "
            "the warmup request may still fail."
        )
        return verdict(Outcome.READY, Phase.WARMUP, cause, _NO_READY_LINE * factor, notes=tuple(notes))
    done_sglang = run.capacity is not None
    done_vllm = engine is Engine.VLLM and (
        run.engine_ready or (run.kv_seen and (run.graph_finished or run.graph_bar_done))
    )
    if done_sglang or done_vllm:
        if done_sglang:
            what = "the scheduler summary (weights, KV pool and graphs all allocated)"
        elif run.engine_ready:
            what = "the engine's init line (profiling, KV cache, warmup and capture done)"
        else:
            what = "the KV cache size and finished CUDA-graph capture"
        head = (
            f"; {run.capacity.available_gib:.2f} GiB is left for activations"
            if run.capacity and run.capacity.available_gib is not None
            else ""
        )
        cause = (
            f"Startup finished: the log shows {what}{head}, and no error; it ends before the server's ready line, "
            "so the HTTP server and warmup are not in the log."
        )
        return verdict(Outcome.READY, Phase.WARMUP, cause, _NO_READY_LINE * factor, notes=tuple(notes))
    phase = run.phase
    if phase is None:
        if run.content > 0:
            cause = "The log has no startup progress, ready line or error to judge by."
            return verdict(Outcome.UNKNOWN, None, cause, 0.2, notes=tuple(notes))
        return unknown(
            f"No SGLang or vLLM progress or error lines were found in {plural(lines, 'line')}.", lines, engine
        )
    if run.followed_by_run or run.ended is not None:
        why = "another run follows it in the file" if run.followed_by_run else "the engine logged its own exit"
        return verdict(
            Outcome.CRASH,
            phase,
            f"The run ended during {where(phase)} without reaching ready ({why}); its error is not in the log.",
            0.45 * factor,
            notes=(*notes, "Check the process's stderr, dmesg (OOM killer) and other nodes' logs."),
            fixes=fixes_for(engine, phase, ErrorKind.OTHER, facts, None, "", False),
        )
    bar = run.graph_bar_open
    detail = ""
    if bar is not None and phase in (Phase.CUDA_GRAPH_CAPTURE, Phase.DRAFT_CUDA_GRAPH_CAPTURE):
        detail = f" (capture bar at {bar.done}/{bar.total})"
    cause = (
        f"The log stops during {where(phase)}{detail} with no error and no ready line; a file cannot tell whether "
        "the server is still working, hung or gone, so the outcome is unknown."
    )
    return verdict(
        Outcome.UNKNOWN,
        phase,
        cause,
        0.3 * factor,
        notes=(
            *notes,
            "Check liveness (dsv4lab watch does): a capture that hangs with custom all-reduce shows no progress.",
        ),
    )
