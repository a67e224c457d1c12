"""Errors of the benchmark layer.

They derive from :class:`~dsv4lab.errors.DSV4LabError` so that the CLI prints them as one ``Error: ...``
line and a notebook can catch every dsv4lab failure in one clause. A server that dies mid-run is *not* an
error here: the run returns a partial :class:`~dsv4lab.bench.results.BenchResult` instead, because what
was measured before the death is evidence worth keeping.
"""

from __future__ import annotations

from dsv4lab.errors import DSV4LabError

__all__ = ["BenchError", "RemoteBenchError"]


class BenchError(DSV4LabError):
    """A benchmark could not be set up, run or compared (bad workload, unreachable server, too few repeats)."""


class RemoteBenchError(BenchError):
    """SGLang's own benchmark failed on the server host, or left output dsv4lab cannot read."""
