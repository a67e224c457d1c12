"""The long-lived SSH channels of :class:`~dsv4lab.hosts.ssh.SSHHost`: a followed log, a streamed command, a
port forward.

Each opens its channel through ``SSHHost.open_channel``, which re-opens a connection found dead at that
moment (nothing has run on it yet, so that is safe); a connection that drops while a channel is open is a
:class:`~dsv4lab.errors.HostConnectionError` for the reader, who reconnects and resumes (the follower at
its byte offset, the sampler with a new stream). A forward survives drops: each new TCP connection through
it gets a channel on whatever connection is current.
"""

from __future__ import annotations

import contextlib
import select
import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Protocol

import paramiko

from dsv4lab.errors import HostConnectionError
from dsv4lab.hosts.base import Follower, LineStream, LogLine, stream_argv

__all__ = ["ChannelSource", "SSHFollower", "SSHForwarder", "SSHStream"]


class ChannelSource(Protocol):
    """What a long-lived channel needs of its host (an :class:`~dsv4lab.hosts.ssh.SSHHost`): its name for
    messages, whether it is connected, and a fresh channel that survives a reconnect."""

    name: str

    @property
    def connected(self) -> bool: ...

    def open_channel(
        self,
        what: str,
        *,
        kind: str = "session",
        dest: tuple[str, int] | None = None,
        src: tuple[str, int] | None = None,
    ) -> paramiko.Channel: ...


_CONNECTION_ERRORS = (paramiko.SSHException, OSError, EOFError)


class SSHFollower(Follower):
    """``tail -F`` on one channel: new bytes arrive as the server writes them, no polling round trips."""

    def __init__(self, host: ChannelSource, path: str, offset: int) -> None:
        super().__init__(offset)
        self._host = host
        quoted = shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)
        if path.startswith("~/"):
            quoted = '"$HOME"/' + quoted
        command = f"exec tail -c +{offset + 1} -F -- {quoted} 2>/dev/null"
        self._chan = host.open_channel(f"follow {path}")
        try:
            self._chan.exec_command("bash -c " + shlex.quote(command))
        except _CONNECTION_ERRORS as exc:
            self._chan.close()
            raise HostConnectionError(f"cannot follow {path} on {host.name}: {exc}") from exc

    def poll(self, timeout_s: float) -> list[LogLine]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            try:
                select.select([self._chan], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
                data = bytearray()
                while self._chan.recv_ready():
                    data += self._chan.recv(1 << 16)
            except _CONNECTION_ERRORS as exc:
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


class SSHStream(LineStream):
    """One exec channel for the command's whole life; EOF on its stdin is the wrapper's signal to stop it."""

    def __init__(self, host: ChannelSource, argv: Sequence[str], env: Mapping[str, str] | None) -> None:
        super().__init__()
        self._host = host
        wire = shlex.join(stream_argv(argv, env))
        self._chan = host.open_channel(f"start `{shlex.join(argv)}`")
        try:
            self._chan.exec_command(wire)
        except _CONNECTION_ERRORS as exc:
            self._chan.close()
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
            except _CONNECTION_ERRORS as exc:
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


class SSHForwarder:
    """A local listening socket whose connections are tunnelled to the host's loopback port (or to ``address``
    as the host sees it: a cluster node's port, through its login host).

    The listening socket outlives dropped connections: every accepted connection asks the host for a
    channel, and the host re-opens a dead connection first, so a client that retries gets through.
    """

    def __init__(self, host: ChannelSource, remote_port: int, *, address: str = "127.0.0.1") -> None:
        self._host = host
        self._remote_port = remote_port
        self._address = address
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
            chan = self._host.open_channel(
                f"forward port {self._remote_port}",
                kind="direct-tcpip",
                dest=(self._address, self._remote_port),
                src=addr,
            )
        except HostConnectionError:
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
        except _CONNECTION_ERRORS:
            pass
        finally:
            # The local end first, and whatever happens to the channel: closing a channel of a connection
            # that just died raises, and a client left with an open socket waits out its whole request timeout.
            with contextlib.suppress(OSError):
                conn.close()
            with contextlib.suppress(*_CONNECTION_ERRORS):
                chan.close()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        self._thread.join(timeout=2.0)
