"""Hosts dsv4lab runs servers on: this machine (:class:`LocalHost`) or one over SSH (:class:`SSHHost`)."""

from __future__ import annotations

from dsv4lab.errors import ConfigError, HostConnectionError, HostKeyError
from dsv4lab.hosts.base import (
    STATE_DIR,
    CommandResult,
    Follower,
    Host,
    KillReport,
    LineStream,
    LogLine,
    PortForward,
    StreamStart,
)
from dsv4lab.hosts.local import LocalHost
from dsv4lab.hosts.ssh import SSHHost, fingerprint, resolve_target

__all__ = [
    "STATE_DIR",
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
    "check_host",
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


def check_host(
    spec: str | None,
    *,
    where: str = "host",
    known_hosts: str = "~/.ssh/known_hosts",
    trust_unknown_host: bool = False,
    ssh_config: str | None = "~/.ssh/config",
    connect_timeout_s: float = 15.0,
) -> None:
    """Connect to ``spec`` once and close again, so that a run which would use it later fails *now*.

    A notebook run, a sweep or a campaign opens its host from inside a kernel, after a run dir exists and
    a kernel has started: a mistyped alias then costs a kernel start and a failed report. This is the same
    connection (alias resolved through the ssh config, host key checked, authentication), made first. The
    error says ``where`` the host came from (``parameter host of 01_config_a_baseline``) with the value as
    typed: :class:`HostConnectionError` (exit 3) or :class:`HostKeyError` (exit 4, with its fix). With
    ``trust_unknown_host`` an unknown key is recorded, so the run that follows finds it known.
    """
    if spec in (None, "", "local"):
        return
    named = f"{where}={spec!r}"
    try:
        host = open_host(
            spec,
            known_hosts=known_hosts,
            trust_unknown_host=trust_unknown_host,
            ssh_config=ssh_config,
            connect_timeout_s=connect_timeout_s,
        )
    except HostKeyError as exc:
        raise HostKeyError(
            exc.host, exc.key_type, exc.fingerprint, changed=exc.changed, known_hosts=exc.known_hosts, where=named
        ) from None
    except HostConnectionError as exc:
        raise HostConnectionError(f"{named}: {exc}") from None
    except ConfigError as exc:  # user@host:PORT with a port that is none
        raise ConfigError(where, spec, exc.allowed) from None
    host.close()
