"""A real OpenSSH server on 127.0.0.1 for tests: throwaway host and user keys, its own known_hosts.

Started once per test session on a free port. Nothing here ever talks to another address.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from dsv4lab.hosts import SSHHost


def sshd_binary() -> str | None:
    for candidate in ("/usr/sbin/sshd", shutil.which("sshd")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 now, for servers that step their port (a
    multi-node launch on one machine: node i on port + i).

    Taken below the kernel's ephemeral range, where only an explicit bind takes a port: ``free_port() + 1`` can
    be any connection's local port (CI run 28: node 1 of a two-node twin died of "address already in use").
    The search starts at a random port, so two test workers do not try the same ports in step."""
    low, top = 10_000, _ephemeral_start() - count
    start = random.randrange(low, top)
    for base in itertools.chain(range(start, top), range(low, start)):
        with contextlib.ExitStack() as held:
            try:
                for port in range(base, base + count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
            return base
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1 between {low} and {top}")


@dataclass
class SSHD:
    host: str
    port: int
    user: str
    key_path: str
    known_hosts: str
    host_key_line: str
    directory: Path
    proc: subprocess.Popen[bytes]

    @property
    def target(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def connect(self, **options: Any) -> SSHHost:
        """An SSHHost for this server with its own key and known_hosts (nothing from ~/.ssh)."""
        kwargs: dict[str, Any] = {
            "key_filename": self.key_path,
            "known_hosts": self.known_hosts,
            "ssh_config": None,
            "allow_agent": False,
            "look_for_keys": False,
            **options,
        }
        return SSHHost(self.target, **kwargs)

    def session_pids(self) -> list[int]:
        """PIDs of the per-connection sshd processes (killing them drops the connections)."""
        try:
            return [c.pid for c in psutil.Process(self.proc.pid).children(recursive=False)]
        except psutil.NoSuchProcess:
            return []

    def drop_connections(self) -> None:
        for pid in self.session_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30, capture_output=True
    )
    return path.with_suffix(".pub").read_text().strip()


def start_sshd(directory: Path, *, sftp: bool = True) -> Iterator[SSHD]:
    """Start sshd; ``sftp=False`` leaves out the sftp subsystem, as hardened GPU images often do."""
    binary = sshd_binary()
    assert binary is not None
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    host_pub = _keygen(directory / "host_key")
    user_pub = _keygen(directory / "user_key")
    (directory / "authorized_keys").write_text(user_pub + "\n")
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {directory / 'host_key'}",
                f"PidFile {directory / 'sshd.pid'}",
                f"AuthorizedKeysFile {directory / 'authorized_keys'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "AllowTcpForwarding yes",
                "Subsystem sftp internal-sftp" if sftp else "",
                "MaxSessions 64",
                "MaxStartups 64",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    log = (directory / "sshd.log").open("wb")
    proc = subprocess.Popen([binary, "-D", "-e", "-f", str(config)], stdout=log, stderr=log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(directory / 'sshd.log').read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening within 15 s")
    key_type, key_b64 = host_pub.split()[:2]
    host_key_line = f"[127.0.0.1]:{port} {key_type} {key_b64}"
    known_hosts = directory / "known_hosts"
    known_hosts.write_text(host_key_line + "\n")
    try:
        yield SSHD(
            "127.0.0.1",
            port,
            getpass.getuser(),
            str(directory / "user_key"),
            str(known_hosts),
            host_key_line,
            directory,
            proc,
        )
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
