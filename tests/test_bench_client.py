"""The built-in client against a real streaming server on 127.0.0.1 with controlled timings."""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import pytest

from dsv4lab.bench import (
    BenchResult,
    BenchRuns,
    ClientOptions,
    LoadSpec,
    random_workload,
    run_async,
    sweep,
    sweep_async,
)
from dsv4lab.bench.client import API
from dsv4lab.errors import BenchError
from tests.test_bench_cli import ServerThread
from tests.test_bench_fakeserver import FakeServer, ServerBehaviour, fake_server


async def bench(
    behaviour: ServerBehaviour, *, api: API = "completions", n: int = 8, out: int = 10, **load: Any
) -> tuple[BenchResult, FakeServer]:
    server = await fake_server(behaviour)
    try:
        wl = random_workload(n, 16, out, seed=1)
        result = await run_async(
            server.url,
            wl,
            LoadSpec(**load),
            ClientOptions(api=api, request_timeout_s=20),
            progress=False,
        )
    finally:
        await server.stop()
    return result, server


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_each_api_measures_ttft_tpot_and_usage(api: API) -> None:
    result, server = asyncio.run(bench(ServerBehaviour(ttft_s=0.05, itl_s=0.01), api=api, concurrency=4))
    s = result.summary
    assert (s.completed, s.failed, s.incomplete) == (8, 0, 0)
    assert s.total_output_tokens == 80 and s.output_tokens_from_server
    assert s.total_input_tokens == 8 * 16  # the server's prompt count (the fake counts words)
    assert 50 <= s.ttft_ms.median < 120  # generous upper bounds: CI machines are shared
    assert 10 <= s.tpot_ms.median < 30
    assert s.itl_ms.count == 8 * 9
    assert s.e2e_ms.median == pytest.approx(s.ttft_ms.median + 9 * s.tpot_ms.median, rel=0.2)
    assert server.max_in_flight == 4 and s.peak_concurrent == 4
    body = server.bodies[-1]
    if api != "generate":
        assert body["stream_options"] == {"include_usage": True} and body["model"] == "fake-model"
    assert result.provenance.engine == "fake" and result.provenance.engine_version == "0.5.23"
    assert result.provenance.workload_seed == 1
    assert len(result.requests) == 8 and set(result.requests["status"]) == {"ok"}


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_concurrency_is_respected_and_queueing_is_reported(concurrency: int) -> None:
    result, server = asyncio.run(bench(ServerBehaviour(ttft_s=0.02, itl_s=0.002), n=16, out=5, concurrency=concurrency))
    s = result.summary
    assert s.completed == 16
    assert server.max_in_flight == concurrency
    if concurrency < 16:
        # Closed loop: every request is due at t=0, so the last ones waited for a slot — and that is shown.
        assert s.queue_ms.max > 20
    else:
        assert s.queue_ms.max < 20


def test_request_rate_schedule_and_queue_under_a_cap() -> None:
    # 20 req/s but each request takes ~200 ms and only one may run: the backlog must show as queue time.
    result, _ = asyncio.run(
        bench(ServerBehaviour(ttft_s=0.2, itl_s=0.0), n=6, out=2, concurrency=1, request_rate=20.0, warmup=0)
    )
    frame = result.requests
    assert list(frame["scheduled_s"]) == sorted(frame["scheduled_s"])
    assert frame["queue_ms"].iloc[-1] > 500
    assert result.summary.queue_ms.max > 500
    assert result.summary.ttft_ms.max < 300  # TTFT itself stays the server's


def test_no_usage_falls_back_to_chunk_count() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(usage=False, itl_s=0.0, tokens_per_chunk=2), out=6))
    s = result.summary
    assert not s.output_tokens_from_server
    assert s.total_output_tokens == 8 * 3  # 3 chunks of 2 tokens: the fallback undercounts, and says so
    assert not result.requests["prompt_tokens_from_server"].any()


def test_generate_counts_tokens_per_chunk_from_meta_info() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(itl_s=0.0, tokens_per_chunk=3), api="generate", out=7))
    assert result.summary.total_output_tokens == 8 * 7
    assert result.summary.itl_ms.count == 8 * 2  # chunks of 3, 3, 1 tokens: two gaps each


def test_keepalive_comments_are_ignored() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(keepalive_comments=True, itl_s=0.0)))
    assert result.summary.completed == 8 and result.summary.total_output_tokens == 80


def test_error_mid_stream_is_a_failure_with_the_message() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(error_after_chunks=3, itl_s=0.0)))
    s = result.summary
    assert (s.completed, s.failed) == (0, 8)
    assert all("boom mid-stream" in e for e in result.requests["error"])
    assert not result.partial  # an error event is the request's failure, not the server's death


def test_http_error_status_is_counted_not_dropped() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(http_status=503)))
    assert result.summary.failed == 8 and result.summary.completed == 0
    assert set(result.requests["http_status"]) == {503}
    assert all(e.startswith("HTTP 503") and "overloaded" in e for e in result.requests["error"])
    assert math.isnan(result.summary.ttft_ms.mean)


def test_stream_cut_without_done_is_incomplete() -> None:
    result, _ = asyncio.run(bench(ServerBehaviour(cut_after_chunks=2, itl_s=0.0), concurrency=1, warmup=0, n=2))
    assert result.summary.incomplete + result.summary.failed == 2
    assert result.summary.incomplete >= 1
    assert result.summary.completed == 0


def test_sweep_runs_every_level_and_repeat() -> None:
    async def go() -> BenchRuns:
        server = await fake_server(ServerBehaviour(ttft_s=0.005, itl_s=0.001))
        try:
            wl = random_workload(8, 8, 4, seed=2)
            return await sweep_async(server.url, wl, [1, 2, 8], repeats=2, progress=False)
        finally:
            await server.stop()

    results = asyncio.run(go())
    assert [(r.concurrency, r.repeat) for r in results] == [(1, 0), (1, 1), (2, 0), (2, 1), (8, 0), (8, 1)]
    assert all(r.summary.completed == 8 for r in results)
    assert len({r.id for r in results}) == 6


def test_sweep_levels_may_be_uncapped() -> None:
    from dsv4lab.bench.workload import cap_levels

    assert cap_levels("1, 4,inf") == [1, 4, None]
    assert cap_levels(None) == [None] and cap_levels([2, None]) == [2, None] and cap_levels(3) == [3]
    for bad in ("0", "x", "", [0]):
        with pytest.raises(BenchError):
            cap_levels(bad)

    async def go() -> BenchRuns:
        server = await fake_server(ServerBehaviour(ttft_s=0.05, itl_s=0.0))
        try:
            wl = random_workload(6, 8, 2, seed=2)
            return await sweep_async(server.url, wl, "2,inf", progress=False)
        finally:
            await server.stop()

    capped, uncapped = asyncio.run(go())
    assert capped.concurrency == 2 and uncapped.concurrency is None
    assert uncapped.summary.peak_concurrent == 6 and capped.summary.peak_concurrent == 2
    assert uncapped.flat()["concurrency"] is None


def test_the_progress_line_counts_ok_requests_as_the_table_does(capsys: pytest.CaptureFixture[str]) -> None:
    # Every request ends in an error event: each one finishes, none is ok. A line that said "4/4 requests"
    # beside a table's "0/4 ok" read as a success.
    served = ServerThread(ServerBehaviour(error_after_chunks=3, itl_s=0.0))
    try:
        runs = sweep(served.server.url, random_workload(4, 16, 10, seed=1), [2, 4], progress=True)
    finally:
        served.close()
    assert [(r.summary.completed, r.summary.total) for r in runs] == [(0, 4), (0, 4)]
    lines = capsys.readouterr().err.strip().splitlines()  # a script's progress: plain lines on stderr
    # The detail fields (after "title: status", which may quote the failure's own counts).
    counts = [part for line in lines for part in line.split(" | ")[1:] if " requests" in part]
    assert counts, lines
    for part in counts:  # every count says how many were ok, and none says more were ok than the table
        assert re.fullmatch(r"\d+/4 requests, 0 ok|0/8 requests ok", part), part
    assert lines[-1].split(" | ")[-2] == "0/8 requests ok", lines[-1]
