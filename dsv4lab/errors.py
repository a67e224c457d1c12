"""One error hierarchy for dsv4lab, drawn here and nowhere else.

Every error a user can meet derives from :class:`DSV4LabError`, so a notebook or a script can catch
"anything dsv4lab says is wrong" in one clause, and the CLI can print it as one ``Error: ...`` line
instead of a traceback. Messages name what is wrong and what would be accepted, because the reader is
usually in the middle of a campaign and wants the fix, not the stack.

The classes split by what the caller can do about them, and each carries the CLI's exit status for it::

    DSV4LabError                    1  something dsv4lab refused or could not do
    ├── ConfigError                 2  a value is invalid: fix the input (a usage error)
    │   └── UnknownNameError        2  a name typed is not one dsv4lab knows (did you mean ...?)
    ├── VersionError                2  an SGLang or vLLM version cannot be read or lacks a setting
    │   └── UnsupportedFlagError    2
    ├── LogError                    2  a log cannot be read as text
    ├── HostError                   3  reaching or using a host failed
    │   ├── HostConnectionError     3  connect, authenticate or keep the connection (retry later)
    │   ├── HostKeyError            4  the host key is unknown or changed (check it out of band)
    │   └── CommandError            5  a command on the host failed or timed out
    ├── LaunchError                 6  the server could not be started
    │   ├── StaleServerError        6  its port is taken or reserved by another server
    │   ├── HostSetupError          6  the host lacks what the launch needs (interpreter, module, files)
    │   └── SchedulerError          6  Slurm refused the job or cannot be reached (nothing was submitted)
    ├── BenchError                  7  a benchmark could not be set up, run or compared
    │   └── RemoteBenchError        7  SGLang's own benchmark failed on the host
    ├── ProfileError                8  a kernel profile could not be taken or read
    ├── PlotError                   9  a chart could not be built or rendered
    └── NotebookError              10  an experiment notebook failed (its report is still written)

Every name a user types — a preset, a config field, a notebook or one of its parameters, a hardware
profile, a twin fault, a campaign step — is checked against the names dsv4lab knows through
:class:`UnknownNameError`, which offers the nearest one (difflib), so ``config_bb`` or ``mem_frac`` costs
one glance, not a search through the docs.

A server that crashes, stalls or times out is *not* an error: it is a result (``Readiness``) to record
and show. Stop in a notebook (Ctrl-C in a script) raises :class:`Interrupted`, a ``KeyboardInterrupt``
that carries the partial result, so the cell stops and nothing measured is lost (exit status 130).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable
from typing import Any, ClassVar

__all__ = [
    "BenchError",
    "CommandError",
    "ConfigError",
    "DSV4LabError",
    "HostConnectionError",
    "HostError",
    "HostKeyError",
    "HostSetupError",
    "Interrupted",
    "LaunchError",
    "LogError",
    "NotebookError",
    "PlotError",
    "ProfileError",
    "RemoteBenchError",
    "SchedulerError",
    "StaleServerError",
    "UnknownNameError",
    "UnsupportedFlagError",
    "VersionError",
    "closest_name",
    "exit_code_for",
    "unknown_name_message",
]


class DSV4LabError(Exception):
    """Base class of every error dsv4lab raises on purpose."""

    exit_code: ClassVar[int] = 1


class ConfigError(DSV4LabError, ValueError):
    """A configuration value is invalid.

    Carries the field, the offending value and what is allowed, so widgets can highlight the field and
    reports can quote the rule that was broken.
    """

    exit_code: ClassVar[int] = 2

    def __init__(self, field: str, value: Any, allowed: str, *, detail: str = "") -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.detail = detail
        text = f"{field}={value!r} is not valid: {allowed}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)

    def within(self, prefix: str, *, field: str = "") -> ConfigError:
        """The same error told by a caller that knows where it happened (``step d: ``, ``sweep point x=1: ``):
        the message prefixed, the field prefixed (or ``field``), the class (an :class:`UnknownNameError` with
        its suggestion) kept."""
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.field = field or prefix + self.field
        new.args = (prefix + str(self),)
        return new


def _folded(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def closest_name(name: str, choices: Iterable[str]) -> str | None:
    """The known name a mistyped one most likely meant (``config_bb`` -> ``config_b``, ``mem_frac`` ->
    ``mem_fraction_static``, ``Mem-Fraction-Static`` -> ``mem_fraction_static``), or None when none is near.

    difflib's ratio, on names folded to lower case with ``-`` as ``_``; a name that is the start of exactly
    one known name (a truncated ``mem_frac``, whose ratio is low because the known name is long) counts too.
    """
    folded = {_folded(c): c for c in choices}
    typed = _folded(str(name))
    if not typed or not folded:
        return None
    if typed in folded:
        return folded[typed]
    near = difflib.get_close_matches(typed, list(folded), n=1, cutoff=0.7)
    if near:
        return folded[near[0]]
    starting = [c for f, c in folded.items() if f.startswith(typed)]
    return starting[0] if len(starting) == 1 and len(typed) >= 3 else None


def unknown_name_message(kind: str, name: Any, choices: Iterable[str], *, where: str = "", also: str = "") -> str:
    """``unknown preset 'config_bb' — did you mean 'config_b'? (allowed: config_a, config_b, config_b_fixed)``:
    the one wording of an unknown name, for errors that are not a :class:`UnknownNameError` (argparse's,
    a :class:`BenchError`)."""
    return str(UnknownNameError(kind, name, choices, where=where, also=also))


class UnknownNameError(ConfigError):
    """A name the user typed (a preset, a config field, a notebook, a notebook parameter, a hardware
    profile, a twin fault, a campaign step, an SGLang release) is not one dsv4lab knows.

    The message offers the nearest known name and lists them all; ``suggestion`` and ``choices`` carry the
    same for a widget or a caller that wants to offer the fix. ``allowed`` holds both, so an error that
    re-raises this one under another field name (``parameter preset of 04_config_b_fixed``) keeps them.
    """

    def __init__(
        self, kind: str, name: Any, choices: Iterable[str], *, field: str = "", where: str = "", also: str = ""
    ) -> None:
        self.kind = kind
        self.name = str(name)
        self.choices = tuple(choices)
        self.suggestion = closest_name(self.name, self.choices)
        listed = ", ".join(self.choices) + (f"; or {also}" if also else "")
        hint = f"did you mean {self.suggestion!r}? " if self.suggestion else ""
        self.field = field or kind
        self.value = name
        self.allowed = f"{hint}(allowed: {listed})"
        self.detail = ""
        head = f"unknown {kind} {self.name!r}{where}"
        DSV4LabError.__init__(self, f"{head} — {self.allowed}" if hint else f"{head} {self.allowed}")


class VersionError(DSV4LabError, ValueError):
    """A version string cannot be read, or a setting cannot be expressed for that SGLang version."""

    exit_code: ClassVar[int] = 2


class UnsupportedFlagError(VersionError):
    """The chosen SGLang (or vLLM) release has no flag for a setting the config uses.

    Raised instead of silently dropping the setting: a launch that quietly ignores
    ``--cuda-graph-max-bs`` is exactly the kind of surprise that costs a five-minute restart.
    """

    def __init__(self, field: str, version: str, hint: str = "", *, engine: str = "SGLang") -> None:
        self.field = field
        self.version = version
        self.engine = engine
        text = f"{engine} {version} has no launch flag for {field}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class LogError(DSV4LabError, ValueError):
    """A log cannot be read as text lines (missing, unreadable, binary)."""

    exit_code: ClassVar[int] = 2


class HostError(DSV4LabError):
    """Something about reaching or using a host (local or over SSH) went wrong."""

    exit_code: ClassVar[int] = 3


class HostConnectionError(HostError):
    """The connection to a host failed or dropped.

    Kept apart from server failures on purpose: a dropped SSH session says nothing about whether the
    server on the other end is alive, and must never be reported as a crash.
    """


class HostKeyError(HostError):
    """The host's SSH key is unknown or has changed.

    An unknown key is trusted only by an explicit opt-in (which records it in a known_hosts file); a
    changed key is always refused. The fingerprint is in the message so it can be checked out of band.
    """

    exit_code: ClassVar[int] = 4

    def __init__(
        self, host: str, key_type: str, fingerprint: str, *, changed: bool, known_hosts: str, where: str = ""
    ) -> None:
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.changed = changed
        self.known_hosts = known_hosts
        #: What the user typed that led here (``parameter host='gpubox' of 01_config_a_baseline``), if known.
        self.where = where
        if changed:
            text = (
                f"the {key_type} host key of {host} has CHANGED (now {fingerprint}); refusing to connect. "
                f"If the host was really reinstalled, remove its old entry from {known_hosts} after checking "
                "the new fingerprint out of band"
            )
        else:
            text = (
                f"the {key_type} host key of {host} is not known (fingerprint {fingerprint}). Check it out of "
                f"band, then connect with trust_unknown_host=True (CLI: --trust-host-key) to record it in "
                f"{known_hosts}"
            )
        super().__init__(f"{where}: {text}" if where else text)


class CommandError(HostError):
    """A command on a host exited non-zero or timed out; carries the command and its last output lines."""

    exit_code: ClassVar[int] = 5

    def __init__(self, host: str, command: str, exit_status: int | None, tail: str, *, timed_out: bool = False) -> None:
        self.host = host
        self.command = command
        self.exit_status = exit_status
        self.tail = tail
        self.timed_out = timed_out
        what = "timed out" if timed_out else f"exited with status {exit_status}"
        text = f"on {host}: `{command}` {what}"
        if tail:
            text += f"; last output:\n{tail}"
        super().__init__(text)


class LaunchError(DSV4LabError):
    """The server could not be started (the host refused, or the run directory is in use)."""

    exit_code: ClassVar[int] = 6


class StaleServerError(LaunchError):
    """The server's port is in use or reserved by another launch (an earlier server never stopped?)."""

    def __init__(self, host: str, port: int, pids: tuple[int, ...] | list[int] = (), *, holder: str = "") -> None:
        self.host = host
        self.port = port
        self.pids = tuple(pids)
        if holder:
            who = holder
        else:
            who = f"process(es) {', '.join(map(str, self.pids))}" if self.pids else "an unknown process"
        super().__init__(
            f"port {port} on {host} is already in use by {who}; stop it (dsv4lab stop RUN_DIR, or "
            "launch(..., replace_stale=True) to kill it) or choose another port"
        )


class HostSetupError(LaunchError):
    """The host lacks something the launch needs: the interpreter, a Python module, a kernel-config folder.

    Found before anything starts, so the user learns it in a second instead of from a dead server.
    """


class SchedulerError(LaunchError):
    """The cluster's scheduler (Slurm) refused the job, or its commands or controller cannot be reached from
    the login host. Raised before or at submit: nothing is left queued."""


class BenchError(DSV4LabError):
    """A benchmark could not be set up, run or compared (bad workload, unreachable server, too few repeats).

    A server that dies mid-run is *not* an error: the run returns a partial result instead, because what
    was measured before the death is evidence worth keeping.
    """

    exit_code: ClassVar[int] = 7


class RemoteBenchError(BenchError):
    """SGLang's own benchmark failed on the server host, or left output dsv4lab cannot read."""


class ProfileError(DSV4LabError):
    """Profiling could not be started, stopped or read."""

    exit_code: ClassVar[int] = 8


class PlotError(DSV4LabError):
    """A chart could not be built or rendered (missing columns, no data, a renderer failure)."""

    exit_code: ClassVar[int] = 9


class NotebookError(DSV4LabError):
    """An experiment notebook failed; its report is still written and named here (``run`` has it all)."""

    exit_code: ClassVar[int] = 10

    def __init__(self, message: str, run: Any = None) -> None:
        super().__init__(message)
        self.run = run


class Interrupted(KeyboardInterrupt):
    """The user stopped a blocking call (the notebook's Stop button, Ctrl-C, SIGTERM).

    It is a ``KeyboardInterrupt``, so the cell or script stops as the user asked, but it carries what was
    done before the stop — a partial benchmark, the readiness seen so far — in ``partial``, and the call
    has already stopped what it started (unless told to keep it).

    A Stop is not a crash, so a notebook shows it as one short block instead of a library traceback
    (IPython asks :meth:`_render_traceback_`): what stopped, after what, and where the partial result
    is. The cell's assignment never happens, so the block names an expression that reaches the result:
    the attribute that also holds it (``a.runs``, found by the name the notebook gave its holder, see
    :meth:`kept_in`) and ``sys.last_value.partial`` (IPython keeps the last exception there).
    """

    exit_code: ClassVar[int] = 130

    def __init__(
        self,
        what: str,
        partial: Any = None,
        *,
        after: str = "",
        elapsed_s: float | None = None,
        note: str = "",
    ) -> None:
        """``what`` names the call ("sweep config-a at c=1, 16"), ``after`` how far it got ("after 1 of 2
        runs"), ``note`` what the stop did to what the call started ("the server was stopped")."""
        self.what = what
        self.partial = partial
        self.after = after
        self.elapsed_s = elapsed_s
        self.note = note
        self.places: list[tuple[str, tuple[object, ...]]] = []
        super().__init__(self._message())

    def kept_in(self, template: str, *holders: object) -> Interrupted:
        """Say that the partial result is also kept on ``holders`` (returns self, for ``raise``).

        ``template`` has one ``{}`` per holder, e.g. ``"{}.runs"``; the notebook's variable name for each
        holder fills it when the block is shown (a holder the notebook has no name for is not shown).
        """
        self.places.append((template, holders))
        return self

    def _message(self) -> str:
        when = ", ".join(x for x in (self.after, _seconds(self.elapsed_s)) if x)
        if when and not self.after:
            when = f"after {when}"
        text = f"{self.what} stopped by the user" + (f" {when}" if when else "")
        return f"{text}; {self.note}" if self.note else text

    def _render_traceback_(self) -> list[str]:
        """The lines IPython shows for this exception in place of a traceback (its protocol for
        exceptions that render themselves); a Stop is the user's, so where it happened is no news."""
        try:
            return _stop_block(self)
        except Exception:  # a broken hint must not hide the stop itself
            return [f"Stopped: {self}"]


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


def _stop_block(exc: Interrupted) -> list[str]:
    after = exc.after or ("after" if exc.elapsed_s is not None else "")
    took = f" ({_seconds(exc.elapsed_s)})" if exc.elapsed_s is not None else ""
    lines = [f"Stopped by the user: {exc.what}{', ' + after if after else ''}{took}."]
    if exc.note:
        lines.append(exc.note[:1].upper() + exc.note[1:] + ".")
    if exc.partial is None:
        return lines
    names = _namespace_names()
    where = [
        template.format(*found)
        for template, holders in exc.places
        if None not in (found := [names.get(id(h)) for h in holders])
    ]
    sys_name = names.get(id(sys))
    where.append(f"{sys_name}.last_value.partial" if sys_name else "import sys; sys.last_value.partial")
    kind = type(exc.partial).__name__
    lines.append(f"Kept (the cell's assignment did not run): the partial {kind} in {'  or  '.join(where)}")
    return lines


def _namespace_names() -> dict[int, str]:
    """The notebook's names for its objects (public names only), by object id; empty outside IPython."""
    shell = sys.modules.get("IPython")
    get = getattr(shell, "get_ipython", None)
    ip = get() if callable(get) else None
    ns = getattr(ip, "user_ns", None)
    if not isinstance(ns, dict):
        return {}
    names: dict[int, str] = {}
    for name, value in ns.items():
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_"):
            names.setdefault(id(value), name)
    return names


def exit_code_for(exc: BaseException) -> int:
    """The CLI exit status for an exception dsv4lab raised (1 for anything unexpected)."""
    code = getattr(exc, "exit_code", None)
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return code if isinstance(code, int) else 1
