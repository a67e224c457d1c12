"""Collect A/B runs so that drift cancels: interleaved when both servers are up, sequential otherwise.

Servers and hosts drift (thermal state, other tenants, a cache warming up). Running all of A and then all
of B turns drift into a fake difference; alternating A, B, A, B at each concurrency spreads it over both
arms. When only one server fits at a time (one GPU host, two configs) interleaving would need a restart
per run, so the sequential order is used: run :func:`~dsv4lab.bench.runner.sweep` on A, relaunch as B, sweep
again, and pass both lists to :func:`~dsv4lab.bench.stats.compare`.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from dsv4lab.bench.client import ClientOptions
from dsv4lab.bench.results import BenchResult, BenchRuns
from dsv4lab.bench.runner import run_async, runs_after
from dsv4lab.bench.stats import MIN_REPEATS, ABComparison, compare
from dsv4lab.bench.store import ResultStore
from dsv4lab.bench.workload import LoadSpec, Workload, parse_levels
from dsv4lab.blocking import stoppable
from dsv4lab.counts import plural
from dsv4lab.errors import BenchError, Interrupted
from dsv4lab.progress import Progress

__all__ = ["ABRuns", "ab_schedule", "run_ab", "run_ab_async"]

Arm = Literal["A", "B"]


def ab_schedule(concurrencies: Sequence[int], repeats: int, *, interleave: bool = True) -> list[tuple[Arm, int, int]]:
    """The order of runs as (arm, concurrency, repeat): A,B,A,B per level, or all A then all B."""
    if interleave:
        return [(arm, c, r) for c in concurrencies for r in range(repeats) for arm in ("A", "B")]
    return [(arm, c, r) for arm in ("A", "B") for c in concurrencies for r in range(repeats)]


@dataclass(frozen=True)
class ABRuns:
    """The runs of both arms, in the order they were made (``partial`` when a server died or Stop was hit)."""

    a: tuple[BenchResult, ...]
    b: tuple[BenchResult, ...]
    label_a: str = "A"
    label_b: str = "B"

    @property
    def partial(self) -> bool:
        return any(r.partial for r in (*self.a, *self.b))

    def compare(
        self,
        *,
        metric: str = "output_throughput",
        higher_is_better: bool | None = None,
        confidence: float = 0.95,
        min_repeats: int = MIN_REPEATS,
        allow_partial: bool = False,
    ) -> ABComparison:
        """B against A per concurrency level (Welch CI); see :func:`~dsv4lab.bench.stats.compare`."""
        return compare(
            self.a,
            self.b,
            metric=metric,
            higher_is_better=higher_is_better,
            confidence=confidence,
            min_repeats=min_repeats,
            allow_partial=allow_partial,
            label_a=self.label_a,
            label_b=self.label_b,
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per run, both arms, with an ``arm`` column (A or B) beside the flat metrics."""
        rows = [{"arm": "A", **r.flat()} for r in self.a] + [{"arm": "B", **r.flat()} for r in self.b]
        frame: pd.DataFrame = pd.DataFrame(rows)
        return frame

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        try:
            body = self.compare()._repr_html_()
        except BenchError as exc:  # too few repeats, or a partial run: show the runs and why
            body = hv.p(f"No verdict: {exc}")
        runs = BenchRuns((*self.a, *self.b))._repr_html_()
        return body + runs


async def run_ab_async(
    url_a: str,
    url_b: str,
    workload: Workload | Callable[[int], Workload],
    concurrencies: Sequence[int] | int | str,
    *,
    repeats: int = MIN_REPEATS,
    interleave: bool = True,
    load: LoadSpec | None = None,
    options: ClientOptions | None = None,
    label_a: str = "A",
    label_b: str = "B",
    progress: bool | Progress = True,
    on_server_death: Callable[[], object] | None = None,
    store: ResultStore | str | None = None,
) -> ABRuns:
    """Run both arms with the same workload and load (same seeds), in :func:`ab_schedule` order.

    ``workload`` may be a function of the concurrency level. Stops early if a server dies or the user
    stops (the partial run is kept).
    """
    reporter = progress if isinstance(progress, Progress) else Progress(f"A/B {label_b} vs {label_a}", enabled=progress)
    runs: dict[Arm, list[BenchResult]] = {"A": [], "B": []}
    arms = _Arms(url_a, url_b, label_a, label_b)
    await _ab_into(
        runs,
        arms,
        workload,
        concurrencies,
        repeats,
        interleave,
        load,
        options,
        reporter,
        on_server_death,
        store,
    )
    out = ABRuns(tuple(runs["A"]), tuple(runs["B"]), label_a, label_b)
    if not isinstance(progress, Progress):
        _finish(reporter, out)
    return out


@dataclass(frozen=True)
class _Arms:
    url_a: str
    url_b: str
    label_a: str
    label_b: str


async def _ab_into(
    runs: dict[Arm, list[BenchResult]],
    arms: _Arms,
    workload: Workload | Callable[[int], Workload],
    concurrencies: Sequence[int] | int | str,
    repeats: int,
    interleave: bool,
    load: LoadSpec | None,
    options: ClientOptions | None,
    reporter: Progress,
    on_server_death: Callable[[], object] | None,
    store: ResultStore | str | None,
) -> None:
    """The A/B runs, appended to ``runs`` as each ends, so a stopped A/B keeps them."""
    if repeats < 1:
        raise BenchError(f"repeats must be >= 1, got {repeats}")
    base = load or LoadSpec()
    plan = ab_schedule(parse_levels(concurrencies), repeats, interleave=interleave)
    for i, (arm, c, r) in enumerate(plan, 1):
        url, label = (arms.url_a, arms.label_a) if arm == "A" else (arms.url_b, arms.label_b)
        what = f"run {i}/{len(plan)}: {label} c={c} repeat {r + 1}"
        reporter.update(what, fraction=0.0)
        wl = workload(c) if callable(workload) else workload

        result = await run_async(
            url,
            wl,
            dataclasses.replace(base, concurrency=c),
            options,
            repeat=r,
            label=label,
            progress=reporter,
            on_server_death=on_server_death,
            store=store,
        )
        runs[arm].append(result)
        reporter.kept = ABRuns(tuple(runs["A"]), tuple(runs["B"]), arms.label_a, arms.label_b)
        if result.partial:
            return


def _planned(concurrencies: Sequence[int] | int | str, repeats: int, interleave: bool) -> int | None:
    try:
        return len(ab_schedule(parse_levels(concurrencies), repeats, interleave=interleave))
    except BenchError:
        return None


def _finish(reporter: Progress, runs: ABRuns) -> None:
    made = plural(len(runs.a) + len(runs.b), "run")
    failed = [(label, r) for label, arm in ((runs.label_a, runs.a), (runs.label_b, runs.b)) for r in arm]
    failed = [(label, r) for label, r in failed if r.outcome == "failed"]
    if runs.partial:
        reporter.finish(f"stopped early after {made}", "fail")
    elif failed:  # a run that completed nothing has no figures to compare: the A/B did not measure
        label, first = failed[0]
        reporter.finish(f"FAILED: {len(failed)} of {made} completed no request ({label}: {first.failure})", "fail")
    else:
        reporter.finish(f"done: {made}", "ok")


def _ab_title(call: inspect.BoundArguments) -> str:
    return f"A/B {call.arguments['label_b']} vs {call.arguments['label_a']}"


def _ab_stopped(reporter: Progress, partial: Any, call: inspect.BoundArguments) -> Interrupted:
    a = call.arguments
    if not isinstance(partial, ABRuns):
        partial = ABRuns((), (), a["label_a"], a["label_b"])
    # A run cut by the Stop is the last one made (at most one is cut: the A/B stops after it).
    made = sorted([*partial.a, *partial.b], key=lambda r: r.partial)
    after = runs_after(made, _planned(a["concurrencies"], a["repeats"], a["interleave"]))
    reporter.finish(f"stopped by the user {after}", "warn")
    reporter.tick()
    what = f"A/B benchmark {a['label_b']} vs {a['label_a']}"
    return Interrupted(what, partial, after=after, elapsed_s=reporter.elapsed_s)


#: :func:`run_ab_async` as a blocking call; Stop keeps the runs made so far (an :class:`ABRuns` on
#: :class:`~dsv4lab.errors.Interrupted`'s ``partial``).
run_ab = stoppable(title=_ab_title, done=_finish, stopped=_ab_stopped)(run_ab_async)
