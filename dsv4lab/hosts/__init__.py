"""Hosts dsv4lab runs servers on: this machine (:class:`LocalHost`) or one over SSH (:class:`SSHHost`)."""

from __future__ import annotations

from dsv4lab.hosts.base import CommandResult, Follower, Host, KillReport, LineStream, LogLine, PortForward, StreamStart
from dsv4lab.hosts.local import LocalHost
from dsv4lab.hosts.ssh import SSHHost, fingerprint, resolve_target

__all__ = [
    "CommandResult",
    "Follower",
    "Host",
    "KillReport",
    "LineStream",
    "LocalHost",
    "LogLine",
    "PortForward",
    "SSHHost",
    "StreamStart",
    "fingerprint",
    "open_host",
    "resolve_target",
]


def open_host(spec: str | None, **ssh_options: object) -> Host:
    """``None``, ``""`` or ``"local"`` -> this machine; anything else is an SSH alias or ``user@host:port``."""
    if spec in (None, "", "local", "localhost-local"):
        return LocalHost()
    return SSHHost(str(spec), **ssh_options)  # type: ignore[arg-type]
