"""Collect A/B runs so that drift cancels: interleaved when both servers are up, sequential otherwise.

Servers and hosts drift (thermal state, other tenants, a cache warming up). Running all of A and then all
of B turns drift into a fake difference; alternating A, B, A, B at each concurrency spreads it over both
arms. When only one server fits at a time (one GPU host, two configs) interleaving would need a restart
per run, so the sequential order is used: run :func:`~dsv4lab.bench.runner.sweep` on A, relaunch as B, sweep
again, and pass both lists to :func:`~dsv4lab.bench.compare.compare`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from dsv4lab.bench.compare import MIN_REPEATS, ABComparison, compare
from dsv4lab.bench.errors import BenchError
from dsv4lab.bench.results import BenchResult
from dsv4lab.bench.runner import run_async, run_sync
from dsv4lab.bench.workload import LoadSpec, Workload

__all__ = ["ABRuns", "ab_schedule", "run_ab", "run_ab_async"]

Arm = Literal["A", "B"]


def ab_schedule(concurrencies: Sequence[int], repeats: int, *, interleave: bool = True) -> list[tuple[Arm, int, int]]:
    """The order of runs as (arm, concurrency, repeat): A,B,A,B per level, or all A then all B."""
    if interleave:
        return [(arm, c, r) for c in concurrencies for r in range(repeats) for arm in ("A", "B")]
    return [(arm, c, r) for arm in ("A", "B") for c in concurrencies for r in range(repeats)]


@dataclass(frozen=True)
class ABRuns:
    """The runs of both arms, in the order they were made."""

    a: tuple[BenchResult, ...]
    b: tuple[BenchResult, ...]

    def compare(self, **kwargs: Any) -> ABComparison:
        return compare(self.a, self.b, **kwargs)


async def run_ab_async(
    url_a: str,
    url_b: str,
    workload: Workload,
    concurrencies: Sequence[int],
    *,
    repeats: int = MIN_REPEATS,
    interleave: bool = True,
    load: LoadSpec | None = None,
    **kwargs: Any,
) -> ABRuns:
    """Run both arms with the same workload and load (same seeds), in :func:`ab_schedule` order.

    Stops early if a server dies (its partial run is kept); ``kwargs`` go to
    :func:`~dsv4lab.bench.runner.run_async` (``store``, ``options``, ``progress``, ``on_server_death``...).
    """
    if repeats < 1:
        raise BenchError(f"repeats must be >= 1, got {repeats}")
    base = load or LoadSpec()
    runs: dict[Arm, list[BenchResult]] = {"A": [], "B": []}
    for arm, c, r in ab_schedule(concurrencies, repeats, interleave=interleave):
        url = url_a if arm == "A" else url_b
        result = await run_async(url, workload, dataclasses.replace(base, concurrency=c), repeat=r, label=arm, **kwargs)
        runs[arm].append(result)
        if result.partial:
            break
    return ABRuns(tuple(runs["A"]), tuple(runs["B"]))


def run_ab(url_a: str, url_b: str, workload: Workload, concurrencies: Sequence[int], **kwargs: Any) -> ABRuns:
    """Blocking :func:`run_ab_async` (works in a notebook cell too)."""
    return run_sync(run_ab_async(url_a, url_b, workload, concurrencies, **kwargs))
