"""``bench_main`` (dsv4lab bench) and an end-to-end A/B on two local servers."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab.bench import ResultStore, random_workload, run_ab_async
from dsv4lab.bench.cli import bench_main
from tests.test_bench_fakeserver import FakeServer, ServerBehaviour, fake_server


class ServerThread:
    """A FakeServer on its own loop in a thread, so synchronous code (the CLI) can call it."""

    def __init__(self, behaviour: ServerBehaviour) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: FakeServer = asyncio.run_coroutine_threadsafe(fake_server(behaviour), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def server_thread() -> Iterator[FakeServer]:
    st = ServerThread(ServerBehaviour(ttft_s=0.01, itl_s=0.002))
    yield st.server
    st.close()


def test_json_lines_one_object_per_concurrency(
    server_thread: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", server_thread.url, "--concurrency", "1,4", "--num-prompts", "8", "--input-len", "16"]
    code = bench_main([*argv, "--output-len", "5", "--json", "--run-dir", str(tmp_path)])
    assert code == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["concurrency"] for r in rows] == [1, 4]
    for r in rows:
        assert r["completed"] == 8 and r["failed"] == 0
        assert r["output_throughput"] > 0 and r["request_throughput"] > 0
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert {"mean", "median", "p99"} <= set(r[key])
    assert len(ResultStore(tmp_path).load()) == 2


def test_table_output(server_thread: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["--url", server_thread.url, "--num-prompts", "3", "--output-len", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "out tok/s" in out and out.count("\n") >= 3


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_main(["--url", "http://127.0.0.1:1", "--concurrency", "0"]) == 2
    assert capsys.readouterr().err.startswith("Error: concurrency levels must be >= 1")
    assert bench_main(["--url", "ftp://x"]) == 2


def test_dead_server_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    st = ServerThread(ServerBehaviour())
    url = st.server.url
    st.close()
    assert bench_main(["--url", url, "--num-prompts", "2", "--json"]) == 1
    row = json.loads(capsys.readouterr().out)
    assert row["partial"] is True and row["not_sent"] == 2


def test_ab_on_two_servers_finds_the_faster_one_at_concurrency_1() -> None:
    async def go() -> str:
        a = await fake_server(ServerBehaviour(ttft_s=0.005, itl_s=0.012))
        b = await fake_server(ServerBehaviour(ttft_s=0.005, itl_s=0.006))
        try:
            runs = await run_ab_async(a.url, b.url, random_workload(3, 8, 12, seed=1), [1], repeats=3, progress=False)
        finally:
            await a.stop()
            await b.stop()
        assert [r.label for r in runs.a] == ["A"] * 3 and len(runs.b) == 3
        return runs.compare().at(1).verdict

    assert asyncio.run(go()) == "better"
