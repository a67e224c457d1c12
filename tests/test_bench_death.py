"""A server that dies mid-run: the run stops within seconds, keeps what it measured, and is diagnosed."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsv4lab.bench import (
    BenchResult,
    BenchRuns,
    ClientOptions,
    LoadSpec,
    ResultStore,
    random_workload,
    run_async,
    sweep_async,
)
from dsv4lab.bench.results import ServerContext
from tests.test_bench_fakeserver import ServerBehaviour, fake_server

ROOT = Path(__file__).resolve().parent.parent


def test_killed_server_gives_a_partial_result_within_seconds(tmp_path: Path) -> None:
    diagnoses: list[str] = []

    def on_death() -> object:
        diagnoses.append("called")
        return {"cause": "cuda_oom_graph_capture", "evidence": ["torch.OutOfMemoryError: CUDA out of memory"]}

    async def go() -> tuple[BenchResult, float]:
        # Each request streams 400 tokens 25 ms apart (10 s): nothing can finish before the kill.
        server = await fake_server(ServerBehaviour(ttft_s=0.01, itl_s=0.025))
        wl = random_workload(40, 8, 400, seed=1)
        task = asyncio.create_task(
            run_async(
                server.url,
                wl,
                LoadSpec(concurrency=4, warmup=0),
                ClientOptions(request_timeout_s=120),
                progress=False,
                on_server_death=on_death,
                store=str(tmp_path),
            )
        )
        await asyncio.sleep(0.6)
        killed_at = time.perf_counter()
        await server.kill()
        result = await task
        elapsed = time.perf_counter() - killed_at
        await server.stop()
        return result, elapsed

    result, elapsed = asyncio.run(go())
    assert elapsed < 5.0, elapsed
    s = result.summary
    assert result.partial and result.abort_reason
    assert s.completed == 0
    assert s.incomplete == 4  # the four streams in flight produced tokens, then broke off
    assert s.not_sent == 36  # never dropped: counted as not sent
    assert s.total == 40
    assert result.diagnosis == {
        "cause": "cuda_oom_graph_capture",
        "evidence": ["torch.OutOfMemoryError: CUDA out of memory"],
    }
    assert diagnoses == ["called"]
    incomplete = result.requests[result.requests["status"] == "incomplete"]
    assert all(e.startswith("run aborted") for e in incomplete["error"])
    assert (incomplete["ttft_ms"] > 0).all()  # what was measured is kept
    stored = ResultStore(tmp_path).load()
    assert len(stored) == 1 and stored[0].partial and stored[0].diagnosis == result.diagnosis


def test_sigkilled_server_process_stops_a_sweep() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.test_bench_fakeserver", "0.01", "0.02"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())

        async def go() -> tuple[BenchRuns, float]:
            wl = random_workload(30, 8, 300, seed=1)
            task = asyncio.create_task(
                sweep_async(f"http://127.0.0.1:{port}", wl, [1, 16], load=LoadSpec(warmup=0), progress=False)
            )
            await asyncio.sleep(0.8)
            killed_at = time.perf_counter()
            os.kill(proc.pid, signal.SIGKILL)
            results = await task
            return results, time.perf_counter() - killed_at

        results, elapsed = asyncio.run(go())
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert elapsed < 5.0, elapsed
    assert len(results) == 1  # the sweep did not go on to concurrency 16
    r = results[0]
    assert r.partial and r.concurrency == 1
    assert r.summary.incomplete == 1 and r.summary.not_sent == 29
    assert "connect" in (r.abort_reason or "") or "connection" in (r.abort_reason or "")


def test_dead_before_start_is_partial_with_nothing_sent() -> None:
    async def go() -> BenchResult:
        server = await fake_server()
        url = server.url
        await server.stop()
        return await run_async(
            url,
            random_workload(5, 8, 4),
            LoadSpec(concurrency=2, warmup=1),
            progress=False,
            server=ServerContext(info={}, gpus=()),
        )

    t0 = time.perf_counter()
    result = asyncio.run(go())
    assert time.perf_counter() - t0 < 5.0
    assert result.partial
    assert result.summary.not_sent == 5
    assert "warmup" in result.requests["error"].iloc[0]
