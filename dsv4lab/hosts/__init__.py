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


def open_host(
    spec: str | Host | None,
    *,
    known_hosts: str = "~/.ssh/known_hosts",
    trust_unknown_host: bool = False,
    ssh_config: str | None = "~/.ssh/config",
    connect_timeout_s: float = 15.0,
) -> Host:
    """``None``, ``""`` or ``"local"`` -> this machine; a :class:`Host` as it is; anything else is an SSH
    alias from ``~/.ssh/config`` or ``user@host:port`` (host keys checked; see :class:`SSHHost`)."""
    if isinstance(spec, Host):
        return spec
    if spec in (None, "", "local"):
        return LocalHost()
    return SSHHost(
        str(spec),
        known_hosts=known_hosts,
        trust_unknown_host=trust_unknown_host,
        ssh_config=ssh_config,
        connect_timeout_s=connect_timeout_s,
    )
