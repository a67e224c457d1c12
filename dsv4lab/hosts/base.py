"""The one small interface every host offers, and the shell snippets both implementations share.

Process handling (detached start, liveness, killing a tree) is written once, as bash run through
``Host.run``, so the local host used in tests executes exactly what a GPU host executes over SSH. Only
transport differs between :class:`~dsv4lab.hosts.local.LocalHost` and :class:`~dsv4lab.hosts.ssh.SSHHost`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dsv4lab.errors import CommandError

__all__ = [
    "STATE_DIR",
    "CommandResult",
    "Follower",
    "Host",
    "KillReport",
    "LineStream",
    "LogLine",
    "PortForward",
    "StreamStart",
]

_LINE = re.compile(rb"[^\r\n]*[\r\n]")

#: Where a host keeps dsv4lab's per-user state (port reservations, the campaign lock), as a shell word: the
#: user's ``$DSV4LAB_STATE_DIR``, else ``~/.cache/dsv4lab``. Private to the user.
STATE_DIR = '"${DSV4LAB_STATE_DIR:-$HOME/.cache/dsv4lab}"'

#: How many output lines an error message quotes.
TAIL_LINES = 20


@dataclass(frozen=True)
class CommandResult:
    """What a command did on a host."""

    host: str
    command: str
    exit_status: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == 0 and not self.timed_out

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        status = "timed out" if self.timed_out else f"exit {self.exit_status}"
        body = hv.p(f"on {self.host}: {self.command} ({self.duration_s:.2f} s)")
        for name, text in (("stdout", self.stdout), ("stderr", self.stderr)):
            if text.strip():
                body += hv.p(name) + hv.fold(text.splitlines(), keep=20)
        return hv.card("command", body, state="ok" if self.ok else "fail", status=status)

    def check(self) -> CommandResult:
        """Return self, or raise :class:`CommandError` with the command and its last output lines."""
        if self.ok:
            return self
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()[-TAIL_LINES:]
        raise CommandError(self.host, self.command, self.exit_status, "\n".join(text), timed_out=self.timed_out)


@dataclass(frozen=True)
class KillReport:
    """Which processes of a tree a stop ended, and how."""

    root_pid: int
    terminated: tuple[int, ...] = ()
    killed: tuple[int, ...] = ()

    @property
    def all(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.terminated) | set(self.killed)))

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        return hv.card("stop", hv.p(str(self)), state="ok" if not self.killed else "warn")

    def __str__(self) -> str:
        if not self.all:
            return f"process tree of {self.root_pid}: nothing was running"
        return (
            f"process tree of {self.root_pid}: {len(self.terminated)} ended on SIGTERM"
            f"{' ' + str(list(self.terminated)) if self.terminated else ''}, {len(self.killed)} needed SIGKILL"
            f"{' ' + str(list(self.killed)) if self.killed else ''}"
        )


@dataclass(frozen=True)
class LogLine:
    """One line of a followed file; ``end_offset`` is the byte offset just after it (resume point)."""

    text: str
    end_offset: int


class Follower(ABC):
    """New lines of a growing file, read over one persistent stream.

    A line is complete at ``\\n`` or ``\\r`` (tqdm redraws with ``\\r``); a partial last line is held back
    until it completes. ``offset`` is where to resume after a reconnect.
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self._pending = b""

    def _split(self, data: bytes) -> list[LogLine]:
        """Cut received bytes into complete lines; ``offset`` counts every byte received."""
        buf = self._pending + data
        base = self.offset - len(self._pending)  # file offset of buf[0]
        out: list[LogLine] = []
        start = 0
        for m in _LINE.finditer(buf):
            if m.end() - 1 > m.start():
                out.append(LogLine(buf[m.start() : m.end() - 1].decode("utf-8", "replace"), base + m.end()))
            start = m.end()
        self._pending = buf[start:]
        self.offset += len(data)
        return out

    @property
    def resume_offset(self) -> int:
        """Byte offset of the first byte not yet returned as part of a complete line."""
        return self.offset - len(self._pending)

    @abstractmethod
    def poll(self, timeout_s: float) -> list[LogLine]:
        """Complete lines that arrived within ``timeout_s`` (possibly none)."""

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class StreamStart:
    """The host's clock when a stream began: its epoch seconds and its UTC offset (``date +%z``).

    Timestamps a command prints (nvidia-smi's, a log's) are in the host's local time; this is what turns
    them into instants that line up with each other and with the caller's clock.
    """

    epoch_s: float
    utc_offset_s: int


#: First line a stream prints, before the command's own output: host epoch and UTC offset.
STREAM_MARK = "\x1edsv4lab-stream"


class LineStream(ABC):
    """The stdout lines of a long-running command on a host, read over one persistent channel.

    Closing the stream ends the command: the wrapper around it waits on its stdin and SIGTERMs the command
    when stdin closes, which happens both when :meth:`close` is called and when the connection drops, so
    no loop process is left running on the host either way.
    """

    def __init__(self) -> None:
        self._pending = b""
        self.start: StreamStart | None = None
        self._stderr = bytearray()

    def _split(self, data: bytes) -> list[str]:
        buf = self._pending + data
        parts = buf.split(b"\n")
        self._pending = parts.pop()
        out: list[str] = []
        for raw in parts:
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if self.start is None and line.startswith(STREAM_MARK):
                self.start = _parse_mark(line)
                continue
            out.append(line)
        return out

    def _add_stderr(self, data: bytes) -> None:
        self._stderr += data
        if len(self._stderr) > 1 << 16:
            del self._stderr[: len(self._stderr) - (1 << 15)]

    @property
    def stderr_tail(self) -> str:
        """The last lines the command wrote to stderr (for error messages)."""
        return "\n".join(self._stderr.decode("utf-8", "replace").strip().splitlines()[-TAIL_LINES:])

    @abstractmethod
    def poll(self, timeout_s: float) -> list[str]:
        """Complete stdout lines that arrived within ``timeout_s`` (possibly none).

        Raises :class:`~dsv4lab.errors.HostConnectionError` when the connection to the host is lost.
        """

    @property
    @abstractmethod
    def exit_status(self) -> int | None:
        """The command's exit status once it has ended (None while it runs)."""

    @abstractmethod
    def close(self, timeout_s: float = 1.0) -> None:
        """End the command and release the channel, waiting at most ``timeout_s`` for it to exit."""

    def __enter__(self) -> LineStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _parse_mark(line: str) -> StreamStart | None:
    words = line.split()
    try:
        epoch = float(words[1])
    except (IndexError, ValueError):
        epoch = float(words[1].split(".")[0]) if len(words) > 1 and words[1].split(".")[0].isdigit() else 0.0
    offset = 0
    if len(words) > 2 and len(words[2]) == 5 and words[2][0] in "+-" and words[2][1:].isdigit():
        sign = -1 if words[2][0] == "-" else 1
        offset = sign * (int(words[2][1:3]) * 3600 + int(words[2][3:5]) * 60)
    return StreamStart(epoch, offset)


@dataclass
class PortForward:
    """A local port that reaches ``remote_port`` on the host; close it when done."""

    local_port: int
    remote_port: int
    _closer: object = field(default=None, repr=False)
    #: Where the local port is reached: this machine's loopback, or the address itself when the host is this
    #: machine and the port is another machine's.
    local_address: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.local_address}:{self.local_port}"

    def close(self) -> None:
        closer = self._closer
        if closer is not None and hasattr(closer, "close"):
            closer.close()

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- shell snippets shared by every host ---------------------------------------------------------------------

_START_DETACHED = r"""
cd -- "$1" || exit 97
shift
# setsid: own session and process group (the group id is the PID we print), so that the process survives
# this session ending and its whole tree can be found again by group.
setsid nohup "$@" > /dev/null 2>&1 < /dev/null &
echo "$!"
"""

_IS_ALIVE = r"""
state=$(ps -o stat= -p "$1" 2>/dev/null) || exit 1
case "$state" in *Z*) exit 1 ;; esac
exit 0
"""

# Descendants of a PID plus every member of its process group (children re-parented after their parent
# died keep the group). SIGTERM all, wait up to the grace period, SIGKILL what is left. Prints TERM/KILL
# lines so the caller can report what was stopped.
_KILL_TREE = r"""
root=$1
grace_ms=$2
table=$(ps -e -o pid=,ppid=,pgid=,stat= 2>/dev/null)
collect() {
  echo "$1"
  for child in $(printf '%s\n' "$table" | awk -v p="$1" '$2 == p { print $1 }'); do
    collect "$child"
  done
}
pids=$( { collect "$root"; printf '%s\n' "$table" | awk -v g="$root" '$3 == g { print $1 }'; } | sort -un)
live=""
for p in $pids; do
  state=$(printf '%s\n' "$table" | awk -v p="$p" '$1 == p { print $4 }')
  [ -n "$state" ] || continue
  case "$state" in *Z*) continue ;; esac
  [ "$p" = "$$" ] && continue
  live="$live $p"
done
[ -n "$live" ] || exit 0
kill -TERM $live 2>/dev/null
waited=0
while [ "$waited" -lt "$grace_ms" ]; do
  left=""
  for p in $live; do
    s=$(ps -o stat= -p "$p" 2>/dev/null) || continue
    case "$s" in *Z*) continue ;; esac
    left="$left $p"
  done
  [ -n "$left" ] || break
  sleep 0.1
  waited=$((waited + 100))
done
for p in $live; do
  s=$(ps -o stat= -p "$p" 2>/dev/null) && case "$s" in *Z*) ;; *)
    kill -KILL "$p" 2>/dev/null && echo "KILL $p" && continue ;; esac
  echo "TERM $p"
done
"""


# Runs "$@" as the stream's command. Prints the host clock first; then a watcher waits for stdin to close
# (the caller closed the stream, or the connection dropped) and SIGTERMs the command, so a loop process
# never outlives its reader. The command itself reads /dev/null.
_STREAM = r"""
exec 3<&0 0</dev/null
printf '\036dsv4lab-stream %s %s\n' "$(date +%s.%N)" "$(date +%z)"
"$@" 3<&- &
child=$!
( cat <&3 >/dev/null 2>&1; kill -TERM "$child" 2>/dev/null ) > /dev/null 2>&1 &
watcher=$!
exec 3<&-
wait "$child"
status=$?
kill -TERM "$watcher" 2>/dev/null
exit "$status"
"""


def stream_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """The argv that runs ``argv`` under the stream wrapper, with ``env`` set for the command only."""
    prefix = ["env", *(f"{k}={v}" for k, v in (env or {}).items())] if env else []
    return [*prefix, "bash", "-c", _STREAM, "dsv4lab-stream", *argv]


class Host(ABC):
    """A machine dsv4lab can run commands on, copy files to and from, and start servers on."""

    name: str

    @abstractmethod
    def run(self, command: Sequence[str] | str, *, timeout_s: float, input_text: str | None = None) -> CommandResult:
        """Run an argv list (quoted for the shell) or a bash script (given as one string) and wait."""

    @abstractmethod
    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write a text file on the host (parents must exist; see :meth:`makedirs`)."""

    @abstractmethod
    def read_text(self, path: str, *, max_bytes: int = 1 << 20) -> str | None:
        """The file's text (its last ``max_bytes``), or None when it does not exist."""

    @abstractmethod
    def put(self, local_path: str, remote_path: str) -> None:
        """Copy a local file to the host."""

    @abstractmethod
    def get(self, remote_path: str, local_path: str) -> None:
        """Copy a file from the host."""

    @abstractmethod
    def follow(self, path: str, from_offset: int = 0) -> Follower:
        """Stream new lines of ``path`` from ``from_offset`` (the file may not exist yet)."""

    @abstractmethod
    def forward(self, remote_port: int, *, address: str = "127.0.0.1") -> PortForward:
        """A local port reaching ``remote_port`` on the host's loopback, or on ``address`` as the host sees it
        (a cluster node, from its login host)."""

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> LineStream:
        """Run ``argv`` on the host and stream its stdout lines over one channel until closed.

        For commands that print forever (``nvidia-smi -lms``, ``tail -F``): one long-running process
        instead of one exec per sample. ``env`` is set for the command only.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot stream commands")

    def close(self) -> None:  # noqa: B027 - optional for hosts with nothing to release
        """Release connections; the host's processes keep running."""

    def __enter__(self) -> Host:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- built on run() ------------------------------------------------------------------------------------

    def makedirs(self, path: str, *, timeout_s: float = 30.0) -> None:
        self.run(["mkdir", "-p", "--", path], timeout_s=timeout_s).check()

    def start_detached(self, argv: Sequence[str], *, cwd: str, timeout_s: float = 30.0) -> int:
        """Start ``argv`` in its own session so it outlives this connection; return its PID."""
        result = self.run(["bash", "-c", _START_DETACHED, "dsv4lab-start", cwd, *argv], timeout_s=timeout_s).check()
        try:
            return int(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise CommandError(self.name, shlex.join(argv), result.exit_status, result.stdout) from None

    def is_alive(self, pid: int, *, timeout_s: float = 15.0) -> bool:
        """True while ``pid`` runs (a zombie counts as dead)."""
        return self.run(["bash", "-c", _IS_ALIVE, "dsv4lab-alive", str(pid)], timeout_s=timeout_s).exit_status == 0

    def kill_tree(self, pid: int, *, grace_s: float = 10.0, timeout_s: float | None = None) -> KillReport:
        """SIGTERM ``pid``, its descendants and its process group; SIGKILL what outlives ``grace_s``."""
        budget = timeout_s if timeout_s is not None else grace_s + 30.0
        result = self.run(
            ["bash", "-c", _KILL_TREE, "dsv4lab-kill", str(pid), str(int(grace_s * 1000))], timeout_s=budget
        ).check()
        terminated: list[int] = []
        killed: list[int] = []
        for line in result.stdout.splitlines():
            kind, _, num = line.partition(" ")
            if num.strip().isdigit():
                (killed if kind == "KILL" else terminated).append(int(num))
        return KillReport(pid, tuple(sorted(terminated)), tuple(sorted(killed)))

    def home_path(self, path: str) -> str:
        """``~/x`` as this host understands it (the base implementation asks the host's shell)."""
        if not path.startswith("~"):
            return path
        home = self.run(["bash", "-c", 'printf %s "$HOME"'], timeout_s=15.0).check().stdout
        return home + path[1:]

    def absolute_path(self, path: str) -> str:
        """An absolute path on the host: ``~/x`` and relative paths are taken from the login directory.

        Run directories must be absolute: the launch script changes (``cd``) into its run directory and then
        writes its log there, so a relative path would point somewhere else by then.
        """
        if path.startswith("/"):
            return posixpath.normpath(path)
        if path.startswith("~"):
            return posixpath.normpath(self.home_path(path))
        return posixpath.normpath(posixpath.join(self.home_path("~"), path))
