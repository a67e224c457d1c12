"""Wait for a launched server to be ready — and notice within a second when it is not going to be.

The story's poll loop read the *last line* of the log every 25 s and looked for words; the server died
in seconds, the log stopped changing, and the loop waited 400 s for nothing. This watcher combines four
signals, none of which is a last-line grep:

* the log as a stream (every line, classified by :mod:`dsv4lab.logs`: ready lines, fatal lines, phases);
* process liveness (the PID files and exit-status file the launch script writes);
* staleness (alive, but no new line for ``stall_after_s``) — reported as STALLED with the last phase;
* HTTP ``/health`` through the host's tunnel (200 = ready; ``/v1/models`` answers during warmup and is
  not readiness).

A dropped SSH connection is a reason to reconnect and resume at the log offset, never a verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import posixpath
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dsv4lab.errors import DSV4LabError, HostConnectionError, Interrupted
from dsv4lab.hosts import Follower, KillReport, PortForward
from dsv4lab.logs import Diagnosis, LineKind, Outcome, classify_line, diagnose
from dsv4lab.logs.patterns import EXCEPTION_ANY, SHUTDOWN_SIGNAL
from dsv4lab.progress import Progress, State
from dsv4lab.serving.launch import ServerHandle
from dsv4lab.units import REAL, WALL_CLOCK, Clock, fmt_s

__all__ = ["PhaseMark", "Readiness", "Verdict", "stop_soon", "wait_ready", "wait_ready_all"]

#: Lines kept for evidence and diagnosis (a traceback plus what led to it).
_KEEP_LINES = 4000
#: Lines kept from the start of the log: server_args and the memory split, which the diagnosis needs.
_HEAD_LINES = 400

#: Timeline labels for the progress kinds of the shared classifier.
_PHASE_LABEL = {
    LineKind.DIST_INIT: "init",
    LineKind.WEIGHTS: "weights",
    LineKind.KV_CACHE: "kv_pool",
    LineKind.CUDA_GRAPH: "graph_capture",
    LineKind.DRAFT_CUDA_GRAPH: "draft_graph_capture",
    LineKind.HTTP: "uvicorn",
    LineKind.WARMUP: "warmup",
    LineKind.SERVING: "serving",
}


def _is_fatal(kind: LineKind) -> bool:
    return kind in (LineKind.FATAL, LineKind.OOM)


def _is_definitive(text: str) -> bool:
    """A fatal line that settles the matter even while the process still runs.

    A bare ``Traceback`` header can belong to a logged, survived error; every other fatal line (the OOM,
    ``Scheduler hit an exception``, SGLang's own teardown) is followed by death.
    """
    return "Traceback (most recent call last)" not in text


#: How often a watch that has seen the ready line asks ``/health`` until it answers.
_READY_PROBE_EVERY_S = 0.25
#: How long after a fatal traceback's exception line the watcher waits for what follows it (a chained
#: traceback, the next process's) before the verdict: the lines of one traceback arrive together, and a
#: server's other processes may take many seconds to exit after it (vLLM's API server after its EngineCore).
TRACEBACK_SETTLE_S = 0.5


def _settled(seen: _Seen, now: float, dying_grace_s: float) -> bool:
    """Whether a fatal error's traceback has had time to arrive: ``TRACEBACK_SETTLE_S`` after its exception
    line, or ``dying_grace_s`` after the fatal line when no exception line came."""
    if seen.exception_at is not None:
        return now - seen.exception_at > min(TRACEBACK_SETTLE_S, dying_grace_s)
    return seen.definitive_at is not None and now - seen.definitive_at > dying_grace_s


class Verdict(str, Enum):
    """What the watcher concluded about the server *now* (never from old log lines alone)."""

    READY = "READY"
    CRASHED = "CRASHED"
    STALLED = "STALLED"
    TIMEOUT = "TIMEOUT"
    #: The server was stopped on purpose (``stop()``, ``dsv4lab stop``) and is not running.
    STOPPED = "STOPPED"
    #: The user stopped the watch (Stop button, Ctrl-C); the readiness seen so far is kept.
    INTERRUPTED = "INTERRUPTED"
    #: The watch's time ran out while the server's Slurm job was still waiting in the queue (reason given).
    QUEUED = "QUEUED"


#: Progress colour of each verdict: red for the ones that need the user's attention.
VERDICT_STATE: dict[Verdict, State] = {
    Verdict.READY: "ok",
    Verdict.CRASHED: "fail",
    Verdict.STALLED: "fail",
    Verdict.TIMEOUT: "fail",
    Verdict.STOPPED: "warn",
    Verdict.INTERRUPTED: "warn",
    Verdict.QUEUED: "warn",
}


@dataclass(frozen=True)
class PhaseMark:
    """A startup phase first seen ``t`` seconds after the launch (or after the watch began, for a watch
    begun more than :data:`LAUNCH_CLOCK_MAX_S` after it); ``log_t``: when the server logged it, seconds after
    its first timestamped log line by the log's own clock (None where the line has no timestamp)."""

    phase: str
    t: float
    log_t: float | None = None


#: The timestamp a log line starts with: SGLang's ``[2026-05-04 10:00:00.123 TP0]`` (milliseconds with
#: ``SGLANG_LOG_MS``) or vLLM's ``INFO 05-04 10:00:00`` (no year: differences within a run are what count).
_SGLANG_TS = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)")
_VLLM_TS = re.compile(r"^(?:\(\S+ pid=\d+\) )?(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d{2}-\d{2} \d{2}:\d{2}:\d{2})")


def log_timestamp(line: str) -> float | None:
    """Seconds (an epoch on the log's own clock) of the timestamp a server log line starts with, if any."""
    m = _SGLANG_TS.match(line)
    try:
        if m:
            return _dt.datetime.fromisoformat(m.group(1)).timestamp()
        m = _VLLM_TS.match(line)
        if m:
            return _dt.datetime.strptime("2000-" + m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
    except ValueError:
        return None
    return None


@dataclass(frozen=True)
class Readiness:
    """The watcher's verdict, with the evidence behind it. ``elapsed_s`` and the timeline count from the
    launch when the watch began within :data:`LAUNCH_CLOCK_MAX_S` of it, else from the watch's start;
    ``detected_after_s`` is always from the first sign (a fatal line, the process gone) to the verdict.

    ``elapsed_s`` and the timeline are what the watch measured on the server's clock (the twin clock on the
    twin); :attr:`startup_s` and :meth:`phases` are the same on the reader's clock (the modelled
    hardware), which is what every view shows. ``detected_after_s`` is the watcher's own reaction time,
    wall-clock seconds on this machine: it is the same on the twin and on hardware.
    """

    verdict: Verdict
    reason: str
    evidence: tuple[str, ...]
    exit_status: int | None
    timeline: tuple[PhaseMark, ...]
    elapsed_s: float
    detected_after_s: float | None
    last_phase: str | None
    diagnosis: Diagnosis | None = field(default=None, compare=False)
    clock: Clock = field(default=REAL, compare=False)
    #: When the server's first log line was read, on the watch's clock (``elapsed_s``'s).
    first_line_s: float | None = field(default=None, compare=False)
    #: The verdict's moment by the log's own clock: seconds from the first to the deciding timestamped line
    #: (the ready line, or the last line of a death); None when the log has no timestamps.
    log_end_s: float | None = field(default=None, compare=False)
    #: Seconds the server's Slurm job waited in the queue before it started (wall clock, by the controller),
    #: apart from the startup the other figures count from the job's start; None without a queue.
    queued_s: float | None = field(default=None, compare=False)
    #: The Slurm job as last seen (:meth:`SlurmJob.to_dict <dsv4lab.serving.slurm.SlurmJob.to_dict>`).
    job: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def ready(self) -> bool:
        return self.verdict is Verdict.READY

    def _reading(self, t: float, log_t: float | None) -> float:
        """A time on the watch's clock as the reader's. On the twin the count starts at the server's first log
        line, by the log's own timestamps where it has them: before that line the twin is a Python process
        importing its modules, seconds of wall time that model nothing (scaled up they would read as minutes
        of startup the hardware never spent), and a watch begun late reads old lines all at once."""
        if not self.clock.is_twin:
            return t
        if log_t is not None:
            return max(0.0, log_t)
        return max(0.0, t - (self.first_line_s or 0.0))

    @property
    def startup_s(self) -> float:
        """Seconds from the launch (or the watch's start; on the twin, the server's first log line) to the
        verdict, on the reader's clock."""
        return self._reading(self.elapsed_s, self.log_end_s)

    def phases(self) -> tuple[tuple[str, float], ...]:
        """Each startup phase with the second it was reached, on the reader's clock."""
        return tuple((m.phase, self._reading(m.t, m.log_t)) for m in self.timeline)

    def headline(self) -> str:
        """``READY after 145 s`` (on the reader's clock; the twin says it is modelled)."""
        return f"{self.verdict.value} after {fmt_s(self.startup_s)}{self.clock.tag}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "exit_status": self.exit_status,
            "evidence": list(self.evidence),
            "clock": self.clock.to_dict(),
            "timeline": [{"phase": phase, "t": round(t, 3)} for phase, t in self.phases()],
            "elapsed_s": round(self.startup_s, 3),
            "detected_after_s": None if self.detected_after_s is None else round(self.detected_after_s, 3),
            "last_phase": self.last_phase,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis is not None else None,
        }
        if self.job is not None:
            out["queued_s"] = None if self.queued_s is None else round(self.queued_s, 3)
            out["slurm"] = dict(self.job)
        if self.clock.is_twin:
            out["elapsed_twin_clock_s"] = round(self.elapsed_s, 3)
            out["timeline_twin_clock"] = [{"phase": m.phase, "t": round(m.t, 3)} for m in self.timeline]
        return out

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        state: hv.State = {"ok": "ok", "fail": "fail"}.get(VERDICT_STATE[self.verdict], "warn")  # type: ignore[assignment]
        steps = " → ".join(f"{phase} ({fmt_s(t)})" for phase, t in self.phases()) or "no startup phase seen"
        timeline = "timeline (modelled hardware)" if self.clock.is_twin else "timeline"
        facts: list[tuple[str, object]] = [("why", self.reason), (timeline, steps)]
        if self.detected_after_s is not None and self.verdict is Verdict.CRASHED:
            facts.append(("detected", f"{fmt_s(self.detected_after_s)} ({WALL_CLOCK}) after the first fatal sign"))
        if self.exit_status is not None:
            facts.append(("exit status", self.exit_status))
        if self.job is not None:
            queued = "still queued" if self.queued_s is None else f"{fmt_s(self.queued_s)} ({WALL_CLOCK}), apart"
            facts.append(("Slurm job", f"{self.job.get('job_id')}: {self.job.get('state')}; queue time {queued}"))
        body = hv.kv_table(facts)
        if self.evidence:
            body += hv.fold(list(self.evidence), keep=15, summary="earlier evidence lines")
        if self.diagnosis is not None and self.verdict is not Verdict.READY:
            body += self.diagnosis._repr_html_()
        return hv.card("server readiness", body, state=state, status=self.headline())


def _http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own server via loopback
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _end_in_background(handle: ServerHandle, *, wait_s: float) -> None:
    """:meth:`ServerHandle.end_crashed` in a (non-daemon) thread: the verdict is out at once, a script still
    waits for the crashed server's processes to be ended before it exits."""

    def end() -> None:
        with contextlib.suppress(Exception):
            handle.end_crashed(wait_s=wait_s)

    threading.Thread(target=end, name="dsv4lab-end-crashed", daemon=False).start()


def stop_soon(handle: ServerHandle, *, grace_s: float = 5.0, wait_s: float = 0.8) -> KillReport | None:
    """Stop ``handle``'s process tree, giving the caller control back after ``wait_s`` at most.

    After the user's Stop the cell must return within about a second, but a real server may take longer
    than that to end on SIGTERM: the stop carries on in a (non-daemon) thread, so a script still waits for
    it before exiting, while the notebook is free at once.
    """
    box: list[KillReport] = []

    def stop() -> None:
        with contextlib.suppress(Exception):
            box.append(handle.stop(grace_s=grace_s))

    worker = threading.Thread(target=stop, name="dsv4lab-stop", daemon=False)
    worker.start()
    worker.join(wait_s)
    return box[0] if box else None


def wait_ready(
    handle: ServerHandle,
    timeout_s: float = 900.0,
    *,
    stall_after_s: float = 300.0,
    liveness_every_s: float = 0.5,
    health_every_s: float = 2.0,
    http_timeout_s: float = 2.0,
    dying_grace_s: float = 3.0,
    reconnect_max_s: float = 30.0,
    exit_status_wait_s: float = 1.0,
    keep_running: bool = False,
    progress: bool | Progress = True,
    hardware: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Readiness:
    """Follow the log, liveness and health of ``handle`` until READY, CRASHED, STALLED or TIMEOUT.

    A fatal log line (an OOM, ``Scheduler hit an exception``, SGLang's own ``kill_process_tree``...) or a
    dead process ends the wait at once; ``dying_grace_s`` only lets the rest of a traceback arrive (half a
    second after its exception line, :data:`TRACEBACK_SETTLE_S`, once that came). A ready
    line counts only while the process lives, so re-attaching to an old run dir reports the server *now*.
    A server that logged a fatal error and still runs is ended a moment after the verdict (its processes hold
    memory and it cannot serve), unless ``keep_running``. The user's Stop (Ctrl-C) stops the server unless
    ``keep_running`` and raises
    :class:`~dsv4lab.errors.Interrupted` carrying the readiness seen so far (verdict INTERRUPTED).
    ``hardware`` names the profile for the crash diagnosis's memory model (default: the twin's, or guessed
    from the log).
    """
    w = _Watch(handle, hardware, keep_running)
    bar = (
        progress
        if isinstance(progress, Progress)
        else Progress(f"{handle.target} on {handle.host.name}", enabled=progress, started=w.origin)
    )
    w.bar = bar
    try:
        result = w.run(
            timeout_s=timeout_s,
            stall_after_s=stall_after_s,
            liveness_every_s=liveness_every_s,
            health_every_s=health_every_s,
            http_timeout_s=http_timeout_s,
            dying_grace_s=dying_grace_s,
            reconnect_max_s=reconnect_max_s,
            exit_status_wait_s=exit_status_wait_s,
            on_line=on_line,
        )
    except HostConnectionError as exc:
        bar.finish("the connection to the host is lost", "fail")
        raise HostConnectionError(
            f"lost the connection to {handle.host.name} while watching {handle.run_dir} and could not reconnect "
            f"within {reconnect_max_s:g} s ({exc}). The server was not stopped and may still be running: watch "
            f"it again when the host is reachable (lab.attach({handle.run_dir!r}), or `dsv4lab watch "
            f"{handle.run_dir} --host {handle.host.name}`)"
        ) from exc
    except KeyboardInterrupt:
        partial = w.finish(Verdict.INTERRUPTED, "the user stopped the watch", None, None)
        if not keep_running:
            stop_soon(handle)
            partial = dataclasses.replace(partial, reason=partial.reason + "; the server was stopped")
        bar.finish(f"INTERRUPTED ({partial.last_phase or 'no phase seen'})", "warn")
        raise Interrupted(
            f"the watch of {posixpath.basename(handle.run_dir.rstrip('/')) or handle.run_dir}",
            partial,
            after=f"in phase {partial.last_phase}" if partial.last_phase else "before the first startup phase",
            elapsed_s=partial.elapsed_s,
            note="the server was stopped" if not keep_running else "the server keeps running",
        ) from None
    finally:
        w.close()
    bar.finish(result.headline(), VERDICT_STATE[result.verdict])
    return result


#: A watch begun this soon after its launch counts time from the launch (what "READY after N s" means to
#: a reader); one begun later (an attach, a restarted kernel) counts from itself, since the phases it reads
#: from old log lines were not reached when it read them.
LAUNCH_CLOCK_MAX_S = 60.0


def _clock_origin(handle: ServerHandle, now: float) -> float:
    age = time.time() - handle.started_at
    return now - age if 0.0 <= age <= LAUNCH_CLOCK_MAX_S else now


@dataclass(frozen=True)
class _Intervals:
    """How often a watch looks (s): what wait_ready was given."""

    stall_s: float
    liveness_s: float
    health_s: float
    http_timeout_s: float
    dying_grace_s: float


@dataclass
class _Seen:
    """What a watch has seen and when (``time.monotonic()``), and when it looks at the process and /health
    next."""

    last_line_at: float
    next_liveness: float
    next_health: float
    fatal_at: float | None = None
    definitive_at: float | None = None  # a fatal line death follows (not a bare Traceback header)
    exception_at: float | None = None  # an exception line after it: the traceback's end has arrived
    stranger_noted: bool = False  # /health was answered by another process's listener on the port
    next_ready_probe: float = 0.0  # after a ready line: when /health is asked next
    ready_at: float | None = None
    server_pid: int | None = None
    last_look: bool = False  # the deadline passed: one more round, then TIMEOUT
    queued: Any | None = None  # the Slurm job while it waits in the queue (a SlurmJob), else None


class _Watch:
    """The state of one watch: what has been seen, and the connections to close."""

    def __init__(self, handle: ServerHandle, hardware: str | None, keep_running: bool) -> None:
        self.handle = handle
        self.hardware = hardware or str(handle.extra.get("twin_env", {}).get("DSV4LAB_TWIN_HARDWARE") or "") or None
        self.keep_running = keep_running
        self.start = time.monotonic()
        self.origin = _clock_origin(handle, self.start)
        self.head: list[str] = []  # the first lines hold server_args, which the diagnosis's memory model needs
        self.lines: deque[str] = deque(maxlen=_KEEP_LINES)
        self.timeline: list[PhaseMark] = []
        self.last_phase: str | None = None
        self.fatal_lines: list[str] = []
        #: The server logged a shutdown signal before any fatal line (what it logs after is the stop's doing).
        self.signalled_first = False
        self.follower: Follower | None = None
        self.forward: PortForward | None = None
        self.offset = 0
        self.count = 0  # lines read in all
        self.first_line_t: float | None = None  # when the server's first log line was read (from the origin)
        self.first_ts: float | None = None  # the first timestamp the log gave, and the latest
        self.last_ts: float | None = None
        self.ready_log_t: float | None = None  # the ready line's moment by the log's clock
        self.bar: Progress | None = None
        self.queued_s: float | None = None  # the Slurm job's time in the queue, once it started
        self.job: Any | None = None  # the Slurm job as last seen
        self.scheduler_lines: list[str] = []  # what Slurm said about the job's end

    def close(self) -> None:
        if self.follower is not None:
            with contextlib.suppress(Exception):
                self.follower.close()
        if self.forward is not None:
            self.forward.close()

    def log_t(self) -> float | None:
        """Seconds from the log's first timestamp to its latest one (the server's own clock)."""
        if self.first_ts is None or self.last_ts is None:
            return None
        return self.last_ts - self.first_ts

    def mark(self, phase: str) -> None:
        # Ranks interleave their lines: a phase counts once, when the first rank reaches it.
        if all(m.phase != phase for m in self.timeline):
            self.last_phase = phase
            self.timeline.append(PhaseMark(phase, time.monotonic() - self.origin, self.log_t()))
            if self.bar is not None:
                self.bar.update(phase)

    def add(self, text: str) -> LineKind:
        if self.count == 0:
            self.first_line_t = time.monotonic() - self.origin
        self.count += 1
        ts = log_timestamp(text)
        if ts is not None:
            self.first_ts = ts if self.first_ts is None else self.first_ts
            self.last_ts = ts
        if len(self.head) < _HEAD_LINES:
            self.head.append(text)
        self.lines.append(text)
        kind = classify_line(text)
        if _is_fatal(kind):
            self.fatal_lines.append(text)
        elif not self.fatal_lines and not self.signalled_first and SHUTDOWN_SIGNAL.search(text):
            self.signalled_first = True
        return kind

    def all_lines(self) -> list[str]:
        """Head and tail of what was read, without the overlap."""
        if self.count <= len(self.lines):
            return list(self.lines)
        return [*self.head, "[... lines skipped ...]", *self.lines]

    def diagnose(self) -> Diagnosis:
        lines = self.all_lines()
        try:
            return self.handle.engine.diagnose(lines, hardware=self.hardware, version=self.handle.version)
        except Exception:  # the model is a bonus; the log reading alone must still come back
            return diagnose(lines)

    def finish(self, verdict: Verdict, reason: str, detected_from: float | None, exit_status: int | None) -> Readiness:
        now = time.monotonic()
        diag: Diagnosis | None = None
        evidence: tuple[str, ...] = ()
        if verdict not in (Verdict.READY, Verdict.INTERRUPTED) and self.lines:
            diag = self.diagnose()
            # With no error block to show, the last lines the server (or its launch script) wrote are
            # the evidence: a missing env file or a bash error explains a silent exit.
            evidence = tuple(diag.evidence) or tuple(self.fatal_lines[-40:]) or tuple(list(self.lines)[-20:])
            # How the scheduler ended the job is evidence whatever the log says.
            evidence += tuple(line for line in self.scheduler_lines if line not in evidence)
            if verdict is Verdict.CRASHED and diag.cause:
                reason = f"{reason} {diag.cause}".strip()
        return Readiness(
            verdict,
            reason,
            evidence,
            exit_status,
            tuple(self.timeline),
            now - self.origin,
            None if detected_from is None else now - detected_from,
            self.last_phase,
            diag,
            self.handle.clock,
            self.first_line_t,
            self.end_log_t(verdict),
            self.queued_s,
            self.job.to_dict() if self.job is not None else None,
        )

    def end_log_t(self, verdict: Verdict) -> float | None:
        """The verdict's moment by the log's clock: the ready line's for READY, else the last line's."""
        if verdict is Verdict.READY:
            ready = self.ready_log_t
            ready = ready if ready is not None else next((m.log_t for m in self.timeline if m.phase == "ready"), None)
            if ready is not None:
                return ready
        return self.log_t()

    def connect(self, reconnect_max_s: float) -> None:
        host = self.handle.host
        delay = 0.25
        give_up = time.monotonic() + reconnect_max_s
        while True:
            try:
                reconnect = getattr(host, "connect", None)
                if self.follower is not None:
                    with contextlib.suppress(Exception):
                        self.follower.close()
                    if callable(reconnect):
                        reconnect()
                self.follower = host.follow(self.handle.log_path, self.offset)
                return
            except HostConnectionError:
                if time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 4.0)

    def alive(self, server_pid: int | None) -> bool:
        return self.handle.running(server_pid)

    def in_queue(self, seen: _Seen, now: float) -> bool:
        """Whether the server's job still waits in the scheduler's queue: shown live with its reason, and the
        silence of a log nobody writes yet is no stall. When the job starts, the clock restarts at its
        start: startup is counted from there, the queue time apart."""
        job = self.handle.waiting()
        if job is not None:
            if (seen.queued is None or seen.queued.reason != job.reason) and self.bar is not None:
                self.bar.update(f"QUEUED: Slurm job {job.job_id}, {job.reason_words()}")
            seen.queued = self.job = job
            seen.last_line_at = now
            return True
        if seen.queued is not None or self.job is None:
            job = self.handle.job()
            if job is not None:
                self.job = job
                self.queued_s = job.queued_s
                if job.start_time is not None and (seen.queued is not None or self.origin < self.start):
                    # Startup counts from the job's start (when this watch counts from the launch); the queue
                    # is reported apart.
                    self.origin = now - max(0.0, time.time() - job.start_time)
                    seen.last_line_at = now
            seen.queued = None
        return False

    def death(self, status: int | None) -> str:
        """Say how the server ended, from the exit status, the stop marker and what it logged."""
        h = self.handle
        # A server that logged its death was not stopped, unless it logged the stop's signal first.
        if (not self.fatal_lines or self.signalled_first) and h.stopped_on_purpose():
            return "stopped"
        died = "the server process has exited" + (f" with status {status}" if status is not None else "")
        logged_cause = False
        if not self.fatal_lines and self.lines:
            d = diagnose(list(self.lines))
            logged_cause = d.outcome in (Outcome.CRASH, Outcome.OOM) and bool(d.cause)
        if not self.lines and h.host.read_text(h.log_path) is None:
            return (
                "the launch script exited before the server wrote its log "
                f"(no {h.log_path}; launcher exit status {status})"
            )
        if status == 137 and not self.fatal_lines and not logged_cause:
            return died + " (SIGKILL, and it logged no error: killed from outside, e.g. the OOM killer)"
        if not self.fatal_lines and not logged_cause:
            return died + " without logging an error"
        return died

    def run(
        self,
        *,
        timeout_s: float,
        stall_after_s: float,
        liveness_every_s: float,
        health_every_s: float,
        http_timeout_s: float,
        dying_grace_s: float,
        reconnect_max_s: float,
        exit_status_wait_s: float,
        on_line: Callable[[str], None] | None,
    ) -> Readiness:
        every = _Intervals(stall_after_s, liveness_every_s, health_every_s, http_timeout_s, dying_grace_s)
        seen = _Seen(last_line_at=self.start, next_liveness=self.start, next_health=self.start + health_every_s)
        self.connect(reconnect_max_s)
        while True:
            now = time.monotonic()
            if now - self.start > timeout_s:
                if seen.last_look and seen.queued is not None:
                    job = seen.queued
                    return self.finish(
                        Verdict.QUEUED,
                        f"still queued after {timeout_s:.0f} s: Slurm job {job.job_id} is {job.state}, "
                        f"Reason={job.reason_words()}",
                        None,
                        None,
                    )
                if seen.last_look:
                    return self.finish(
                        Verdict.TIMEOUT,
                        f"not ready after {timeout_s:.0f} s (last phase: {self.last_phase or 'none seen'})",
                        None,
                        None,
                    )
                # One more look at the log, the process and /health before giving up: after a pause on this
                # side (a laptop that slept, a stopped process) the deadline passes unseen, and the server may
                # have become ready (or died) meanwhile. The verdict is the server's state now.
                seen.last_look = True
                seen.next_liveness = seen.next_health = now
            try:
                self.read_new(seen, on_line)
                verdict = self.judge(seen, every, exit_status_wait_s)
                if verdict is not None:
                    return verdict
            except HostConnectionError:
                self.connect(reconnect_max_s)  # resumes at `offset`; a dropped connection is not a verdict
                seen.last_look = False  # the last look before a timeout was cut short: look again

    def read_new(self, seen: _Seen, on_line: Callable[[str], None] | None) -> None:
        """The lines written since the last poll (sooner once a fatal line came): phases, ready, fatal."""
        assert self.follower is not None
        new = self.follower.poll(0.05 if seen.fatal_at else 0.2)
        self.offset = self.follower.resume_offset
        for item in new:
            text = item.text
            kind = self.add(text)
            seen.last_line_at = time.monotonic()
            if on_line is not None:
                on_line(text)
            label = _PHASE_LABEL.get(kind)
            if label is not None:
                self.mark(label)
            if kind is LineKind.READY and seen.ready_at is None:
                seen.ready_at = time.monotonic()
                self.ready_log_t = self.log_t()
            elif _is_fatal(kind):
                if seen.fatal_at is None:
                    seen.fatal_at = time.monotonic()
                if seen.definitive_at is None and _is_definitive(text):
                    seen.definitive_at = time.monotonic()
            if seen.definitive_at is not None and EXCEPTION_ANY.search(text):
                seen.exception_at = time.monotonic()

    def judge(self, seen: _Seen, every: _Intervals, exit_status_wait_s: float) -> Readiness | None:
        """The verdict this round, if there is one: from the process (due, or at once after a ready or a fatal
        line), then /health (while nothing fatal was logged), then the silence of the log."""
        now = time.monotonic()
        if (
            now >= seen.next_liveness
            or seen.fatal_at is not None
            or (seen.ready_at is not None and seen.fatal_at is None)
        ):
            seen.next_liveness = now + every.liveness_s
            verdict = self.judge_process(seen, now, every.dying_grace_s, exit_status_wait_s, every.http_timeout_s)
            if verdict is not None:
                return verdict
        if seen.queued is not None:
            return None  # nothing runs yet: no port to ask, no log to fall silent
        if seen.fatal_at is None and now >= seen.next_health:
            seen.next_health = now + every.health_s
            if self.answers(seen, every.http_timeout_s):
                self.mark("ready")
                return self.finish(Verdict.READY, "GET /health answered 200", now, None)
        if seen.fatal_at is None and now - seen.last_line_at > every.stall_s:
            return self.finish(
                Verdict.STALLED,
                f"the server is alive but wrote nothing for {now - seen.last_line_at:.0f} s "
                f"(last phase: {self.last_phase or 'none seen'})",
                seen.last_line_at,
                None,
            )
        return None

    def ours(self, seen: _Seen) -> bool:
        """Whether the port that answered belongs to this server (see :meth:`ServerHandle.owns_port`); a
        stranger's answer is noted once in the evidence and the watch goes on."""
        try:
            owned = self.handle.owns_port()
        except DSV4LabError:
            return True  # the host could not say: /health is the evidence there is
        if owned is False and not seen.stranger_noted:
            seen.stranger_noted = True
            self.add(
                f"[dsv4lab: GET /health on port {self.handle.port} was answered, but not by this server's "
                "listener (another process's, or none by the time it was asked; the server has not bound its "
                "port yet): not READY]"
            )
        return owned is not False

    def answers(self, seen: _Seen, http_timeout_s: float) -> bool:
        """``GET /health`` answers 200, and from this server's own listener."""
        if self.forward is None:
            self.forward = self.handle.forward()
        return _http_ok(f"{self.forward.url}/health", http_timeout_s) and self.ours(seen)

    def judge_process(
        self, seen: _Seen, now: float, dying_grace_s: float, exit_status_wait_s: float, http_timeout_s: float = 2.0
    ) -> Readiness | None:
        """A dead process is the verdict (stopped or crashed); a live one confirms a ready line, or a fatal
        one once the rest of its traceback had time to arrive."""
        h = self.handle
        if self.in_queue(seen, now):
            return None
        if seen.server_pid is None:
            seen.server_pid = h.server_pid()
        if not self.alive(seen.server_pid):
            return self.ended(seen, now, exit_status_wait_s)
        if seen.ready_at is not None and seen.fatal_at is None:
            # The ready line can come before the port is served (uvicorn logs its startup before it listens;
            # seen 20 s apart on a loaded machine): READY once /health answers too.
            if now < seen.next_ready_probe:
                return None
            seen.next_ready_probe = now + _READY_PROBE_EVERY_S
            if not self.answers(seen, http_timeout_s):
                return None
            self.mark("ready")
            return self.finish(
                Verdict.READY, "the server logged that it is ready, it runs and GET /health answered 200", now, None
            )
        if seen.definitive_at is not None and _settled(seen, now, dying_grace_s):
            verdict = self.finish(Verdict.CRASHED, "the server logged a fatal error.", seen.fatal_at, h.exit_status())
            if not self.keep_running:  # after the verdict: its detection time is taken
                _end_in_background(h, wait_s=dying_grace_s)
            return verdict
        return None

    def ended(self, seen: _Seen, now: float, exit_status_wait_s: float) -> Readiness:
        h = self.handle
        assert self.follower is not None
        # Read what the dying process wrote after our last poll before judging.
        for item in self.follower.poll(0.1):
            self.add(item.text)
        # The launch script writes the exit status just after the server dies: give it a moment, or a fast
        # watcher reports "exited" without the status.
        status = h.exit_status()
        settle = time.monotonic() + exit_status_wait_s
        while status is None and time.monotonic() < settle:
            time.sleep(0.05)
            status = h.exit_status()
        why = self.death(status)
        ended = h.end_words()
        if ended is not None:
            self.job = h.job(fresh=True) or self.job
        if ended is not None and why != "stopped":
            self.scheduler_lines = [f"[dsv4lab: {ended}]", *_job_output_tail(h)]
            for line in self.scheduler_lines:
                self.add(line)
            why = f"{ended}; {why}"
        if why == "stopped":
            return self.finish(
                Verdict.STOPPED,
                f"the server was stopped on purpose and is not running (exit status {status})",
                None,
                status,
            )
        verdict = self.finish(Verdict.CRASHED, why + ".", seen.fatal_at or now, status)
        # After the verdict (its detection time is taken): the dead server's helpers must not live on.
        with contextlib.suppress(DSV4LabError):
            h.reap()
        return verdict


def _job_output_tail(handle: ServerHandle) -> list[str]:
    """Slurm's own lines in the job's output file (``*** JOB 12 ON n1 CANCELLED AT ... DUE TO TIME LIMIT ***``):
    the launch script sends its output to the server's log, so what is left there is slurmstepd's."""
    job = handle.job()
    text = handle.host.read_text(f"{handle.run_dir}/slurm-{job.job_id}.out", max_bytes=1 << 16) if job else None
    return [line for line in (text or "").splitlines() if line.strip()][-5:]


def wait_ready_all(
    handles: Sequence[ServerHandle],
    timeout_s: float = 900.0,
    *,
    stall_after_s: float = 300.0,
    keep_running: bool = False,
    hardware: str | None = None,
    progress: bool = True,
) -> Readiness:
    """One verdict for a multi-node server, watching every node at once.

    The first node that is not READY decides (a crash on node 1 must not wait behind node 0's timeout:
    node 0 typically hangs in NCCL when a peer dies); when every node is READY, node 0's readiness stands.
    """
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(handles)))
    started = time.monotonic()
    results: dict[int, Readiness] = {}
    try:
        futures = {
            pool.submit(
                wait_ready,
                h,
                timeout_s,
                stall_after_s=stall_after_s,
                keep_running=True,  # the nodes are stopped together below, never one by one
                progress=progress and len(handles) == 1,  # progress draws from the caller's thread only
                hardware=hardware,
            ): i
            for i, h in enumerate(handles)
        }
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if not result.ready:
                if not keep_running:
                    for h in handles:  # end the other watches: stop the whole multi-node server
                        with contextlib.suppress(Exception):
                            h.stop(grace_s=5.0)
                return result
    except KeyboardInterrupt:
        if not keep_running:
            for h in handles:
                stop_soon(h)
        raise Interrupted(
            f"the watch of {len(handles)} nodes",
            None,
            after=f"with {len(results)} of {len(handles)} nodes READY",
            elapsed_s=time.monotonic() - started,
            note="the server was stopped on every node" if not keep_running else "the server keeps running",
        ) from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return results[0]
