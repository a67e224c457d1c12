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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import paramiko

from dsv4lab.errors import ConfigError, HostConnectionError, HostKeyError
from dsv4lab.hosts.base import CommandResult, Follower, Host, LineStream, PortForward
from dsv4lab.hosts.ssh_channels import SSHFollower, SSHForwarder, SSHStream

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

_CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError)
T = TypeVar("T")


class _Dropped(HostConnectionError):
    """The connection died while a command or file operation was under way (its outcome is unknown)."""


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
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise ConfigError("host", host, "an SSH alias from ~/.ssh/config, user@host or user@host:PORT (1-65535)")
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
        # One thread (re)connects at a time: a watcher, a GPU sampler and a port forward share the host.
        self._conn_lock = threading.RLock()
        #: How many times a closed or dropped connection was re-opened (not counting the first connect).
        self.reconnects = 0
        self._connected_once = False
        self.connect()

    # -- connection ----------------------------------------------------------------------------------------

    def connect(self) -> None:
        """(Re)connect; raises HostKeyError for key problems and HostConnectionError for the rest."""
        with self._conn_lock:
            self._connect()

    def _connect(self) -> None:
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
        except socket.gaierror as exc:  # before any packet: say which name did not resolve, and from where
            client.close()
            raise HostConnectionError(
                f"cannot connect to {t.user}@{t.hostname}:{t.port}: {self._unresolved(exc)}"
            ) from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise HostConnectionError(f"cannot connect to {t.user}@{t.hostname}:{t.port}: {exc}") from exc
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(self.keepalive_s)
        self._client = client
        if self._connected_once:
            self.reconnects += 1
        self._connected_once = True

    def _unresolved(self, exc: socket.gaierror) -> str:
        """Why the name did not resolve, in the terms of what the user typed (an alias, or its HostName)."""
        t, why = self.target, exc.strerror or str(exc)
        if t.hostname != t.alias:
            return f"the HostName {t.hostname!r} that {self.ssh_config} gives {t.alias!r} does not resolve ({why})"
        where = f"a Host in {self.ssh_config} nor " if self.ssh_config else ""
        return f"{t.alias!r} is neither {where}a host name that resolves ({why})"

    @property
    def transport(self) -> paramiko.Transport:
        """The live transport; a connection that was closed or dropped is re-opened once, on demand."""
        with self._conn_lock:
            if not self.connected:
                self._connect()
            client = self._client
            transport = client.get_transport() if client is not None else None
            if transport is None or not transport.is_active():
                raise HostConnectionError(f"the SSH connection to {self.name} is closed")
            return transport

    def _reconnect_after(self, failed: paramiko.Transport) -> None:
        """Re-open the connection if ``failed`` is still the current one (another thread may have already)."""
        with self._conn_lock:
            client = self._client
            current = client.get_transport() if client is not None else None
            if current is None or current is failed or not current.is_active():
                self._connect()

    def open_channel(
        self,
        what: str,
        *,
        kind: str = "session",
        dest: tuple[str, int] | None = None,
        src: tuple[str, int] | None = None,
    ) -> paramiko.Channel:
        """A new channel (a session, or ``direct-tcpip`` to ``dest``) for ``what``.

        A connection that turns out to be dead here (dropped, a laptop that slept) is re-opened and the
        open tried once more: nothing has run on the channel yet, so the retry cannot do anything twice.
        """
        for attempt in (1, 2):
            transport = self.transport
            try:
                if kind == "session":
                    return transport.open_session(timeout=self.connect_timeout_s)
                return transport.open_channel(kind, dest, src, timeout=self.connect_timeout_s)
            except _CONNECTION_ERRORS as exc:
                if attempt == 2:
                    raise HostConnectionError(
                        f"cannot {what} on {self.name}: the SSH connection failed ({exc})"
                    ) from exc
                self._reconnect_after(transport)
        raise AssertionError("unreachable")  # pragma: no cover

    def _again(self, what: str, op: Callable[[], T]) -> T:
        """Run an idempotent operation (reading or replacing a whole file); once more if the connection dropped
        under it."""
        try:
            return op()
        except _Dropped:
            with contextlib.suppress(HostConnectionError):
                self.connect()
            try:
                return op()
            except _Dropped as exc:
                raise HostConnectionError(f"the SSH connection to {self.name} dropped twice during {what}") from exc

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
        chan = self.open_channel(f"run `{shown}`")
        try:
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
                    # A dropped transport closes its channels and marks them "exit status ready" with -1
                    # (as does a command killed by a signal, but then the connection is still up).
                    link = chan.get_transport()
                    up = link is not None and link.is_active()
                    if chan.exit_status_ready() and chan.eof_received and (chan.exit_status != -1 or up):
                        while chan.recv_ready():
                            out += chan.recv(65536)
                        while chan.recv_stderr_ready():
                            err += chan.recv_stderr(65536)
                        break
                    if chan.closed or not up:
                        raise _Dropped(f"the SSH connection to {self.name} dropped during `{shown}`")
                status = chan.recv_exit_status()
            finally:
                with contextlib.suppress(*_CONNECTION_ERRORS):  # a finished command's status stands
                    chan.close()
        except _CONNECTION_ERRORS as exc:
            raise _Dropped(f"the SSH connection to {self.name} failed during `{shown}`: {exc}") from exc
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
            sftp = self._sftp
            if sftp is not None:
                chan = sftp.get_channel()
                if chan is None or chan.closed or not self.connected:  # left over from a dropped connection
                    with contextlib.suppress(Exception):
                        sftp.close()
                    self._sftp = None
            if self._sftp is None:
                chan = self.open_channel("open SFTP")  # proves the connection alive before asking for sftp
                try:
                    chan.invoke_subsystem("sftp")
                    self._sftp = paramiko.SFTPClient(chan)
                except _CONNECTION_ERRORS:
                    chan.close()
                    if not self.connected:
                        raise _Dropped(f"the SSH connection to {self.name} dropped") from None
                    self._no_sftp = True
                    return None
            return self._sftp

    def _sftp_error(self, what: str, exc: BaseException) -> HostConnectionError:
        """An SFTP failure as an error: :class:`_Dropped` when the connection went away under it (the caller
        retries), else the host's answer about the file."""
        sftp = self._sftp
        chan = sftp.get_channel() if sftp is not None else None
        if not isinstance(exc, OSError) or chan is None or chan.closed or not self.connected:
            return _Dropped(f"the SSH connection to {self.name} dropped during {what}: {exc}")
        return HostConnectionError(f"cannot {what} on {self.name}: {exc}")

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
        data = text.encode()
        self._again(f"writing {path}", lambda: self._put_bytes(path, data, mode))

    def _put_bytes(self, path: str, data: bytes, mode: int) -> None:
        """Write to ``path.tmp`` and rename into place: a reader never sees half a file, and a retry after a
        dropped connection writes the whole file again."""
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
        except _CONNECTION_ERRORS as exc:
            raise self._sftp_error(f"write {path}", exc) from exc

    def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str | None:
        data = self._again(f"reading {path}", lambda: self._read_bytes(path, max_bytes))
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
        except _CONNECTION_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENOENT:
                return None
            raise self._sftp_error(f"read {path}", exc) from exc
        return data

    def put(self, local_path: str, remote_path: str) -> None:
        self._again(f"copying {local_path} to {remote_path}", lambda: self._put_once(local_path, remote_path))

    def _put_once(self, local_path: str, remote_path: str) -> None:
        sftp = self._sftp_client()
        if sftp is None:
            with open(local_path, "rb") as f:
                self._put_bytes(remote_path, f.read(), 0o644)
            return
        try:
            sftp.put(local_path, self._sftp_path(remote_path))
        except _CONNECTION_ERRORS as exc:
            raise self._sftp_error(f"copy {local_path} to {remote_path}", exc) from exc

    def get(self, remote_path: str, local_path: str) -> None:
        self._again(f"copying {remote_path}", lambda: self._get_once(remote_path, local_path))

    def _get_once(self, remote_path: str, local_path: str) -> None:
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
        except _CONNECTION_ERRORS as exc:
            raise self._sftp_error(f"copy {remote_path} to {local_path}", exc) from exc

    def follow(self, path: str, from_offset: int = 0) -> Follower:
        return SSHFollower(self, path, from_offset)

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LineStream:
        return SSHStream(self, argv, env)

    def forward(self, remote_port: int, *, address: str = "127.0.0.1") -> PortForward:
        fwd = SSHForwarder(self, remote_port, address=address)
        return PortForward(local_port=fwd.local_port, remote_port=remote_port, _closer=fwd)
