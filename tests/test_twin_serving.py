"""The twin's HTTP API with a real aiohttp client: OpenAI and native endpoints (streaming included),
health, info (per-release names), metrics, profiling traces, continuous batching and the GPU view."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.test_twin_support import PY, ROOT, check_log, free_port, running_twin, twin_env, wait_healthy

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

TINY = ["--model-path", "dsv4lab/tiny-moe", "--tp-size", "2"]
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=30)


class Twin:
    def __init__(self, port: int, log: Path, tmp: Path, proc: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.log = log
        self.tmp = tmp
        self.proc = proc
        self.base = f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Twin]:
    tmp = tmp_path_factory.mktemp("serving")
    port = free_port()
    log = tmp / "server.log"
    argv = [*TINY, "--port", str(port), "--enable-metrics", "--decode-log-interval", "5"]
    # Scale 0.2: decode steps stay model-bound (not CPU-bound) at low concurrency, startup takes ~3 s.
    with running_twin(argv, twin_env(tmp, DSV4LAB_TWIN_PACE="0.2"), log) as proc:
        wait_healthy(port, proc)
        yield Twin(port, log, tmp, proc)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s, s.get(url) as r:
        return r.status, await r.text()


async def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s, s.post(url, json=body) as r:
        return r.status, await r.text()


async def _stream(url: str, body: dict[str, Any]) -> list[Any]:
    out: list[Any] = []
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s, s.post(url, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        async for line in r.content:
            if line.startswith(b"data: "):
                data = line[6:].strip()
                out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


def test_completions_stream_with_usage(twin: Twin) -> None:
    body = {
        "model": "x",
        "prompt": "Hello there, twin",
        "max_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = run(_stream(twin.base + "/v1/completions", body))
    assert chunks[-1] == "[DONE]"
    usage = chunks[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["prompt_tokens"] == 4  # Hello, there, ",", twin
    text_chunks = chunks[:-2]
    assert all(c["object"] == "text_completion" for c in text_chunks)
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in text_chunks).strip()


def test_completions_and_chat_non_stream(twin: Twin) -> None:
    status, text = run(_post(twin.base + "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4}))
    data = json.loads(text)
    assert status == 200 and data["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": None,
    }
    msgs = [{"role": "user", "content": "hi"}]
    status, text = run(_post(twin.base + "/v1/chat/completions", {"messages": msgs, "max_tokens": 3}))
    data = json.loads(text)
    assert status == 200 and data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant" and data["usage"]["completion_tokens"] == 3


def test_chat_stream(twin: Twin) -> None:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = run(_stream(twin.base + "/v1/chat/completions", body))
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["usage"]["completion_tokens"] == 5
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-2])
    assert len(content.split()) == 5


def test_generate_native(twin: Twin) -> None:
    status, text = run(_post(twin.base + "/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 6}}))
    meta = json.loads(text)["meta_info"]
    assert status == 200 and meta["completion_tokens"] == 6 and meta["prompt_tokens"] == 3
    chunks = run(
        _stream(
            twin.base + "/generate", {"input_ids": [5] * 10, "sampling_params": {"max_new_tokens": 4}, "stream": True}
        )
    )
    assert chunks[-1] == "[DONE]"
    counts = [c["meta_info"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == sorted(counts) and counts[-1] == 4
    assert chunks[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_too_long_request_is_rejected(twin: Twin) -> None:
    status, text = run(_post(twin.base + "/v1/completions", {"prompt": [1] * 32768, "max_tokens": 10}))
    assert status == 400 and "maximum context length" in json.loads(text)["message"]


def test_info_endpoints_and_health(twin: Twin) -> None:
    assert run(_get(twin.base + "/health"))[0] == 200
    assert run(_get(twin.base + "/health_generate"))[0] == 200
    status, text = run(_get(twin.base + "/server_info"))
    info = json.loads(text)
    assert status == 200 and info["version"] == "0.5.23"
    assert info["twin"]["hardware"] == "tiny" and info["twin"]["pace"] == 0.2
    state = info["internal_states"][0]
    assert "last_gen_throughput" in state and state["memory_usage"]["token_capacity"] == info["max_total_num_tokens"]
    assert json.loads(run(_get(twin.base + "/model_info"))[1])["model_path"] == "dsv4lab/tiny-moe"
    assert run(_get(twin.base + "/get_server_info"))[0] == 200  # deprecated alias, logs a warning
    models = json.loads(run(_get(twin.base + "/v1/models"))[1])
    assert models["data"][0]["id"] == "dsv4lab/tiny-moe" and models["data"][0]["owned_by"] == "sglang"
    assert run(_get(twin.base + "/flush_cache"))[0] == 200


def test_metrics(twin: Twin) -> None:
    status, text = run(_get(twin.base + "/metrics"))
    assert status == 200
    for name in (
        "sglang:num_running_reqs",
        "sglang:generation_tokens_total",
        "sglang:token_usage",
        "sglang:time_to_first_token_seconds_count",
    ):
        assert name in text


def test_profile_trace(twin: Twin) -> None:
    out = twin.tmp / "prof"
    assert run(_post(twin.base + "/start_profile", {"output_dir": str(out)}))[0] == 200

    async def load() -> None:
        body = {"prompt": "x", "max_tokens": 20}
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            await asyncio.gather(*(s.post(twin.base + "/v1/completions", json=body) for _ in range(8)))

    run(load())
    assert run(_post(twin.base + "/stop_profile", {}))[0] == 200
    traces = list(out.glob("*-TP-0.trace.json"))
    assert len(traces) == 1
    events = json.loads(traces[0].read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels and all(e["dur"] >= 0 for e in kernels)
    assert any("sparse_mla" in e["name"] or "mla" in e["name"] for e in kernels)


def test_throughput_rises_with_concurrency_and_saturates(twin: Twin) -> None:
    async def rate(c: int) -> float:
        body = {"input_ids": [1] * 64, "sampling_params": {"max_new_tokens": 40}}
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            t = time.perf_counter()
            rs = await asyncio.gather(*(s.post(twin.base + "/generate", json=body) for _ in range(c)))
            for r in rs:
                await r.read()
            return 40 * c / (time.perf_counter() - t)

    def best(c: int, tries: int = 3) -> float:
        # The fastest of a few: a stall of this busy host only ever slows a measurement (as timeit takes the
        # minimum). 64 requests take about 0.2 s here, of which HTTP is a good part; one stalled 64 read
        # 11,090 tok/s against 13,163 at 8 (CI run 31).
        return max(float(run(rate(c))) for _ in range(tries))

    r1, r8, r64 = best(1), best(8), best(64)
    assert r8 > 3 * r1  # batching: one step serves every running request
    assert r64 > r8
    assert r64 / r8 < 0.9 * 64 / 8  # ... but not for free: per-step cost grows with the batch


def test_log_lines_parse(twin: Twin) -> None:
    log = twin.log.read_text(errors="replace")
    assert "The server is fired up and ready to roll!" in log
    assert "Decode batch, #running-req:" in log and "Prefill batch, #new-seq:" in log
    assert '"GET /health HTTP/1.1" 200 OK' in log
    assert check_log(log) == []


def test_nvidia_smi_stand_in(twin: Twin, tmp_path: Path) -> None:
    from dsv4lab.twin.smi import write_smi_shim

    shim = write_smi_shim(tmp_path / "bin", python=PY)
    env = twin_env(twin.tmp)
    q = ["--query-gpu=index,name,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits"]
    out = subprocess.run([str(shim), *q], env=env, capture_output=True, text=True, check=True, timeout=30).stdout
    rows = [r.split(", ") for r in out.strip().splitlines()]
    assert [r[0] for r in rows] == ["0", "1"] and rows[0][1] == "dsv4lab tiny GPU"
    assert int(rows[0][2]) > 10_000 and rows[0][3] == "24576"  # weights + KV + graphs in use
    head = subprocess.run(
        [PY, "-m", "dsv4lab.twin.smi", "--query-gpu=index,memory.used", "--format=csv"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        cwd=ROOT,
    ).stdout
    assert head.splitlines()[0] == "index, memory.used [MiB]" and head.splitlines()[1].endswith(" MiB")
    idle_env = twin_env(tmp_path, DSV4LAB_TWIN_HARDWARE="rtx-pro-6000-x8")
    idle = subprocess.run([str(shim), *q], env=idle_env, capture_output=True, text=True, check=True, timeout=30)
    idle_rows = idle.stdout.strip().splitlines()
    assert len(idle_rows) == 8 and idle_rows[1].split(", ")[2] == str(round(0.35 * 1024))


@pytest.mark.parametrize("version", ["0.5.4", "0.4.10"])
def test_old_release_names_and_formats(tmp_path: Path, version: str) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    env = twin_env(tmp_path, DSV4LAB_TWIN_SGLANG_VERSION=version)
    argv = [*TINY, "--port", str(port), "--cuda-graph-max-bs", "8", "--decode-log-interval", "2"]
    with running_twin(argv, env, log) as proc:
        wait_healthy(port, proc)
        base = f"http://127.0.0.1:{port}"
        assert run(_get(base + "/get_server_info"))[0] == 200
        assert run(_get(base + "/server_info"))[0] == 404
        run(_post(base + "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 5}}))
        text = log.read_text(errors="replace")
    assert "Capture cuda graph end. Time elapsed:" in text
    assert "Init torch distributed ends." in text
    assert ("Decode batch. #running-req" if version == "0.4.10" else "Decode batch, #running-req") in text
    assert check_log(text) == []


def test_second_node_serves_dummy_health(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "server.log"
    argv = [*TINY, "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "127.0.0.1:5999", "--port", str(port)]
    with running_twin(argv, twin_env(tmp_path), log) as proc:
        wait_healthy(port, proc)
        assert run(_get(f"http://127.0.0.1:{port}/v1/models"))[0] == 404  # only node 0 serves the API
        text = log.read_text(errors="replace")
    assert "[" in text and " TP1] Load weight begin" in text and " TP0]" not in text
    assert check_log(text) == []


def test_a_stalled_twin_catches_up_its_modelled_clock(twin: Twin) -> None:
    """A host that does not schedule the twin for a while (seen for 0.1-0.7 s beside a busy real engine on 2
    cores) must not cost modelled GPU time: at time scale 0.02 every such stall would read as 5-35 s more."""
    body = {"input_ids": [1] * 16, "sampling_params": {"max_new_tokens": 2500}}

    async def e2e(stall_at_s: float | None = None, stall_s: float = 0.0) -> float:
        async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as s:
            t = time.perf_counter()
            request = asyncio.ensure_future(s.post(twin.base + "/generate", json=body))
            if stall_at_s is not None:
                await asyncio.sleep(stall_at_s)
                twin.proc.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.sleep(stall_s)
                finally:
                    twin.proc.send_signal(signal.SIGCONT)
            r = await request
            assert json.loads(await r.text())["meta_info"]["completion_tokens"] == 2500
            return time.perf_counter() - t

    modelled = min(run(e2e()) for _ in range(2))
    assert modelled > 1.0  # long enough for a stall in its middle
    stalled = run(e2e(stall_at_s=0.3 * modelled, stall_s=0.4 * modelled))
    # Without catching up it would take 40 % longer; with it, the stall is made up before the end.
    assert stalled < 1.15 * modelled, (stalled, modelled)
    _status, text = run(_get(twin.base + "/server_info"))
    assert json.loads(text)["twin"]["behind_s_max"] >= 0.3 * modelled  # the stall is on record
