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
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dsv4lab.errors import HostConnectionError
from dsv4lab.hosts import Follower, PortForward
from dsv4lab.launch import ServerHandle
from dsv4lab.logs import Diagnosis, LineKind, classify_line, diagnose

__all__ = ["PhaseMark", "Readiness", "Verdict", "wait_ready", "wait_ready_all"]

#: Lines kept for evidence and diagnosis (a traceback plus what led to it).
_KEEP_LINES = 4000

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


class Verdict(str, Enum):
    READY = "READY"
    CRASHED = "CRASHED"
    STALLED = "STALLED"
    TIMEOUT = "TIMEOUT"


@dataclass(frozen=True)
class PhaseMark:
    """A startup phase first seen ``t`` seconds after the watch began."""

    phase: str
    t: float


@dataclass(frozen=True)
class Readiness:
    """The watcher's verdict, with the evidence behind it."""

    verdict: Verdict
    reason: str
    evidence: tuple[str, ...]
    exit_status: int | None
    timeline: tuple[PhaseMark, ...]
    elapsed_s: float
    detected_after_s: float | None
    last_phase: str | None
    diagnosis: Diagnosis | None = field(default=None, compare=False)

    @property
    def ready(self) -> bool:
        return self.verdict is Verdict.READY

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "exit_status": self.exit_status,
            "evidence": list(self.evidence),
            "timeline": [{"phase": m.phase, "t": round(m.t, 3)} for m in self.timeline],
            "elapsed_s": round(self.elapsed_s, 3),
            "detected_after_s": None if self.detected_after_s is None else round(self.detected_after_s, 3),
            "last_phase": self.last_phase,
            "diagnosis": self.diagnosis.to_dict() if self.diagnosis is not None else None,
        }

    def _repr_html_(self) -> str:
        colour = {"READY": "#1a7f37", "CRASHED": "#cf222e"}.get(self.verdict.value, "#9a6700")
        steps = " → ".join(f"{m.phase} ({m.t:.1f} s)" for m in self.timeline)
        ev = "".join(f"{_esc(line)}\n" for line in self.evidence[-30:])
        return (
            f"<p><b style='color:{colour}'>{self.verdict.value}</b> after {self.elapsed_s:.1f} s: "
            f"{_esc(self.reason)}</p><p>{_esc(steps)}</p>" + (f"<pre>{ev}</pre>" if ev else "")
        )


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Progress:
    """tqdm.auto bar (terminal or notebook) showing the phase and the elapsed time."""

    def __init__(self, enabled: bool, desc: str) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=None, desc=desc, bar_format="{desc} {elapsed}", leave=True)

    def update(self, phase: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(phase, refresh=False)
            self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - our own server via loopback
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


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
    progress: bool = True,
    on_line: Callable[[str], None] | None = None,
) -> Readiness:
    """Follow the log, liveness and health of ``handle`` until READY, CRASHED, STALLED or TIMEOUT.

    A fatal log line (an OOM, ``Scheduler hit an exception``, SGLang's own ``kill_process_tree``...) or a
    dead process ends the wait at once; ``dying_grace_s`` only lets the rest of a traceback arrive. An
    interrupt (Ctrl-C, notebook stop) stops the server unless ``keep_running``, then propagates.
    """
    host = handle.host
    start = time.monotonic()
    lines: deque[str] = deque(maxlen=_KEEP_LINES)
    timeline: list[PhaseMark] = []
    last_phase: str | None = None
    last_line_at = start
    next_liveness = start
    next_health = start + health_every_s
    fatal_at: float | None = None
    definitive_at: float | None = None
    fatal_lines: list[str] = []
    ready_at: float | None = None
    server_pid: int | None = None
    follower: Follower | None = None
    forward: PortForward | None = None
    offset = 0
    bar = _Progress(progress, "starting")

    def mark(phase: str) -> None:
        # Ranks interleave their lines: a phase counts once, when the first rank reaches it.
        nonlocal last_phase
        if all(m.phase != phase for m in timeline):
            last_phase = phase
            timeline.append(PhaseMark(phase, time.monotonic() - start))
            bar.update(phase)

    def finish(verdict: Verdict, reason: str, detected_from: float | None, exit_status: int | None) -> Readiness:
        now = time.monotonic()
        diag: Diagnosis | None = None
        evidence: tuple[str, ...] = ()
        if verdict is not Verdict.READY and lines:
            diag = diagnose(list(lines))
            # With no error block to show, the last lines the server (or its launch script) wrote are
            # the evidence: a missing env file or a bash error explains a silent exit.
            evidence = tuple(diag.evidence) or tuple(fatal_lines[-40:]) or tuple(list(lines)[-20:])
            if verdict is Verdict.CRASHED and diag.cause:
                reason = f"{reason} {diag.cause}".strip()
        return Readiness(
            verdict,
            reason,
            evidence,
            exit_status,
            tuple(timeline),
            now - start,
            None if detected_from is None else now - detected_from,
            last_phase,
            diag,
        )

    def connect() -> None:
        nonlocal follower
        delay = 0.25
        give_up = time.monotonic() + reconnect_max_s
        while True:
            try:
                reconnect = getattr(host, "connect", None)
                if follower is not None:
                    with contextlib.suppress(Exception):
                        follower.close()
                    if callable(reconnect):
                        reconnect()
                follower = host.follow(handle.log_path, offset)
                return
            except HostConnectionError:
                if time.monotonic() + delay > give_up:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 4.0)

    try:
        connect()
        while True:
            now = time.monotonic()
            if now - start > timeout_s:
                return finish(
                    Verdict.TIMEOUT,
                    f"not ready after {timeout_s:.0f} s (last phase: {last_phase or 'none seen'})",
                    None,
                    None,
                )
            try:
                assert follower is not None
                new = follower.poll(0.05 if fatal_at else 0.2)
                offset = follower.resume_offset
                for item in new:
                    text = item.text
                    lines.append(text)
                    last_line_at = time.monotonic()
                    if on_line is not None:
                        on_line(text)
                    kind = classify_line(text)
                    label = _PHASE_LABEL.get(kind)
                    if label is not None:
                        mark(label)
                    if kind is LineKind.READY and ready_at is None:
                        ready_at = time.monotonic()
                    elif _is_fatal(kind):
                        fatal_lines.append(text)
                        if fatal_at is None:
                            fatal_at = time.monotonic()
                        if definitive_at is None and _is_definitive(text):
                            definitive_at = time.monotonic()
                if ready_at is not None and fatal_at is None:
                    mark("ready")
                    return finish(Verdict.READY, "the server logged that it is ready", ready_at, None)
                now = time.monotonic()
                if now >= next_liveness or fatal_at is not None:
                    next_liveness = now + liveness_every_s
                    if server_pid is None:
                        server_pid = handle.server_pid()
                    alive = host.is_alive(handle.launcher_pid) and (server_pid is None or host.is_alive(server_pid))
                    if not alive:
                        # Read what the dying process wrote after our last poll before judging.
                        for item in follower.poll(0.1):
                            lines.append(item.text)
                            if _is_fatal(classify_line(item.text)):
                                fatal_lines.append(item.text)
                        # The launch script writes the exit status just after the server dies: give it a
                        # moment, or a fast watcher reports "exited" without the status.
                        status = handle.exit_status()
                        settle = time.monotonic() + exit_status_wait_s
                        while status is None and time.monotonic() < settle:
                            time.sleep(0.05)
                            status = handle.exit_status()
                        died = "the server process has exited" + (
                            f" with status {status}" if status is not None else ""
                        )
                        if not lines and handle.host.read_text(handle.log_path) is None:
                            died = (
                                "the launch script exited before the server wrote its log "
                                f"(no {handle.log_path}; launcher exit status {status})"
                            )
                        elif status == 137 and not fatal_lines:
                            died += " (SIGKILL, and it logged no error: killed from outside, e.g. the OOM killer)"
                        elif not fatal_lines:
                            died += " without logging an error"
                        return finish(Verdict.CRASHED, died + ".", fatal_at or now, status)
                    if definitive_at is not None and now - definitive_at > dying_grace_s:
                        return finish(
                            Verdict.CRASHED, "the server logged a fatal error.", fatal_at, handle.exit_status()
                        )
                if fatal_at is None and now >= next_health:
                    next_health = now + health_every_s
                    if forward is None:
                        forward = host.forward(handle.port)
                    if _http_ok(f"{forward.url}/health", http_timeout_s):
                        mark("ready")
                        return finish(Verdict.READY, "GET /health answered 200", now, None)
                if fatal_at is None and now - last_line_at > stall_after_s:
                    return finish(
                        Verdict.STALLED,
                        f"the server is alive but wrote nothing for {now - last_line_at:.0f} s "
                        f"(last phase: {last_phase or 'none seen'})",
                        last_line_at,
                        None,
                    )
            except HostConnectionError:
                connect()  # resumes at `offset`; a dropped connection is not a verdict
    except KeyboardInterrupt:
        if not keep_running:
            with contextlib.suppress(Exception):
                handle.stop(grace_s=5.0)
        raise
    finally:
        bar.close()
        if follower is not None:
            with contextlib.suppress(Exception):
                follower.close()
        if forward is not None:
            forward.close()


def wait_ready_all(handles: Sequence[ServerHandle], timeout_s: float = 900.0, **options: Any) -> Readiness:
    """One verdict for a multi-node server, watching every node at once.

    The first node that is not READY decides (a crash on node 1 must not wait behind node 0's timeout:
    node 0 typically hangs in NCCL when a peer dies); when every node is READY, node 0's readiness stands.
    """
    import concurrent.futures

    options = {**options, "progress": False} if len(handles) > 1 else options
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(handles))) as pool:
        futures = {pool.submit(wait_ready, h, timeout_s, **options): i for i, h in enumerate(handles)}
        results: dict[int, Readiness] = {}
        for future in concurrent.futures.as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if not result.ready:
                for h in handles:  # end the other watches: stop the whole multi-node server
                    with contextlib.suppress(Exception):
                        if not options.get("keep_running", False):
                            h.stop(grace_s=5.0)
                return result
    return results[0]
