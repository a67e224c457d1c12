"""A benchmark client that stood still measured its host, not the server: the heartbeat sees it, and a
sweep or an A/B makes that run again (against the twin in its own process, so only the client stalls)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsv4lab.bench import BenchResult, BenchRuns, LoadSpec, random_workload, run_ab_async, sweep_async
from dsv4lab.bench.runner import MAX_REDOS, undisturbed_run
from dsv4lab.bench.stalls import HEARTBEAT_S, STALL_FLOOR_S, STALL_SHARE, StallWatch, disturbed, stall_text
from dsv4lab.bench.store import ResultStore
from dsv4lab.progress import Progress
from tests.test_bench_store import make_result
from tests.test_twin_support import free_port, running_twin, twin_env, wait_healthy

TINY = ["--model-path", "dsv4lab/tiny-moe", "--tp-size", "2"]
#: How long the test keeps the client's event loop from running: a stall of the client's whole thread.
STALL_S = 0.6


# -- the heartbeat ------------------------------------------------------------------------------------


def watched(before_s: float, block_s: float, after_s: float) -> StallWatch:
    """A watch over a "run" that waits ``before_s``, keeps the loop from running for ``block_s`` (nothing on
    it runs meanwhile, as when the process is not scheduled), waits ``after_s`` and ends."""

    async def scenario() -> StallWatch:
        watch = StallWatch().start()
        await asyncio.sleep(before_s)
        time.sleep(block_s)
        if after_s:
            await asyncio.sleep(after_s)
        watch.stop()
        return watch

    return asyncio.run(scenario())


#: What a block of 0.3 s reads as at least: it may begin up to one beat before the beat was due.
BLOCKED = 0.3 - HEARTBEAT_S


def test_a_stall_at_the_start_delays_the_first_requests_and_counts() -> None:
    watch = watched(0.0, 0.3, 0.3)
    assert watch.edge_s >= BLOCKED and watch.longest_s >= BLOCKED


def test_a_stall_in_the_middle_is_seen_but_does_not_count() -> None:
    """Mid-run the bytes wait in the socket and are read late; the run still ends when the server ends it."""
    watch = watched(0.3, 0.3, 0.3)
    assert watch.longest_s >= BLOCKED and watch.edge_s < BLOCKED


def test_a_stall_still_under_way_when_the_run_ends_counts() -> None:
    """The run's last bytes are read late: the run ends before the heartbeat wakes."""
    assert watched(0.3, 0.3, 0.0).edge_s >= BLOCKED


def test_a_stall_the_run_ended_in_counts() -> None:
    """The loop resumes, reads the last bytes and winds the run down before it stops the watch."""
    assert watched(0.3, 0.3, 0.03).edge_s >= BLOCKED


def test_disturbed_is_a_share_of_the_run_above_a_floor() -> None:
    assert not disturbed(None, 10.0)  # not measured (another client's run)
    assert not disturbed(0.5, 0.0)
    assert not disturbed(STALL_FLOOR_S, 1.0)  # ordinary jitter of a loaded host
    assert disturbed(0.15, 1.0)
    assert not disturbed(0.4, 10.0) and disturbed(0.6, 10.0)  # 5 % of a 10-s run
    assert STALL_SHARE == 0.05
    assert stall_text(0.6, 2.0) == (
        "the client itself stood still for 0.60 s at the edge of a 2.00-s run (30%, host clock)"
    )
    with pytest.raises(ValueError, match="interval must be positive"):
        StallWatch(0.0)


def stalled_result(stall_s: float | None, *, partial: bool = False, twin: bool = True) -> BenchResult:
    """A run of 1.0 s (``make_result``'s duration) against the twin (or a real server) whose client stood still
    at its edge for ``stall_s``."""
    result = make_result()
    info = {"twin": {"time_scale": 0.02, "hardware": "rtx-pro-6000-x8"}} if twin else {}
    provenance = dataclasses.replace(result.provenance, server_info=info)
    return dataclasses.replace(result, provenance=provenance, client_stall_s=stall_s, partial=partial)


def test_a_result_keeps_its_stall_through_the_store(tmp_path: Path) -> None:
    result = stalled_result(0.4)
    assert (
        result.disturbed
        and result.disturbance is not None
        and "0.40 s at the edge of a 1.00-s run" in result.disturbance
    )
    assert stalled_result(0.01).disturbance is None and not stalled_result(None).disturbed
    store = ResultStore(tmp_path / "runs")
    store.append(result)
    (back,) = store.load(strict=True)
    assert back.client_stall_s == 0.4 and back.disturbed


def _redo(attempts: list[BenchResult]) -> tuple[BenchResult, list[BenchResult], int]:
    """``undisturbed_run`` over ``attempts`` in turn: the kept run, the redone ones, how many were made."""
    queue = list(attempts)
    made = 0

    async def make() -> BenchResult:
        nonlocal made
        made += 1
        return queue.pop(0)

    redone: list[BenchResult] = []
    kept = asyncio.run(undisturbed_run(make, Progress("t", enabled=False), "run 1/1", redone))
    return kept, redone, made


def test_a_quiet_run_is_made_once() -> None:
    quiet = stalled_result(0.01)
    assert _redo([quiet]) == (quiet, [], 1)


def test_a_stalled_run_is_made_again_until_quiet() -> None:
    first, second = stalled_result(0.5), stalled_result(0.02)
    assert _redo([first, second]) == (second, [first], 2)


def test_a_host_that_keeps_stalling_gets_bounded_tries_and_the_least_stalled_is_kept() -> None:
    tries = [stalled_result(0.5), stalled_result(0.2), stalled_result(0.9), stalled_result(0.0)]
    kept, redone, made = _redo(tries)
    assert made == MAX_REDOS + 1 == 3
    assert kept is tries[1] and redone == [tries[0], tries[2]]  # chosen by the stall, never by the figures


def test_a_redo_cut_short_ends_the_series_with_the_cut_run() -> None:
    first, cut = stalled_result(0.5), stalled_result(0.0, partial=True)
    assert _redo([first, cut]) == (cut, [first], 2)


def test_against_a_real_server_a_stalled_run_is_kept_and_says_so() -> None:
    """At its true size, on a host the client may share with the server (a CPU engine), a stall is part of the
    load: the run is kept and its table's status names the stall."""
    real = stalled_result(0.5, twin=False)
    assert real.disturbed and _redo([real]) == (real, [], 1)
    assert "ok, 1 failed (client stalled 0.50 s at the run&#x27;s edge)" in BenchRuns([real])._repr_html_()


# -- a series makes a stalled run again ---------------------------------------------------------------


class StallOnce(Progress):
    """A progress line that, when ``at`` measured requests of the first run have finished, calls ``stall``
    once (at 0: just before the first requests are sent)."""

    def __init__(self, stall: Callable[[], None], at: int = 0) -> None:
        super().__init__("stall once", enabled=False)
        self.stall = stall
        self.at = at
        self.stalled = False
        self.lines: list[str] = []

    def update(self, status: str | None = None, *, fraction: float | None = None, detail: str | None = None) -> None:
        if status is not None:
            self.lines.append(status)
        if not self.stalled and detail is not None and detail.startswith(f"{self.at}/"):
            self.stalled = True
            self.stall()
        super().update(status, fraction=fraction, detail=detail)


def stall_the_client() -> None:
    """Keep the client's event loop from running: a stall of the client's whole thread, the server unaffected."""
    time.sleep(STALL_S)


@dataclasses.dataclass(frozen=True)
class Twin:
    url: str
    proc: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    tmp = tmp_path_factory.mktemp("stall-twin")
    port = free_port()
    argv = [*TINY, "--port", str(port)]
    with running_twin(argv, twin_env(tmp, DSV4LAB_TWIN_TIME_SCALE="0.05"), tmp / "server.log") as proc:
        wait_healthy(port, proc)
        yield Twin(f"http://127.0.0.1:{port}", proc)


WORKLOAD = random_workload(8, 64, 48, seed=3)


@pytest.mark.slow
def test_a_sweep_makes_the_run_the_client_stalled_at_the_start_of_again(twin: Twin, tmp_path: Path) -> None:
    progress = StallOnce(stall_the_client)
    store = tmp_path / "store"
    runs = asyncio.run(
        sweep_async(twin.url, WORKLOAD, [4], repeats=2, load=LoadSpec(warmup=0), progress=progress, store=str(store))
    )
    assert progress.stalled
    assert [r.repeat for r in runs] == [0, 1] and not runs.partial
    stalled = runs.redone[0]  # the first attempt of the first run (a stall of this host may add others)
    assert (
        stalled.repeat == 0 and stalled.client_stall_s is not None and stalled.client_stall_s >= STALL_S - HEARTBEAT_S
    )
    assert stalled.disturbed and all(not r.disturbed for r in runs)
    assert all(r.client_stall_s is not None and r.client_stall_s < STALL_S for r in runs)
    assert any("run 1/2: c=4 repeat 1 again: the client itself stood still for" in line for line in progress.lines)
    assert (
        "Made again and left out of the figures: run c=4 repeat 1, where the client itself stood" in runs._repr_html_()
    )
    # The store is the record of every run made, the stalled one included.
    assert {r.id for r in ResultStore(store).load(strict=True)} == {r.id for r in (*runs.redone, *runs)}


@pytest.mark.slow
def test_an_ab_makes_the_run_the_client_stalled_at_the_start_of_again_and_compares_the_others(twin: Twin) -> None:
    progress = StallOnce(stall_the_client)
    runs = asyncio.run(
        run_ab_async(twin.url, twin.url, WORKLOAD, [4], repeats=1, load=LoadSpec(warmup=0), progress=progress)
    )
    assert len(runs.a) == len(runs.b) == 1
    stalled = runs.redone[0]  # the first attempt of the first run (a stall of this host may add others)
    assert stalled.label == "A" and stalled.disturbed
    assert runs.a[0].id != stalled.id and not runs.a[0].disturbed
    assert "Made again and left out of the figures: A c=4 repeat 1, where" in runs._repr_html_()
