"""``dsv4lab bench`` options that need a real SGLang-like server, against the twin (tiny profile, real
processes, real HTTP): no streaming, cache flush, profiling, the shared-prefix workload, and the twin's
``/flush_cache?timeout=`` that bench_serving's ``--flush-cache`` relies on."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from dsv4lab.cli.bench import bench_main
from tests.test_twin_support import free_port, running_twin, twin_env, wait_healthy

TINY = ["--model-path", "dsv4lab/tiny-moe", "--tp-size", "2"]
#: Output tokens of a request that is still decoding a moment after it was sent (time scale 0.05).
LONG = 20000


class Twin:
    def __init__(self, port: int, log: Path) -> None:
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    tmp = tmp_path_factory.mktemp("bench-twin")
    port = free_port()
    log = tmp / "server.log"
    with running_twin([*TINY, "--port", str(port)], twin_env(tmp, DSV4LAB_TWIN_PACE="0.05"), log) as proc:
        wait_healthy(port, proc)
        yield Twin(port, log)


def _rows(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_disable_stream_gives_one_body_and_ttft_equal_to_e2e(
    twin: Twin, backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    argv = ["--port", str(twin.port), "--backend", backend, "--num-prompts", "3", "--input-len", "32"]
    argv += ["--output-len", "6", "--disable-stream", "--json", "--output-file", str(out), "--output-details"]
    assert bench_main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row["completed"] == 3 and row["total_output_tokens"] == 18
    record = json.loads(out.read_text())
    assert record["itls"] == [[], [], []]  # one body: no inter-token gaps
    assert row["ttft_ms"]["mean"] == pytest.approx(row["e2e_ms"]["mean"])
    assert all(len(t.split()) == 6 for t in record["generated_texts"])


def test_flush_cache_after_the_warmup_and_profile_the_measured_requests(
    twin: Twin, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    traces = tmp_path / "traces"
    store = tmp_path / "results"
    argv = ["--port", str(twin.port), "--num-prompts", "2", "--input-len", "16", "--output-len", "8", "--json"]
    argv += ["--flush-cache", "--profile", "--profile-output-dir", str(traces), "--results-dir", str(store)]
    before = twin.log.read_text()
    assert bench_main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row["completed"] == 2
    log = twin.log.read_text()[len(before) :]
    order = [line for line in log.splitlines() if '"POST /' in line or '"DELETE /' in line]
    paths = [re.sub(r"/s\d+$", "", line.split('"', 2)[1].split(" ")[1]) for line in order]
    # warmup (announced to the twin as a session of its own), flush (bench_serving waits up to 60 s for
    # idle), profiler on, the measured session and its two requests, profiler off
    assert paths == [
        "/twin/sessions",
        "/generate",
        "/twin/sessions",
        "/flush_cache?timeout=60",
        "/start_profile",
        "/twin/sessions",
        "/generate",
        "/generate",
        "/twin/sessions",
        "/stop_profile",
    ]
    assert all('" 200' in line or '" 204' in line for line in order)
    assert list(traces.rglob("*.json*")), "the twin wrote no trace"
    stored = (store / "bench_results.jsonl").read_text()
    assert "Trace" in json.loads(stored)["profile"]
    assert json.loads(stored)["provenance"]["load"]["flush_cache"] is True


def test_twins_flush_cache_waits_for_idle_when_asked(twin: Twin) -> None:
    async def go() -> tuple[int, int, float]:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as s:

            async def long_request() -> int:
                body = {"text": "a b c", "sampling_params": {"max_new_tokens": LONG}, "stream": False}
                async with s.post(twin.url + "/generate", json=body) as r:
                    await r.read()
                    return r.status

            running = asyncio.create_task(long_request())
            await asyncio.sleep(0.2)  # the request is decoding (for about 2.5 s)
            async with s.post(twin.url + "/flush_cache") as r:
                refused = r.status  # no timeout: refused at once while busy, as SGLang does
            t0 = time.monotonic()
            async with s.post(twin.url + "/flush_cache", params={"timeout": "30"}) as r:
                waited = r.status
            elapsed = time.monotonic() - t0
            assert await running == 200
            return refused, waited, elapsed

    refused, waited, elapsed = asyncio.run(go())
    assert refused == 400 and waited == 200 and elapsed > 0.05


def test_shared_prefix_workload_from_the_command_line(twin: Twin, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--port", str(twin.port), "--dataset-name", "generated-shared-prefix", "--gsp-num-groups", "2"]
    argv += ["--gsp-prompts-per-group", "3", "--gsp-system-prompt-len", "40", "--gsp-question-len", "8"]
    argv += ["--gsp-output-len", "4", "--concurrency", "3", "--json"]
    assert bench_main(argv) == 0
    (row,) = _rows(capsys.readouterr().out)
    assert row["completed"] == 6 and row["total_output_tokens"] == 24
    assert row["total_input_tokens"] == 6 * 48  # the twin counts one token per word: prefix + question
