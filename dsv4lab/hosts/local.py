"""This machine as a host: subprocesses and plain files, for the twin and for tests."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from dsv4lab.errors import HostError
from dsv4lab.hosts.base import CommandResult, Follower, Host, LineStream, LogLine, PortForward, stream_argv

__all__ = ["LocalHost"]

#: How often a local follower looks for new bytes.
_POLL_S = 0.02


@functools.cache
def _has_proc() -> bool:
    """Whether ``/proc`` answers for PIDs here (Linux); asked once, not at every look."""
    return Path("/proc/self/stat").is_file()


class LocalHost(Host):
    """Runs commands with ``subprocess`` and reads files directly."""

    def __init__(self, name: str = "localhost") -> None:
        self.name = name

    def run(self, command: Sequence[str] | str, *, timeout_s: float, input_text: str | None = None) -> CommandResult:
        argv = ["bash", "-c", command] if isinstance(command, str) else list(command)
        shown = command if isinstance(command, str) else shlex.join(argv)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                input=input_text,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
                stdin=None if input_text is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return CommandResult(self.name, shown, None, out, err, time.monotonic() - start, timed_out=True)
        return CommandResult(self.name, shown, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)

    def is_alive(self, pid: int, *, timeout_s: float = 15.0) -> bool:
        """True while ``pid`` runs (a zombie counts as dead), read from ``/proc`` where there is one.

        A watcher asks this every half second, and at every look once a fatal line came (twice: the launcher
        and the server): the shell and ``ps`` the other hosts run cost 5 ms each on a quiet machine and
        hundreds under a loaded one, which went straight into the crash's reported detection time."""
        if not _has_proc():
            return super().is_alive(pid, timeout_s=timeout_s)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return False
        except OSError:
            return super().is_alive(pid, timeout_s=timeout_s)
        fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
        return bool(fields) and fields[0] not in ("Z", "X", "x")

    def _path(self, path: str) -> Path:
        return Path(os.path.expanduser(path))

    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write whole or not at all: a temp file renamed into place (a full disk leaves no half file)."""
        p = self._path(path)
        tmp = p.with_name(p.name + ".tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            tmp.chmod(mode)
            tmp.replace(p)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise HostError(f"cannot write {p} on {self.name}: {exc.strerror or exc}") from exc

    def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str | None:
        p = self._path(path)
        try:
            with p.open("rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return None

    def put(self, local_path: str, remote_path: str) -> None:
        shutil.copyfile(local_path, self._path(remote_path))

    def get(self, remote_path: str, local_path: str) -> None:
        shutil.copyfile(self._path(remote_path), local_path)

    def follow(self, path: str, from_offset: int = 0) -> Follower:
        return _LocalFollower(self._path(path), from_offset)

    def forward(self, remote_port: int, *, address: str = "127.0.0.1") -> PortForward:
        """The host is this machine: the port is reachable as it is."""
        local = "127.0.0.1" if address in ("localhost", "127.0.0.1") else address
        return PortForward(local_port=remote_port, remote_port=remote_port, local_address=local)

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LineStream:
        return _LocalStream(argv, env)

    def home_path(self, path: str) -> str:
        return os.path.expanduser(path)

    def absolute_path(self, path: str) -> str:
        """Relative paths are relative to this process's working directory, as users expect locally."""
        return os.path.abspath(os.path.expanduser(path))


class _LocalFollower(Follower):
    def __init__(self, path: Path, offset: int) -> None:
        super().__init__(offset)
        self._path = path
        self._file: BinaryIO | None = None

    def _open(self) -> bool:
        if self._file is None:
            try:
                f = self._path.open("rb")
            except FileNotFoundError:
                return False
            f.seek(self.offset)
            self._file = f
        return True

    def poll(self, timeout_s: float) -> list[LogLine]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if self._open():
                assert self._file is not None
                data = self._file.read()
                if data:
                    lines = self._split(data)
                    if lines:
                        return lines
            if time.monotonic() >= deadline:
                return []
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None


class _LocalStream(LineStream):
    """A subprocess in its own session; stdin is the wrapper's "stop" line, the group a last resort."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None) -> None:
        super().__init__()
        merged = {**os.environ, **(env or {})}
        self._proc = subprocess.Popen(
            stream_argv(argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=merged,
            start_new_session=True,
        )
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._out = self._proc.stdout.fileno()
        self._err = self._proc.stderr.fileno()
        os.set_blocking(self._out, False)
        os.set_blocking(self._err, False)
        self._eof = False

    def _drain_stderr(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while True:
                data = os.read(self._err, 1 << 16)
                if not data:
                    return
                self._add_stderr(data)

    def poll(self, timeout_s: float) -> list[str]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if not self._eof:
                select.select([self._out, self._err], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
            self._drain_stderr()
            data = b""
            with contextlib.suppress(BlockingIOError):
                chunk = os.read(self._out, 1 << 16)
                if chunk:
                    data = chunk
                else:
                    self._eof = True
            if data:
                lines = self._split(data)
                if lines:
                    return lines
            if self._eof or time.monotonic() >= deadline:
                if self._eof and self._proc.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                return []

    @property
    def exit_status(self) -> int | None:
        return self._proc.poll()

    def close(self, timeout_s: float = 1.0) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1.0)
        self._drain_stderr()
        for f in (self._proc.stdout, self._proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
