"""A host over SSH (paramiko), with host keys checked the way OpenSSH checks them.

An unknown host key stops the connection with its fingerprint unless the caller opts in to trusting it,
in which case it is recorded in the known_hosts file; a changed key is always refused. There is no
"accept anything" mode: that shortcut is how a campaign ends up sending its commands to the wrong machine.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import paramiko

from dsv4lab.errors import HostConnectionError, HostKeyError
from dsv4lab.hosts.base import CommandResult, Follower, Host, LineStream, LogLine, PortForward, stream_argv

__all__ = ["SSHHost", "SSHTarget", "fingerprint", "resolve_target"]

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
#: Bound on one file operation over exec (no SFTP); files dsv4lab moves are small.
_FILE_TIMEOUT_S = 120.0
#: Exit status of the exec file scripts for "no such file".
_ENOENT_STATUS = 44
# Write stdin to a temp file and rename it into place (a reader never sees half a file). $1 path, $2 mode.
_WRITE_FILE = 'umask 077; cat > "$1.tmp" && chmod "$2" "$1.tmp" && mv -f -- "$1.tmp" "$1"'
# The last $2 bytes of $1 (0 = all), or status 44 when it does not exist.
_READ_FILE = '[ -e "$1" ] || exit 44; if [ "$2" -gt 0 ]; then tail -c "$2" -- "$1"; else cat -- "$1"; fi'

DEFAULT_SSH_CONFIG = "~/.ssh/config"


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class SSHTarget:
    """Where and as whom to connect, after ``~/.ssh/config`` has been applied to an alias."""

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: str | None

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_target(
    host: str, *, user: str | None = None, port: int | None = None, ssh_config: str | None = DEFAULT_SSH_CONFIG
) -> SSHTarget:
    """Apply ``~/.ssh/config`` (HostName, User, Port, IdentityFile, ProxyJump) to ``[user@]host[:port]``."""
    alias = host
    if "@" in alias:
        user_part, alias = alias.rsplit("@", 1)
        user = user or user_part
    if alias.count(":") == 1:
        alias, port_text = alias.split(":")
        port = port or int(port_text)
    options: dict[str, Any] = {}
    if ssh_config:
        path = os.path.expanduser(ssh_config)
        if os.path.exists(path):
            options = dict(paramiko.SSHConfig.from_path(path).lookup(alias))
    identity = options.get("identityfile") or []
    return SSHTarget(
        alias=alias,
        hostname=str(options.get("hostname", alias)),
        port=int(port or options.get("port", 22)),
        user=str(user or options.get("user") or os.environ.get("USER") or "root"),
        identity_files=tuple(os.path.expanduser(p) for p in identity if os.path.exists(os.path.expanduser(p))),
        proxy_jump=options.get("proxyjump"),
    )


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse unknown keys (with the fingerprint), or record them when the caller opted in."""

    def __init__(self, known_hosts: str, trust: bool) -> None:
        self.known_hosts = known_hosts
        self.trust = trust

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if not self.trust:
            raise HostKeyError(hostname, key.get_name(), fingerprint(key), changed=False, known_hosts=self.known_hosts)
        path = os.path.expanduser(self.known_hosts)
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class SSHHost(Host):
    """A host reached over SSH. ``host`` may be an alias from ``~/.ssh/config`` or ``user@host:port``."""

    def __init__(
        self,
        host: str,
        *,
        user: str | None = None,
        port: int | None = None,
        key_filename: str | Sequence[str] | None = None,
        known_hosts: str = DEFAULT_KNOWN_HOSTS,
        trust_unknown_host: bool = False,
        ssh_config: str | None = DEFAULT_SSH_CONFIG,
        connect_timeout_s: float = 15.0,
        keepalive_s: int = 15,
        allow_agent: bool = True,
        look_for_keys: bool = True,
    ) -> None:
        self.target = resolve_target(host, user=user, port=port, ssh_config=ssh_config)
        self.name = host
        self.known_hosts = known_hosts
        self.trust_unknown_host = trust_unknown_host
        self.ssh_config = ssh_config
        keys = [key_filename] if isinstance(key_filename, str) else list(key_filename or [])
        self.key_filenames = [os.path.expanduser(k) for k in keys] + list(self.target.identity_files)
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.allow_agent = allow_agent
        self.look_for_keys = look_for_keys
        self._client: paramiko.SSHClient | None = None
        self._jump: SSHHost | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._no_sftp = False
        self._lock = threading.Lock()
        self.connect()

    # -- connection ----------------------------------------------------------------------------------------

    def connect(self) -> None:
        """(Re)connect; raises HostKeyError for key problems and HostConnectionError for the rest."""
        self.close()
        t = self.target
        sock: Any = None
        if t.proxy_jump:
            self._jump = SSHHost(
                t.proxy_jump,
                known_hosts=self.known_hosts,
                trust_unknown_host=self.trust_unknown_host,
                ssh_config=self.ssh_config,
                connect_timeout_s=self.connect_timeout_s,
                allow_agent=self.allow_agent,
                look_for_keys=self.look_for_keys,
            )
            try:
                sock = self._jump.transport.open_channel(
                    "direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=self.connect_timeout_s
                )
            except (paramiko.SSHException, OSError) as exc:
                raise HostConnectionError(f"cannot reach {t.hostname}:{t.port} through {t.proxy_jump}: {exc}") from exc
        client = paramiko.SSHClient()
        kh = os.path.expanduser(self.known_hosts)
        if os.path.exists(kh):
            try:
                client.load_host_keys(kh)
            except (OSError, paramiko.SSHException) as exc:
                raise HostConnectionError(f"cannot read known_hosts file {kh}: {exc}") from exc
        client.set_missing_host_key_policy(_HostKeyPolicy(self.known_hosts, self.trust_unknown_host))
        try:
            client.connect(
                t.hostname,
                port=t.port,
                username=t.user,
                key_filename=self.key_filenames or None,  # type: ignore[arg-type]  # paramiko takes a list too
                allow_agent=self.allow_agent,
                look_for_keys=self.look_for_keys,
                timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s,
                auth_timeout=self.connect_timeout_s,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                t.known_hosts_name, exc.key.get_name(), fingerprint(exc.key), changed=True, known_hosts=self.known_hosts
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise HostConnectionError(
                f"SSH authentication to {t.user}@{t.hostname}:{t.port} failed ({exc}); "
                "check the key files, ssh-agent, or IdentityFile in ~/.ssh/config"
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise HostConnectionError(f"cannot connect to {t.user}@{t.hostname}:{t.port}: {exc}") from exc
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.keepalive_s)
        self._client = client

    @property
    def transport(self) -> paramiko.Transport:
        """The live transport; a connection that was closed or dropped is re-opened once, on demand."""
        if not self.connected:
            self.connect()
        client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            raise HostConnectionError(f"the SSH connection to {self.name} is closed")
        return transport

    @property
    def connected(self) -> bool:
        client = self._client
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        self._sftp = None
        if self._client is not None:
            self._client.close()
        self._client = None
        if self._jump is not None:
            self._jump.close()
        self._jump = None

    # -- commands ------------------------------------------------------------------------------------------

    def run(self, command: Sequence[str] | str, *, timeout_s: float, input_text: str | None = None) -> CommandResult:
        wire = "bash -c " + shlex.quote(command) if isinstance(command, str) else shlex.join(list(command))
        shown = command if isinstance(command, str) else shlex.join(list(command))
        data = input_text.encode() if input_text is not None else None
        status, out, err, elapsed, timed_out = self._exec(wire, shown, data, timeout_s)
        return CommandResult(
            self.name,
            shown,
            status,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            elapsed,
            timed_out=timed_out,
        )

    def _exec(
        self, wire: str, shown: str, stdin: bytes | None, timeout_s: float
    ) -> tuple[int | None, bytes, bytes, float, bool]:
        """Run ``wire`` on one channel: (exit status, stdout, stderr, seconds, timed out).

        An interrupt (the user's Stop) closes the channel and propagates; commands that must be killed on
        a stop run detached with a PID file instead (see ``start_detached``).
        """
        start = time.monotonic()
        deadline = start + timeout_s
        out, err = bytearray(), bytearray()
        try:
            chan = self.transport.open_session(timeout=min(timeout_s, self.connect_timeout_s))
            try:
                chan.exec_command(wire)
                if stdin is not None:
                    chan.sendall(stdin)
                chan.shutdown_write()
                while True:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None, bytes(out), bytes(err), time.monotonic() - start, True
                    select.select([chan], [], [], min(remaining, 0.5))
                    while chan.recv_ready():
                        out += chan.recv(65536)
                    while chan.recv_stderr_ready():
                        err += chan.recv_stderr(65536)
                    if chan.exit_status_ready() and chan.eof_received:
                        while chan.recv_ready():
                            out += chan.recv(65536)
                        while chan.recv_stderr_ready():
                            err += chan.recv_stderr(65536)
                        break
                    if chan.closed and not chan.exit_status_ready():
                        raise HostConnectionError(f"the SSH connection to {self.name} dropped during `{shown}`")
                status = chan.recv_exit_status()
            finally:
                chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostConnectionError(f"the SSH connection to {self.name} failed during `{shown}`: {exc}") from exc
        return status, bytes(out), bytes(err), time.monotonic() - start, False

    # -- files ---------------------------------------------------------------------------------------------

    def _sftp_client(self) -> paramiko.SFTPClient | None:
        """The SFTP session, or None when the server has no sftp subsystem (then files go over exec).

        Many GPU hosts (containers, hardened images) run sshd without ``Subsystem sftp``; everything
        dsv4lab moves is small, so ``cat`` over an exec channel serves as well.
        """
        with self._lock:
            if self._no_sftp:
                return None
            if self._sftp is None:
                try:
                    self._sftp = paramiko.SFTPClient.from_transport(self.transport)
                except HostConnectionError:
                    raise
                except (paramiko.SSHException, OSError, EOFError):
                    if not self.connected:
                        raise HostConnectionError(f"the SSH connection to {self.name} dropped") from None
                    self._no_sftp = True
                    return None
                if self._sftp is None:
                    self._no_sftp = True
            return self._sftp

    @staticmethod
    def _sftp_path(path: str) -> str:
        """SFTP paths are relative to the login directory: ``~/x`` becomes ``x``."""
        if path == "~":
            return "."
        return path[2:] if path.startswith("~/") else path

    def _exec_file(self, script: str, path: str, *args: str, stdin: bytes | None = None) -> tuple[int | None, bytes]:
        """A file operation over exec (no SFTP): the path goes as an argument, never into the script text."""
        wire = shlex.join(["bash", "-c", script, "dsv4lab-file", self._sftp_path(path), *args])
        status, out, err, _, timed_out = self._exec(wire, f"file operation on {path}", stdin, _FILE_TIMEOUT_S)
        if timed_out:
            raise HostConnectionError(
                f"a file operation on {path} on {self.name} timed out after {_FILE_TIMEOUT_S:g} s"
            )
        if status not in (0, _ENOENT_STATUS):
            raise HostConnectionError(f"cannot access {path} on {self.name}: {err.decode(errors='replace').strip()}")
        return status, out

    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        self._put_bytes(path, text.encode(), mode)

    def _put_bytes(self, path: str, data: bytes, mode: int) -> None:
        sftp = self._sftp_client()
        target = self._sftp_path(path)
        tmp = target + ".tmp"
        if sftp is None:
            self._exec_file(_WRITE_FILE, path, format(mode, "o"), stdin=data)
            return
        try:
            with sftp.open(tmp, "w") as f:
                f.write(data)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, target)
        except OSError as exc:
            raise HostConnectionError(f"cannot write {path} on {self.name}: {exc}") from exc

    def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str | None:
        data = self._read_bytes(path, max_bytes)
        return None if data is None else data.decode("utf-8", "replace")

    def _read_bytes(self, path: str, max_bytes: int | None) -> bytes | None:
        sftp = self._sftp_client()
        if sftp is None:
            status, out = self._exec_file(_READ_FILE, path, str(max_bytes or 0))
            return None if status == _ENOENT_STATUS else out
        try:
            with sftp.open(self._sftp_path(path), "r") as f:
                size = f.stat().st_size or 0
                if max_bytes is not None:
                    f.seek(max(0, size - max_bytes))
                data: bytes = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return None
            raise HostConnectionError(f"cannot read {path} on {self.name}: {exc}") from exc
        return data

    def put(self, local_path: str, remote_path: str) -> None:
        sftp = self._sftp_client()
        if sftp is None:
            with open(local_path, "rb") as f:
                self._put_bytes(remote_path, f.read(), 0o644)
            return
        try:
            sftp.put(local_path, self._sftp_path(remote_path))
        except OSError as exc:
            raise HostConnectionError(f"cannot copy {local_path} to {self.name}:{remote_path}: {exc}") from exc

    def get(self, remote_path: str, local_path: str) -> None:
        sftp = self._sftp_client()
        if sftp is None:
            data = self._read_bytes(remote_path, None)
            if data is None:
                raise HostConnectionError(f"cannot copy {self.name}:{remote_path}: no such file")
            with open(local_path, "wb") as f:
                f.write(data)
            return
        try:
            sftp.get(self._sftp_path(remote_path), local_path)
        except OSError as exc:
            raise HostConnectionError(f"cannot copy {self.name}:{remote_path} to {local_path}: {exc}") from exc

    def follow(self, path: str, from_offset: int = 0) -> Follower:
        return _SSHFollower(self, path, from_offset)

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LineStream:
        return _SSHStream(self, argv, env)

    def forward(self, remote_port: int) -> PortForward:
        fwd = _Forwarder(self, remote_port)
        return PortForward(local_port=fwd.local_port, remote_port=remote_port, _closer=fwd)


class _SSHFollower(Follower):
    """``tail -F`` on one channel: new bytes arrive as the server writes them, no polling round trips."""

    def __init__(self, host: SSHHost, path: str, offset: int) -> None:
        super().__init__(offset)
        self._host = host
        quoted = shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
        if path.startswith("~/"):
            quoted = '"$HOME"/' + quoted
        command = f"exec tail -c +{offset + 1} -F -- {quoted} 2>/dev/null"
        try:
            self._chan = host.transport.open_session(timeout=host.connect_timeout_s)
            self._chan.exec_command("bash -c " + shlex.quote(command))
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostConnectionError(f"cannot follow {path} on {host.name}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[LogLine]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            try:
                select.select([self._chan], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
                data = bytearray()
                while self._chan.recv_ready():
                    data += self._chan.recv(1 << 16)
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise HostConnectionError(f"lost the log stream from {self._host.name}: {exc}") from exc
            if data:
                lines = self._split(bytes(data))
                if lines:
                    return lines
            elif self._chan.closed or self._chan.eof_received or not self._host.connected:
                raise HostConnectionError(f"lost the log stream from {self._host.name}")
            if time.monotonic() >= deadline:
                return []

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._chan.close()


class _SSHStream(LineStream):
    """One exec channel for the command's whole life; EOF on its stdin is the wrapper's signal to stop it."""

    def __init__(self, host: SSHHost, argv: Sequence[str], env: Mapping[str, str] | None) -> None:
        super().__init__()
        self._host = host
        wire = shlex.join(stream_argv(argv, env))
        try:
            self._chan = host.transport.open_session(timeout=host.connect_timeout_s)
            self._chan.exec_command(wire)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise HostConnectionError(f"cannot start `{shlex.join(argv)}` on {host.name}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        chan = self._chan
        while True:
            try:
                select.select([chan], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
                data = bytearray()
                while chan.recv_ready():
                    data += chan.recv(1 << 16)
                while chan.recv_stderr_ready():
                    self._add_stderr(chan.recv_stderr(1 << 16))
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise HostConnectionError(f"lost the command stream from {self._host.name}: {exc}") from exc
            if data:
                lines = self._split(bytes(data))
                if lines:
                    return lines
            elif (chan.exit_status_ready() and chan.exit_status != -1) or (
                chan.eof_received and not chan.closed and self._host.connected
            ):
                # The command ended (exit_status says how), or its output ended and the status is on its way.
                if time.monotonic() >= deadline:
                    return []
                time.sleep(0.01)
                continue
            elif chan.closed or not self._host.connected:
                # paramiko marks a channel closed by a dropped transport "exit status ready" with -1.
                raise HostConnectionError(f"lost the command stream from {self._host.name}")
            if time.monotonic() >= deadline:
                return []

    @property
    def exit_status(self) -> int | None:
        status = self._chan.exit_status if self._chan.exit_status_ready() else -1
        return None if status == -1 else status

    def close(self, timeout_s: float = 1.0) -> None:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with contextlib.suppress(Exception):
            self._chan.shutdown_write()
            while not self._chan.exit_status_ready() and not self._chan.closed and time.monotonic() < deadline:
                time.sleep(0.01)
            while self._chan.recv_stderr_ready():
                self._add_stderr(self._chan.recv_stderr(1 << 16))
        with contextlib.suppress(Exception):
            self._chan.close()


class _Forwarder:
    """A local listening socket whose connections are tunnelled to the host's loopback port."""

    def __init__(self, host: SSHHost, remote_port: int) -> None:
        self._host = host
        self._remote_port = remote_port
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.5)
        self.local_port: int = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name=f"ssh-forward-{remote_port}", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, addr = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._pump, args=(conn, addr), daemon=True).start()

    def _pump(self, conn: socket.socket, addr: tuple[str, int]) -> None:
        try:
            chan = self._host.transport.open_channel(
                "direct-tcpip", ("127.0.0.1", self._remote_port), addr, timeout=self._host.connect_timeout_s
            )
        except (paramiko.SSHException, OSError, EOFError, HostConnectionError):
            conn.close()
            return
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select([conn, chan], [], [], 0.5)  # type: ignore[type-var]
                if conn in readable:
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    chan.sendall(data)
                if chan in readable:
                    data = chan.recv(1 << 16)
                    if not data:
                        break
                    conn.sendall(data)
        except (OSError, paramiko.SSHException, EOFError):
            pass
        finally:
            chan.close()
            conn.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(timeout=2.0)
