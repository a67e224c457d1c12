"""``bench_main`` (dsv4lab bench) against a real streaming server: options, defects of the issue
"bench-parity" (no-cap request rate, ShareGPT output length, --run-dir), bench_serving's names and output
format, exit statuses; and an end-to-end A/B on two local servers."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab.bench import ResultStore, parse_stdout, random_workload, run_ab_async
from dsv4lab.cli.bench import bench_main
from dsv4lab.cli.main import main as cli_main
from tests.test_bench_fakeserver import FakeServer, ServerBehaviour, fake_server

#: The keys of SGLang 0.5.23's bench_serving --output-file object (its `result` dict), and --output-details.
BENCH_SERVING_KEYS = {
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
    "random_input_len", "random_output_len", "random_range_ratio", "server_info", "duration", "completed",
    "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens",
    "total_output_tokens_retokenized", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "concurrency", "accept_length", "max_output_tokens_per_s", "max_concurrent_requests",
    *(f"{stat}_{metric}_ms" for stat in ("mean", "median", "std", "p90", "p95", "p99")
      for metric in ("e2e_latency", "ttft", "tpot", "itl")),
}  # fmt: skip
DETAIL_KEYS = {"input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"}


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
    code = bench_main([*argv, "--output-len", "5", "--json", "--results-dir", str(tmp_path)])
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
    err = capsys.readouterr().err
    assert err.startswith("Error: --concurrency='0' is not valid") and "inf" in err and err.count("\n") == 1
    assert bench_main(["--url", "ftp://x"]) == 2
    assert "--url='ftp://x'" in capsys.readouterr().err
    assert bench_main([]) == 2
    assert "--run-dir DIR" in capsys.readouterr().err  # how to name the server


def test_run_dir_is_the_servers_run_dir_as_in_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # --run-dir used to be a results folder; it now means what it means in `dsv4lab launch`.
    assert bench_main(["--url", "http://127.0.0.1:1", "--run-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--run-dir" in err and "not with --url" in err
    # A directory with no launch in it is the launch error's status (6), on one line.
    assert bench_main(["--run-dir", str(tmp_path), "--num-prompts", "1"]) == 6
    err = capsys.readouterr().err
    assert err.startswith("Error: no dsv4lab launch in") and err.count("\n") == 1


def test_a_benchmark_that_cannot_run_exits_with_the_bench_status(
    server_thread: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    # The stand-in has no /flush_cache: a flush that was asked for and refused is a BenchError (7).
    argv = ["--url", server_thread.url, "--num-prompts", "2", "--output-len", "2", "--flush-cache", "--json"]
    assert bench_main(argv) == 7
    assert capsys.readouterr().err.startswith("Error: the server did not flush its cache (flush_cache: HTTP 404")
    # The top-level command gives the same status.
    assert cli_main(["bench", *argv]) == 7


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


@pytest.fixture
def slow_server() -> Iterator[FakeServer]:
    """Requests take about 0.3 s: long enough to see how many are in flight at once."""
    st = ServerThread(ServerBehaviour(ttft_s=0.3, itl_s=0.0))
    yield st.server
    st.close()


@pytest.mark.parametrize("cap", [[], ["--concurrency", "inf"], ["--max-concurrency", "none"]])
def test_request_rate_without_a_cap_lets_requests_overlap(
    slow_server: FakeServer, cap: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # The defect: --request-rate 100 without --concurrency allowed one request in flight (1.2 s mean queue).
    argv = ["--url", slow_server.url, "--request-rate", "100", "--num-prompts", "8", "--output-len", "2"]
    assert bench_main([*argv, "--warmup", "0", "--json", *cap]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["concurrency"] is None
    assert slow_server.max_in_flight >= 4  # 8 requests due within ~0.1 s, each lasting 0.3 s
    assert row["queue_ms"]["p99"] < 200  # nobody waited for a slot


def test_request_rate_with_a_cap_keeps_it(slow_server: FakeServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", slow_server.url, "--request-rate", "100", "--concurrency", "1", "--num-prompts", "3"]
    assert bench_main([*argv, "--output-len", "2", "--warmup", "0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["concurrency"] == 1 and slow_server.max_in_flight == 1 and row["queue_ms"]["p99"] > 200


def _sharegpt(path: Path, n: int = 5) -> Path:
    # Long replies: ~880 estimated tokens each, the output length the defect silently used.
    conversations = [
        {"conversations": [{"from": "human", "value": f"question {i} " * 20}, {"from": "gpt", "value": "x" * 3520}]}
        for i in range(n)
    ]
    path.write_text(json.dumps(conversations))
    return path


@pytest.mark.parametrize("flag", ["--output-len", "--sharegpt-output-len", "--random-output-len"])
def test_dataset_honours_the_output_length(
    server_thread: FakeServer, tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _sharegpt(tmp_path / "sharegpt.json")
    argv = ["--url", server_thread.url, "--dataset", str(data), "--num-prompts", "3", flag, "64", "--json"]
    assert bench_main(argv) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["total_output_tokens"] == 3 * 64
    asked = [b["sampling_params"]["max_new_tokens"] for b in server_thread.bodies]
    assert asked == [64] * len(asked) and len(asked) == 4  # warmup + 3


def test_dataset_options_that_do_not_apply_are_refused(
    server_thread: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(_sharegpt(tmp_path / "sharegpt.json"))
    url = ["--url", server_thread.url]
    cases = [
        (["--dataset", data, "--input-len", "512"], "--input-len"),
        (["--dataset", data, "--output-len", "64", "--sharegpt-output-len", "32"], "--output-len"),
        (["--sharegpt-context-len", "2048"], "--sharegpt-context-len"),
        (["--gsp-num-groups", "2"], "--gsp-num-groups"),
        (["--dataset-name", "sharegpt"], "--dataset-name"),
        (["--dataset-name", "generated-shared-prefix", "--num-prompts", "4"], "--num-prompts"),
        (["--backend", "sglang-oai", "--api", "generate"], "--backend"),
        (["--output-details"], "--output-details"),
        (["--header", "no-equals-sign"], "--header"),
        (["--extra-request-body", "[1, 2]"], "--extra-request-body"),
        (["--goodput", "latency:5"], "--goodput"),
    ]
    for argv, option in cases:
        assert bench_main([*url, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"Error: {option}=") and err.count("\n") == 1, (argv, err)
    assert server_thread.bodies == []  # nothing was sent


def test_sharegpt_context_len_drops_long_requests(tmp_path: Path) -> None:
    from dsv4lab.bench import sharegpt_workload

    data = _sharegpt(tmp_path / "sharegpt.json")
    assert len(sharegpt_workload(data, 5)) == 5
    with pytest.raises(Exception, match="no usable conversations"):
        sharegpt_workload(data, 5, context_len=500)  # every prompt + ~880 output tokens exceeds 500
    assert len(sharegpt_workload(data, 5, output_len=64, context_len=500)) == 5


def test_default_api_is_generate_like_bench_servings_sglang_backend(
    server_thread: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--url", server_thread.url, "--num-prompts", "2", "--output-len", "3", "--json"]
    assert bench_main(base) == 0
    assert set(server_thread.paths) == {"/generate"}
    assert bench_main([*base, "--backend", "sglang-oai"]) == 0
    assert server_thread.paths[-1] == "/v1/completions" and server_thread.bodies[-1]["model"] == "fake-model"
    assert bench_main([*base, "--backend", "vllm-chat"]) == 0
    assert server_thread.paths[-1] == "/v1/chat/completions"
    capsys.readouterr()


def test_request_options_reach_every_request_and_secrets_stay_out_of_results(
    server_thread: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bs.jsonl"
    argv = ["--url", server_thread.url, "--num-prompts", "2", "--output-len", "3", "--disable-ignore-eos"]
    argv += ["--temperature", "0.5", "--top-p", "0.9", "--extra-request-body", '{"top_k": 5}']
    argv += ["--header", "X-Team=infra", "X-Run=7", "--api-key", "sekret-key", "--json"]
    assert bench_main([*argv, "--output-file", str(out), "--results-dir", str(tmp_path)]) == 0
    for body, headers in zip(server_thread.bodies, server_thread.headers, strict=True):
        assert body["sampling_params"] == {"max_new_tokens": 3, "temperature": 0.5, "top_p": 0.9}
        assert body["top_k"] == 5 and body["stream"] is True
        assert headers["x-team"] == "infra" and headers["x-run"] == "7"
        assert headers["authorization"] == "Bearer sekret-key"
    stored = out.read_text() + (tmp_path / "bench_results.jsonl").read_text() + capsys.readouterr().out
    assert "sekret-key" not in stored and "infra" not in stored  # header names are kept, values are not
    assert '"header_names":["X-Run","X-Team"]' in (tmp_path / "bench_results.jsonl").read_text()


def test_output_file_is_bench_servings_jsonl_with_dsv4labs_own_beside(
    server_thread: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "results.jsonl"
    argv = ["--url", server_thread.url, "--num-prompts", "4", "--output-len", "5", "--concurrency", "2"]
    assert bench_main([*argv, "--output-file", str(out), "--output-details", "--tag", "t1", "--json"]) == 0
    assert bench_main([*argv, "--output-file", str(out), "--json"]) == 0  # appended, as bench_serving does
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert set(first) >= BENCH_SERVING_KEYS | DETAIL_KEYS and set(second) >= BENCH_SERVING_KEYS
    assert not DETAIL_KEYS & set(second)
    assert first["tag"] == "t1" and first["backend"] == "sglang" and first["dataset_name"] == "random"
    assert first["request_rate"] == math.inf and first["max_concurrency"] == 2
    assert first["completed"] == 4 and first["total_output_tokens"] == 20
    assert first["random_input_len"] == 1024 and first["random_output_len"] == 5
    assert first["mean_ttft_ms"] == pytest.approx(rows[0]["ttft_ms"]["mean"])
    assert first["output_throughput"] == pytest.approx(rows[0]["output_throughput"])
    assert first["total_output_tokens_retokenized"] is None  # no tokenizer here: said, not invented
    assert len(first["ttfts"]) == 4 and all(len(g) == 4 for g in first["itls"])  # 5 tokens: 4 gaps
    assert all(t.count("t") == 5 for t in first["generated_texts"]) and first["errors"] == [""] * 4
    own = first["dsv4lab"]
    assert own["ttft_clock"] == "send" and own["itl_unit"] == "chunk" and own["id"] == rows[0]["id"]
    assert "open connection" in own["definitions"]["clock"]
    assert first["max_concurrent_requests"] >= 1 and own["peak_concurrent"] == 2


def test_sglang_format_prints_the_block_bench_serving_users_read(
    server_thread: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--url", server_thread.url, "--num-prompts", "3", "--output-len", "4", "--concurrency", "3"]
    assert bench_main([*argv, "--format", "sglang"]) == 0
    block = parse_stdout(capsys.readouterr().out)
    assert block["Backend"] == "sglang" and block["Max request concurrency"] == 3.0
    assert block["Successful requests"] == 3.0 and block["Total generated tokens"] == 12.0
    assert isinstance(block["Median TTFT (ms)"], float) and block["Median TTFT (ms)"] > 0 and "Max ITL (ms)" in block
    assert bench_main([*argv, "--format", "sglang", "--json"]) == 2
