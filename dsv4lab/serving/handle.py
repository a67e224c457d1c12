"""A launched server's handle: where it runs, what it is, the files that tell its fate, and how to end it.

``handle.json`` in the run dir records it, so a later notebook, another machine or ``dsv4lab stop`` can find
the server again from the directory alone (:func:`dsv4lab.serving.launch.attach`). A handle ends the whole
process tree: SGLang leaves scheduler and detokenizer children behind, vLLM its EngineCore and workers.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.config import AnyConfig
from dsv4lab.engines import Engine, SGLangEngine, get_engine
from dsv4lab.errors import DSV4LabError
from dsv4lab.hosts import Host, KillReport, PortForward
from dsv4lab.rundir import RunLayout
from dsv4lab.serving.slurm import SlurmJob
from dsv4lab.units import Clock

__all__ = ["HANDLE_FILE", "ServerHandle", "listener_groups"]

#: The file in a run dir that records its launch (what :func:`~dsv4lab.serving.launch.attach` reads back).
HANDLE_FILE = "handle.json"


@dataclass
class ServerHandle:
    """A launched server: where it runs, what it is, and the files that tell its fate."""

    host: Host
    config: AnyConfig
    run_dir: str
    launcher_pid: int
    started_at: float
    target: str = "sglang"
    #: The engine release whose flags were rendered (SGLang's for the twin and SGLang).
    version: str = "0.5.23"
    node_rank: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    @property
    def log_path(self) -> str:
        return self.layout.log

    @property
    def port(self) -> int:
        return self.config.port

    @property
    def engine(self) -> Engine:
        return get_engine(self.target)

    @property
    def sglang_version(self) -> str:
        """The release whose flags were rendered (named for SGLang, the first engine; see ``version``)."""
        return self.version

    @property
    def settings(self) -> dict[str, str]:
        """The engine settings the launch exported (the twin's profile, time scale, fault)."""
        return dict(self.extra.get("twin_env") or {})

    @property
    def clock(self) -> Clock:
        """The clock this server's figures are read on (the twin's modelled hardware, or as measured)."""
        return self.engine.clock(self.settings)

    def server_pid(self) -> int | None:
        """PID of the server process, once the launch script has started it."""
        text = self.host.read_text(self.layout.server_pid)
        return int(text) if text and text.strip().isdigit() else None

    def exit_status(self) -> int | None:
        """The server's exit status when it has ended (or the launcher's, if it died before starting it)."""
        for path in (self.layout.server_exit, self.layout.launcher_exit):
            text = self.host.read_text(path)
            if text and text.strip().lstrip("-").isdigit():
                return int(text.strip())
        return None

    def is_alive(self) -> bool:
        """Whether the launch still holds anything: the launch script runs (a Slurm job: queued or running)."""
        return self.host.is_alive(self.launcher_pid)

    def running(self, server_pid: int | None) -> bool:
        """Whether the launch runs now, and the server once it has started: what a watch judges by."""
        return self.host.is_alive(self.launcher_pid) and (server_pid is None or self.host.is_alive(server_pid))

    def waiting(self) -> Any | None:
        """What the server waits for before it can start (a queued Slurm job, with its reason); None when
        nothing stands between the launch and the server."""
        return None

    def job(self, *, fresh: bool = False) -> SlurmJob | None:
        """The scheduler's job this server runs in (a Slurm job, as Slurm tells it now); None without one."""
        return None

    def end_words(self, *, settle_s: float = 15.0) -> str | None:
        """How the placement ended the server, where it did (a Slurm job's time limit, a cancel), waiting up to
        ``settle_s`` for its end state; None here."""
        return None

    def forward(self) -> PortForward:
        """A local port that reaches the server's (through the host's connection)."""
        return self.host.forward(self.port)

    def stopped_on_purpose(self) -> bool:
        """Whether :meth:`stop` (or ``dsv4lab stop``) ended this server."""
        return self.host.read_text(self.layout.stopped) is not None

    def stop(self, *, grace_s: float = 10.0) -> KillReport:
        """End the launcher, the server and every child; report what was stopped.

        A ``stopped.json`` marker goes into the run dir first, so that a watcher that sees the death calls
        it STOPPED rather than CRASHED.
        """
        if self.is_alive():
            marker = {"stopped_at": time.time(), "launcher_pid": self.launcher_pid}
            with contextlib.suppress(DSV4LabError):  # the kill matters more than the marker
                self.host.put_text(self.layout.stopped, json.dumps(marker) + "\n", mode=0o600)
        report = self.host.kill_tree(self.launcher_pid, grace_s=grace_s)
        pid = self.server_pid()
        if pid is not None and self.host.is_alive(pid):  # a server that left the launcher's group
            extra = self.host.kill_tree(pid, grace_s=grace_s)
            report = KillReport(
                report.root_pid,
                tuple(sorted({*report.terminated, *extra.terminated})),
                tuple(sorted({*report.killed, *extra.killed})),
            )
        return report

    def reap(self, *, grace_s: float = 5.0) -> KillReport | None:
        """End what a dead server left running in its launch's process group; ``None`` when the launcher is
        still running (the server is not dead) or nothing was left.

        A server's helpers can outlive it: vLLM's EngineCore and workers stay up, re-parented to PID 1 and
        holding their memory, when the API server is SIGKILLed. The launch script leads the group they are
        all in, so the group outlives its leader and its members are found by its id.
        """
        if self.host.is_alive(self.launcher_pid):
            return None
        report = self.host.kill_tree(self.launcher_pid, grace_s=grace_s)
        return report if report.terminated or report.killed else None

    def owns_port(self, *, timeout_s: float = 15.0) -> bool | None:
        """Whether what listens on the server's port is this launch's (its process group): False when it is
        another process's — a server that binds its port late (vLLM after half a minute, SGLang after
        loading) leaves it free until then, and a ``/health`` answered by someone else is no READY — or when
        nothing listens any more (whoever answered has gone: a stranger that answered and quit was taken for
        the server in CI); None when the host cannot tell (no ``ss``, or listeners whose PIDs it hides, such
        as another user's or a container proxy's)."""
        groups = listener_groups(self.host, self.port, timeout_s=timeout_s)
        if groups is None:
            return None
        return self.launcher_pid in groups

    def end_crashed(self, *, wait_s: float = 3.0, grace_s: float = 5.0) -> KillReport | None:
        """End a server that logged a fatal error and still runs: it cannot serve, and its processes hold
        memory (vLLM's API server outlives its failed EngineCore by many seconds). It gets ``wait_s`` to exit
        by itself and write its last lines first; no stop marker is written, since it crashed, and a later
        watch says so. ``None`` when it had exited by itself."""
        deadline = time.monotonic() + wait_s
        while self.host.is_alive(self.launcher_pid):
            if time.monotonic() >= deadline:
                return self.host.kill_tree(self.launcher_pid, grace_s=grace_s)
            time.sleep(0.2)
        return self.reap(grace_s=grace_s)

    def to_dict(self) -> dict[str, Any]:
        """The handle as ``handle.json`` records it: secrets redacted (``env.sh`` alone keeps them)."""
        from dsv4lab.secrets import collect_secrets, redact_data

        record = {
            "host": self.host.name,
            "run_dir": self.run_dir,
            "launcher_pid": self.launcher_pid,
            "started_at": self.started_at,
            "target": self.target,
            "version": self.version,
            **({"sglang_version": self.version} if isinstance(self.engine, SGLangEngine) else {}),
            "node_rank": self.node_rank,
            "port": self.port,
            "config": self.config.to_dict(redact=True),
            **self.extra,
        }
        data: dict[str, Any] = redact_data(record, collect_secrets(self.config, self.extra))
        return data

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        facts: list[tuple[str, object]] = [
            ("host", f"{self.host.name} ({self.target}, {self.engine.release_words(self.version)})"),
            ("port", str(self.port)),
            ("run dir", self.run_dir),
            ("launcher PID", str(self.launcher_pid)),
        ]
        return hv.card("launched server", hv.kv_table(facts))


def listener_groups(host: Host, port: int, *, timeout_s: float = 15.0) -> list[int] | None:
    """Process-group ids of the processes listening on ``port`` on the host: [] when nothing listens, None
    when the host cannot tell (no ``ss``, or something listens whose PID ``ss`` does not show)."""
    script = (
        'lines=$(ss -ltnpH "sport = :$1" 2>/dev/null) || { echo UNKNOWN; exit 0; }\n'
        'pids=$(printf "%s\\n" "$lines" | grep -o "pid=[0-9]*" | cut -d= -f2 | sort -un)\n'
        '[ -n "$lines" ] && [ -z "$pids" ] && { echo UNKNOWN; exit 0; }\n'
        "for pid in $pids; do\n"
        '  ps -o pgid= -p "$pid" 2>/dev/null || true\n'
        "done\n"
    )
    result = host.run(["bash", "-c", script, "dsv4lab-port", str(port)], timeout_s=timeout_s)
    words = result.stdout.split()
    if "UNKNOWN" in words:
        return None
    return sorted({int(x) for x in words if x.isdigit()})
