"""Start, find again and stop a server (SGLang or the twin) on a host.

A launch writes everything it needs into one run directory on the host — config, env file, launch
script, and a ``handle.json`` — so that a later notebook, another machine or ``dsv4lab stop`` can
re-attach from the directory alone. Stopping ends the whole process tree: SGLang leaves scheduler and
detokenizer children behind, and a GPU held by an orphan blocks the next launch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.config import ServerConfig
from dsv4lab.errors import DSV4LabError
from dsv4lab.hosts import Host, KillReport, LocalHost
from dsv4lab.render import Target, render_env_file, render_launch_script
from dsv4lab.rundir import RunLayout
from dsv4lab.versions import resolve_release

__all__ = ["LaunchError", "ServerHandle", "StaleServerError", "attach", "find_listener", "launch", "launch_nodes"]

HANDLE_FILE = "handle.json"


class LaunchError(DSV4LabError):
    """The server could not be started (the host refused, or the run directory is in use)."""


class StaleServerError(LaunchError):
    """Something already listens on the server's port (an earlier server that was never stopped?)."""

    def __init__(self, host: str, port: int, pids: Sequence[int]) -> None:
        self.host = host
        self.port = port
        self.pids = tuple(pids)
        who = f"process(es) {', '.join(map(str, pids))}" if pids else "an unknown process"
        super().__init__(
            f"port {port} on {host} is already in use by {who}; stop it (dsv4lab stop RUN_DIR, or "
            "launch(..., replace_stale=True) to kill it) or choose another port"
        )


@dataclass
class ServerHandle:
    """A launched server: where it runs, what it is, and the files that tell its fate."""

    host: Host
    config: ServerConfig
    run_dir: str
    launcher_pid: int
    started_at: float
    target: Target = "sglang"
    sglang_version: str = "0.5.23"
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
        return self.host.is_alive(self.launcher_pid)

    def stop(self, *, grace_s: float = 10.0) -> KillReport:
        """End the launcher, the server and every child; report what was stopped."""
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host.name,
            "run_dir": self.run_dir,
            "launcher_pid": self.launcher_pid,
            "started_at": self.started_at,
            "target": self.target,
            "sglang_version": self.sglang_version,
            "node_rank": self.node_rank,
            "port": self.port,
            "config": self.config.to_dict(),
            **self.extra,
        }

    def _repr_html_(self) -> str:
        return (
            f"<p>Server on <b>{self.host.name}</b> port {self.port} ({self.target}, SGLang {self.sglang_version}); "
            f"run dir <code>{self.run_dir}</code>, launcher PID {self.launcher_pid}</p>"
        )


def find_listener(host: Host, port: int, *, timeout_s: float = 15.0) -> tuple[bool, list[int]]:
    """(something listens on ``port`` on the host's loopback, PIDs of the listeners when ``ss`` can tell)."""
    script = (
        'if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then echo LISTEN; fi\n'
        'ss -ltnpH "sport = :$1" 2>/dev/null | grep -o "pid=[0-9]*" | cut -d= -f2 | sort -un || true\n'
    )
    result = host.run(["bash", "-c", script, "dsv4lab-port", str(port)], timeout_s=timeout_s)
    lines = result.stdout.split()
    return ("LISTEN" in lines, [int(x) for x in lines if x.isdigit()])


def launch(
    host: Host,
    config: ServerConfig,
    run_dir: str,
    *,
    target: Target = "sglang",
    sglang_version: str | None = None,
    python: str | None = None,
    twin_env: Mapping[str, str] | None = None,
    replace_stale: bool = False,
    timeout_s: float = 60.0,
) -> ServerHandle:
    """Upload the env file and launch script into ``run_dir`` on ``host``, start the server, return at once.

    ``target="twin"`` starts the SGLang twin with the same flags (``twin_env`` sets its hardware profile,
    time scale and fault). A port already in use raises :class:`StaleServerError` unless
    ``replace_stale`` kills the process tree holding it.
    """
    release = resolve_release(sglang_version)
    if python is None:
        python = sys.executable if target == "twin" and isinstance(host, LocalHost) else "python3"
    run_dir = host.absolute_path(run_dir)
    layout = RunLayout(run_dir)
    host.makedirs(run_dir, timeout_s=timeout_s)
    previous = _read_handle(host, run_dir)
    if previous is not None and host.is_alive(int(previous["launcher_pid"])):
        if not replace_stale:
            raise LaunchError(
                f"run dir {run_dir} on {host.name} already has a running server (launcher PID "
                f"{previous['launcher_pid']}); stop it first or use another run dir"
            )
        host.kill_tree(int(previous["launcher_pid"]), grace_s=10.0)
    listening, pids = find_listener(host, config.port, timeout_s=timeout_s)
    if listening:
        if not replace_stale or not pids:
            raise StaleServerError(host.name, config.port, pids)
        for pid in pids:
            host.kill_tree(pid, grace_s=10.0)
    host.put_text(layout.config_file, config.to_toml())
    host.put_text(layout.env_file, render_env_file(config))
    script = render_launch_script(
        config, run_dir=run_dir, sglang_version=release, python=python, target=target, twin_env=twin_env
    )
    host.put_text(layout.script, script, mode=0o755)
    started = time.time()
    pid = host.start_detached(["bash", layout.script], cwd=run_dir, timeout_s=timeout_s)
    handle = ServerHandle(
        host,
        config,
        run_dir,
        pid,
        started,
        target,
        release.version,
        config.node_rank,
        {"twin_env": dict(twin_env or {}), "python": python},
    )
    host.put_text(f"{run_dir}/{HANDLE_FILE}", json.dumps(handle.to_dict(), indent=2))
    return handle


def launch_nodes(
    hosts: Sequence[Host],
    config: ServerConfig,
    run_dir: str,
    *,
    dist_port: int = 5000,
    node0_address: str | None = None,
    port_step: int = 0,
    **options: Any,
) -> list[ServerHandle]:
    """One process per node for ``nnodes > 1``: the same flags with node_rank 0..n-1 and node 0's address.

    Each node gets its own ``run_dir/nodeN``. ``port_step`` shifts node N's port by N x step, which only
    matters when several "nodes" share one machine (a rehearsal on the twin).
    """
    if len(hosts) != config.nnodes:
        raise LaunchError(f"config has nnodes={config.nnodes} but {len(hosts)} host(s) were given")
    addr = config.dist_init_addr or f"{node0_address or '127.0.0.1'}:{dist_port}"
    handles: list[ServerHandle] = []
    try:
        for rank, host in enumerate(hosts):
            node_config = config.replace(node_rank=rank, dist_init_addr=addr, port=config.port + rank * port_step)
            handles.append(launch(host, node_config, f"{run_dir}/node{rank}", **options))
    except Exception:
        for h in handles:
            h.stop(grace_s=2.0)
        raise
    return handles


def _read_handle(host: Host, run_dir: str) -> dict[str, Any] | None:
    text = host.read_text(f"{run_dir}/{HANDLE_FILE}")
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def attach(host: Host, run_dir: str) -> ServerHandle:
    """The handle of a server launched earlier into ``run_dir`` (running or not)."""
    run_dir = host.absolute_path(run_dir)
    data = _read_handle(host, run_dir)
    if data is None:
        raise LaunchError(f"no dsv4lab launch in {run_dir} on {host.name} ({HANDLE_FILE} missing or unreadable)")
    config = ServerConfig.from_dict(data["config"])
    target: Target = "twin" if data.get("target") == "twin" else "sglang"
    extra = {k: v for k, v in data.items() if k in ("twin_env", "python")}
    return ServerHandle(
        host,
        config,
        run_dir,
        int(data["launcher_pid"]),
        float(data["started_at"]),
        target,
        str(data.get("sglang_version", "0.5.23")),
        int(data.get("node_rank", 0)),
        extra,
    )
