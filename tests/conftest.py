"""Shared test helpers.

Real parts (sshd, a Jupyter kernel, a real SGLang parser) are used wherever they can exist here. When one
is missing a test skips locally, but under CI (CI=true) it fails: CI promises to have installed them, so
a skip there would hide a broken setup.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str) -> None:
    """Skip (locally) or fail (CI=true) when a real part the test needs is not available."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is missing; `make test` should have installed it")
    pytest.skip(f"{what} is not available here")
