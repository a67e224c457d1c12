"""A benchmark client that stood still measured its host, not the server: the heartbeat sees it, and a
sweep or an A/B makes that run again (against the twin in its own process, so only the client stalls)."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dsv4lab.bench import BenchResult, LoadSpec, random_workload, run_ab_async, sweep_async
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


def test_a_blocked_loop_is_a_stall_as_long_as_the_block() -> None:
    async def scenario() -> float:
        watch = StallWatch().start()
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # nothing on this loop runs meanwhile, as when the process is not scheduled
        await asyncio.sleep(0.1)
        return watch.stop()

    assert asyncio.run(scenario()) >= 0.3 - HEARTBEAT_S  # the block began up to one beat before it was due


def test_a_stall_still_under_way_when_the_run_ends_counts() -> None:
    """The stall that lengthens a run most covers its last bytes: the run ends before the heartbeat wakes."""

    async def scenario() -> float:
        watch = StallWatch().start()
        await asyncio.sleep(0.05)
        time.sleep(0.3)
        return watch.stop()

    assert asyncio.run(scenario()) >= 0.3 - HEARTBEAT_S  # the block began up to one beat before it was due


def test_disturbed_is_a_share_of_the_run_above_a_floor() -> None:
    assert not disturbed(None, 10.0)  # not measured (another client's run)
    assert not disturbed(0.5, 0.0)
    assert not disturbed(STALL_FLOOR_S, 1.0)  # ordinary jitter of a loaded host
    assert disturbed(0.15, 1.0)
    assert not disturbed(0.4, 10.0) and disturbed(0.6, 10.0)  # 5 % of a 10-s run
    assert STALL_SHARE == 0.05
    assert stall_text(0.6, 2.0) == "the client itself stood still for 0.60 s of a 2.00-s run (30%, host clock)"
    with pytest.raises(ValueError, match="interval must be positive"):
        StallWatch(0.0)


def stalled_result(stall_s: float | None, *, partial: bool = False) -> BenchResult:
    """A run of 1.0 s (``make_result``'s duration) whose client stood still for ``stall_s``."""
    return dataclasses.replace(make_result(), client_stall_s=stall_s, partial=partial)


def test_a_result_keeps_its_stall_through_the_store(tmp_path: Path) -> None:
    result = stalled_result(0.4)
    assert result.disturbed and result.disturbance is not None and "0.40 s of a 1.00-s run" in result.disturbance
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


# -- a series makes a stalled run again ---------------------------------------------------------------


class StallOnce(Progress):
    """A progress line that, when ``at`` measured requests of the first run have finished (the rest are in
    flight), calls ``stall`` once."""

    def __init__(self, stall: Callable[[], None], at: int = 1) -> None:
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

    def stall(self) -> None:
        """Stop the twin's process for :data:`STALL_S` without holding up the client (it resumes by a timer)."""
        self.proc.send_signal(signal.SIGSTOP)
        threading.Timer(STALL_S, self.proc.send_signal, (signal.SIGCONT,)).start()


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
def test_a_sweep_makes_the_run_the_client_stalled_in_again(twin: Twin, tmp_path: Path) -> None:
    progress = StallOnce(stall_the_client)
    store = tmp_path / "store"
    runs = asyncio.run(
        sweep_async(twin.url, WORKLOAD, [4], repeats=2, load=LoadSpec(warmup=0), progress=progress, store=str(store))
    )
    assert progress.stalled
    assert [r.repeat for r in runs] == [0, 1] and not runs.partial
    (stalled,) = runs.redone
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
    assert {r.id for r in ResultStore(store).load(strict=True)} == {stalled.id, *(r.id for r in runs)}


@pytest.mark.slow
def test_an_ab_makes_the_run_the_client_stalled_in_again_and_compares_the_others(twin: Twin) -> None:
    progress = StallOnce(stall_the_client)
    runs = asyncio.run(
        run_ab_async(twin.url, twin.url, WORKLOAD, [4], repeats=1, load=LoadSpec(warmup=0), progress=progress)
    )
    assert len(runs.a) == len(runs.b) == 1
    (stalled,) = runs.redone
    assert stalled.label == "A" and stalled.disturbed
    assert runs.a[0].id != stalled.id and not runs.a[0].disturbed
    assert "Made again and left out of the figures: A c=4 repeat 1, where" in runs._repr_html_()


@pytest.mark.slow
def test_a_sweep_makes_the_run_the_twin_stalled_at_its_end_again(twin: Twin) -> None:
    """The twin catches up a stall in the middle of a run, but one over its last request's end lengthens the run:
    the twin's own count of late steps (``/server_info``) says so, and the run is made again."""
    # Three requests of 50 output tokens and one of 5,000 (about 0.6 s here): when three have ended, the last
    # one has most of its tokens to go.
    short = random_workload(4, 64, 50, seed=3)
    last = dataclasses.replace(short.requests[-1], output_len=5000)
    workload = dataclasses.replace(short, requests=(*short.requests[:-1], last))
    progress = StallOnce(twin.stall, at=3)
    runs = asyncio.run(sweep_async(twin.url, workload, [4], repeats=1, load=LoadSpec(warmup=0), progress=progress))
    assert progress.stalled and len(runs) == 1
    assert len(runs.redone) == 1, {k: v for k, v in runs[0].flat().items() if "stall" in k or k == "duration_s"}
    (stalled,) = runs.redone
    assert stalled.twin_stall_s is not None and stalled.twin_stall_s >= STALL_S / 2
    assert stalled.client_stall_s is not None and stalled.client_stall_s < STALL_S / 2  # the client ran on
    assert stalled.disturbance is not None and "the twin's process stood still for" in stalled.disturbance
    assert runs[0].twin_stall_s is not None and not runs[0].disturbed
