"""Where a request's clock starts (``ttft_clock``) and what an ITL is (``itl_unit``), against real servers.

The ``connect`` clock is bench_serving's: the request's own session, encoding and connection inside the
clock. A TCP relay that waits before it connects each new connection upstream makes connection setup
expensive and visible: a run with the ``send`` clock (connections opened before the clock) does not see it,
a run with ``connect`` sees it in every TTFT.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from dsv4lab.bench import BenchResult, ClientOptions, LoadSpec, random_workload, run_async
from dsv4lab.bench.client import API, TTFTClock
from dsv4lab.bench.metrics import RequestRecord
from dsv4lab.bench.results import ServerContext
from tests.test_bench_fakeserver import FakeServer, ServerBehaviour, fake_server

SETUP_DELAY_S = 0.08


class SlowRelay:
    """Relays TCP to ``upstream``; each new connection waits ``delay_s`` before it is relayed.
    ``connections`` counts those that carried a generation request (the run's side requests, such as
    ``/v1/models`` or ``/tokenize``, open their own)."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> SlowRelay:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(self.delay_s)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        first = True

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, *, client: bool = False) -> None:
            nonlocal first
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    if client and first:
                        first = False
                        self.connections += data.startswith((b"POST /v1/", b"POST /generate "))
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer, client=True), pipe(up_reader, writer))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()


async def _through_relay(clock: TTFTClock, n: int = 4) -> tuple[BenchResult, int]:
    server = await fake_server(ServerBehaviour(ttft_s=0.02, itl_s=0.002))
    relay = await SlowRelay(server.port, SETUP_DELAY_S).start()
    try:
        result = await run_async(
            relay.url,
            random_workload(n, 16, 4, seed=1),
            LoadSpec(concurrency=1, warmup=1),  # the warmup opens (and pays for) the one keep-alive connection
            ClientOptions(ttft_clock=clock, model="fake-model", request_timeout_s=20),  # no /v1/models lookup
            progress=False,
            server=ServerContext(info={}),
        )
    finally:
        await relay.stop()
        await server.stop()
    return result, relay.connections


def test_send_clock_leaves_connection_setup_out_of_ttft() -> None:
    result, connections = asyncio.run(_through_relay("send"))
    s = result.summary
    assert s.completed == 4
    assert s.ttft_ms.max < 20 + SETUP_DELAY_S * 1000 * 0.75  # the connection was open before the clock
    assert connections == 1  # the warmup's keep-alive connection, reused
    assert result.ttft_clock == "send" and "open connection" in result.definitions["clock"]


def test_connect_clock_puts_connection_setup_in_every_ttft_like_bench_serving() -> None:
    result, connections = asyncio.run(_through_relay("connect"))
    s = result.summary
    assert s.completed == 4
    assert s.ttft_ms.min >= 20 + SETUP_DELAY_S * 1000  # the server's 20 ms plus the relay's setup, always
    assert connections == 5  # one per request, the warmup's included: no keep-alive reuse
    assert result.ttft_clock == "connect" and "bench_serving" in result.definitions["clock"]
    row, flat = result.row(), result.flat()
    assert row["ttft_clock"] == flat["ttft_clock"] == "connect"
    assert result.provenance.client_options["ttft_clock"] == "connect"


@pytest.mark.parametrize("api", ["completions", "chat", "generate"])
def test_connect_clock_reads_every_api_and_usage(api: API) -> None:
    async def go() -> BenchResult:
        server = await fake_server(ServerBehaviour(ttft_s=0.01, itl_s=0.002, tokens_per_chunk=2))
        try:
            wl = random_workload(3, 16, 6, seed=2)
            return await run_async(
                server.url, wl, LoadSpec(concurrency=3), ClientOptions(api=api, ttft_clock="connect"), progress=False
            )
        finally:
            await server.stop()

    s = asyncio.run(go()).summary
    assert (s.completed, s.failed) == (3, 0)
    assert s.total_output_tokens == 18 and s.output_tokens_from_server
    assert s.itl_ms.count == 3 * 2  # 3 chunks of 2 tokens: two chunk gaps per request


def test_connect_clock_sees_a_dying_server_and_keeps_the_partial_result() -> None:
    async def go() -> tuple[BenchResult, float]:
        server = await fake_server(ServerBehaviour(ttft_s=0.01, itl_s=0.025))
        wl = random_workload(20, 8, 400, seed=1)
        opts = ClientOptions(ttft_clock="connect", request_timeout_s=120)
        task = asyncio.create_task(run_async(server.url, wl, LoadSpec(concurrency=4, warmup=0), opts, progress=False))
        await asyncio.sleep(0.6)
        killed = time.perf_counter()
        await server.kill()
        result = await task
        elapsed = time.perf_counter() - killed
        await server.stop()
        return result, elapsed

    result, elapsed = asyncio.run(go())
    assert result.partial and result.abort_reason
    assert elapsed < 10.0, elapsed
    assert result.summary.completed == 0 and result.summary.not_sent > 0


def test_stop_during_a_connect_clock_run_returns_the_partial_result() -> None:
    async def go() -> BenchResult:
        server = await fake_server(ServerBehaviour(ttft_s=0.01, itl_s=0.02))
        try:
            wl = random_workload(8, 8, 200, seed=1)
            opts = ClientOptions(ttft_clock="connect")
            task = asyncio.create_task(
                run_async(server.url, wl, LoadSpec(concurrency=2, warmup=0), opts, progress=False)
            )
            await asyncio.sleep(0.5)
            task.cancel()
            return await asyncio.wait_for(task, 5.0)
        finally:
            await server.stop()

    result = asyncio.run(go())
    assert result.interrupted and result.partial
    assert result.summary.incomplete + result.summary.not_sent == 8


def test_itl_unit_token_splits_each_gap_over_the_chunks_tokens() -> None:
    record = RequestRecord(
        index=0,
        status="ok",
        scheduled_s=0.0,
        start_s=0.0,
        ttft_s=0.1,
        e2e_s=0.4,
        chunk_times_s=(0.1, 0.25, 0.4),
        chunk_tokens=(1, 3, 2),
        output_tokens=6,
    )
    assert record.itls("chunk") == pytest.approx((0.15, 0.15))
    assert record.itls("token") == pytest.approx((0.05, 0.05, 0.05, 0.075, 0.075))
    assert sum(record.itls("token")) == pytest.approx(sum(record.itls("chunk")))
    no_counts = RequestRecord(0, "ok", 0.0, chunk_times_s=(0.1, 0.2), chunk_tokens=None)
    assert no_counts.itls("token") == no_counts.itls("chunk")  # OpenAI APIs: token counts per chunk unknown


def test_itl_unit_token_on_generate_gives_one_itl_per_token() -> None:
    async def go(unit: str) -> BenchResult:
        server = await fake_server(ServerBehaviour(ttft_s=0.0, itl_s=0.003, tokens_per_chunk=3))
        try:
            opts = ClientOptions(api="generate", itl_unit=unit)  # type: ignore[arg-type]
            return await run_async(server.url, random_workload(2, 8, 7, seed=1), LoadSpec(), opts, progress=False)
        finally:
            await server.stop()

    chunk, token = asyncio.run(go("chunk")), asyncio.run(go("token"))
    assert chunk.summary.itl_ms.count == 2 * 2  # chunks of 3, 3, 1 tokens: two gaps
    assert token.summary.itl_ms.count == 2 * 4  # 3 + 1 tokens after the first chunk
    assert [len(x) for x in token.requests["itl_ms"]] == [4, 4]
    assert token.itl_unit == "token" and token.flat()["itl_unit"] == "token"


def test_stamp_chunks_choice_times_the_chunks_without_text() -> None:
    """vLLM streams a chunk per token even when the token decodes to nothing yet; ``vllm bench serve`` times
    it, bench_serving (and dsv4lab's default) does not: the same stream, two definitions, both recorded."""

    async def go(stamp: str) -> BenchResult:
        server = await fake_server(ServerBehaviour(ttft_s=0.0, itl_s=0.003, empty_text_every=2))
        try:
            opts = ClientOptions(stamp_chunks=stamp)  # type: ignore[arg-type]
            return await run_async(server.url, random_workload(2, 8, 8, seed=1), LoadSpec(), opts, progress=False)
        finally:
            await server.stop()

    text, choice = asyncio.run(go("text")), asyncio.run(go("choice"))
    assert text.summary.completed == choice.summary.completed == 2
    # Eight chunks per request, the 1st, 3rd, 5th and 7th without text.
    assert [len(x) for x in text.requests["itl_ms"]] == [3, 3]
    assert [len(x) for x in choice.requests["itl_ms"]] == [7, 7]
    assert text.summary.output_tokens_from_server and choice.summary.output_tokens_from_server
    assert text.stamp_chunks == "text" and choice.flat()["stamp_chunks"] == "choice"
    assert "choice-bearing (text or not)" in choice.definitions["itl"]
    assert "token-bearing" in text.definitions["ttft"]


def test_options_are_checked() -> None:
    from dsv4lab.errors import BenchError

    bad: list[dict[str, Any]] = [{"ttft_clock": "request"}, {"itl_unit": "byte"}, {"stamp_chunks": "all"}]
    bad += [{"top_p": 0.0}, {"temperature": -1.0}]
    for kwargs in bad:
        with pytest.raises(BenchError):
            ClientOptions(**kwargs)
    with pytest.raises(BenchError, match="header"):
        ClientOptions(headers={"Bad Name": "x"})


def test_session_requests_carry_headers_and_the_key() -> None:
    async def go() -> FakeServer:
        server = await fake_server(ServerBehaviour(ttft_s=0.0, itl_s=0.0))
        try:
            opts = ClientOptions(headers={"X-A": "1"}, api_key="k", ttft_clock="connect")
            await run_async(server.url, random_workload(1, 4, 2), LoadSpec(warmup=0), opts, progress=False)
        finally:
            await server.stop()
        return server

    server = asyncio.run(go())
    assert server.headers[0]["x-a"] == "1" and server.headers[0]["authorization"] == "Bearer k"
