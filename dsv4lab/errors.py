"""One error hierarchy for dsv4lab.

Every error a user can meet derives from :class:`DSV4LabError`, so a notebook or a script can catch
"anything dsv4lab says is wrong" in one clause, and the CLI can print it as one ``Error: ...`` line
instead of a traceback. Messages name what is wrong and what would be accepted, because the reader is
usually in the middle of a campaign and wants the fix, not the stack.
"""

from __future__ import annotations

from typing import Any


class DSV4LabError(Exception):
    """Base class of every error dsv4lab raises on purpose."""


class ConfigError(DSV4LabError, ValueError):
    """A configuration value is invalid.

    Carries the field, the offending value and what is allowed, so widgets can highlight the field and
    reports can quote the rule that was broken.
    """

    def __init__(self, field: str, value: Any, allowed: str, *, detail: str = "") -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        self.detail = detail
        text = f"{field}={value!r} is not valid: {allowed}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)


class VersionError(DSV4LabError, ValueError):
    """A version string cannot be read, or a setting cannot be expressed for that SGLang version."""


class UnsupportedFlagError(VersionError):
    """The chosen SGLang version has no flag for a setting the config uses.

    Raised instead of silently dropping the setting: a launch that quietly ignores
    ``--cuda-graph-max-bs`` is exactly the kind of surprise that costs a five-minute restart.
    """

    def __init__(self, field: str, version: str, hint: str = "") -> None:
        self.field = field
        self.version = version
        text = f"SGLang {version} has no launch flag for {field}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class HostError(DSV4LabError):
    """Something about reaching or using a host (local or over SSH) went wrong."""


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

    def __init__(self, host: str, key_type: str, fingerprint: str, *, changed: bool, known_hosts: str) -> None:
        self.host = host
        self.key_type = key_type
        self.fingerprint = fingerprint
        self.changed = changed
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
        super().__init__(text)


class CommandError(HostError):
    """A command on a host exited non-zero or timed out; carries the command and its last output lines."""

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
