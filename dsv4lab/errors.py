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
