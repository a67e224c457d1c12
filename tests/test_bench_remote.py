"""The remote backend: SGLang's printed block and JSONL (samples written here in the documented format),
and a full run_remote through a real host with a stand-in ``sglang`` package on its PYTHONPATH."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.bench import ClientOptions, LoadSpec, RemoteBenchError, parse_jsonl, parse_stdout, random_workload
from dsv4lab.bench.remote import build_argv, remote_result, run_remote
from dsv4lab.bench.results import Provenance
from dsv4lab.bench.workload import shared_prefix_workload
from dsv4lab.hosts import Host, LocalHost

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow


def line(label: str, value: object) -> str:
    return f"{label:<40} {value!s:<10}"


def header(title: str) -> str:
    return title.center(50, "-")


STDOUT_0523 = "\n".join(
    [
        "Namespace(backend='sglang-oai', base_url='http://127.0.0.1:30000', num_prompts=64)",
        "#Input tokens: 65536",
        "#Output tokens: 8192",
        "Starting warmup with 1 sequences...",
        "Warmup completed with 1 sequences. Starting main benchmark run...",
        "",
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        line("Backend:", "sglang-oai"),
        line("Traffic request rate:", "inf"),
        line("Max request concurrency:", 16),
        line("Successful requests:", 63),
        line("Benchmark duration (s):", "412.87"),
        line("Total input tokens:", 64512),
        line("Total input text tokens:", 64512),
        line("Total generated tokens:", 8064),
        line("Total generated tokens (retokenized):", 8059),
        line("Request throughput (req/s):", "0.15"),
        line("Input token throughput (tok/s):", "156.25"),
        line("Output token throughput (tok/s):", "19.53"),
        line("Peak output token throughput (tok/s):", "32.00"),
        line("Peak concurrent requests:", 16),
        line("Total token throughput (tok/s):", "175.78"),
        line("Concurrency:", "15.71"),
        line("Accept length:", "1.62"),
        header("End-to-End Latency"),
        line("Mean E2E Latency (ms):", "101337.52"),
        line("Median E2E Latency (ms):", "101250.10"),
        line("P90 E2E Latency (ms):", "104871.33"),
        line("P95 E2E Latency (ms):", "105120.88"),
        line("P99 E2E Latency (ms):", "105342.07"),
        header("Time to First Token"),
        line("Mean TTFT (ms):", "6210.43"),
        line("Median TTFT (ms):", "5904.12"),
        line("P90 TTFT (ms):", "9120.55"),
        line("P95 TTFT (ms):", "9876.01"),
        line("P99 TTFT (ms):", "10402.77"),
        header("Time per Output Token (excl. 1st token)"),
        line("Mean TPOT (ms):", "749.05"),
        line("Median TPOT (ms):", "745.80"),
        line("P90 TPOT (ms):", "781.20"),
        line("P95 TPOT (ms):", "790.66"),
        line("P99 TPOT (ms):", "801.02"),
        header("Inter-Token Latency"),
        line("Mean ITL (ms):", "749.05"),
        line("Median ITL (ms):", "701.22"),
        line("P90 ITL (ms):", "1010.47"),
        line("P95 ITL (ms):", "1203.88"),
        line("P99 ITL (ms):", "2210.61"),
        line("Max ITL (ms):", "6003.19"),
        "=" * 50,
        "",
    ]
)

STDOUT_054 = "\n".join(
    [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        line("Backend:", "sglang"),
        line("Traffic request rate:", "inf"),
        line("Max request concurrency:", "not set"),
        line("Successful requests:", 10),
        line("Benchmark duration (s):", "12.01"),
        line("Total input tokens:", 10240),
        line("Total generated tokens:", 1280),
        line("Output token throughput (tok/s):", "106.58"),
        header("End-to-End Latency"),
        line("Mean E2E Latency (ms):", "6002.11"),
        line("Median E2E Latency (ms):", "6001.50"),
        header("Time to First Token"),
        line("Mean TTFT (ms):", "310.20"),
        line("Median TTFT (ms):", "300.00"),
        line("P99 TTFT (ms):", "580.90"),
        header("Inter-Token Latency"),
        line("Mean ITL (ms):", "44.80"),
        line("Median ITL (ms):", "44.10"),
        line("P95 ITL (ms):", "49.00"),
        line("P99 ITL (ms):", "61.30"),
        line("Max ITL (ms):", "120.40"),
        "=" * 50,
    ]
)


def sample_jsonl_obj(n: int = 4, failed: int = 1) -> dict[str, Any]:
    ok = n - failed
    ttfts = [0.5 + 0.1 * i for i in range(ok)] + [0.0] * failed
    itls = [[0.05, 0.05, 0.1] for _ in range(ok)] + [[] for _ in range(failed)]
    return {
        "tag": None,
        "backend": "sglang-oai",
        "dataset_name": "random-ids",
        "request_rate": "inf",
        "max_concurrency": 4,
        "random_input_len": 128,
        "random_output_len": 4,
        "random_range_ratio": 1.0,
        "server_info": {"version": "0.5.23", "internal_states": [{"avg_spec_accept_length": 1.62}]},
        "duration": 2.0,
        "completed": ok,
        "total_input_tokens": 128 * ok,
        "total_input_text_tokens": 128 * ok,
        "total_input_vision_tokens": 0,
        "total_output_tokens": 4 * ok,
        "total_output_tokens_retokenized": 4 * ok,
        "request_throughput": ok / 2.0,
        "input_throughput": 64.0 * ok,
        "output_throughput": 2.0 * ok,
        "total_throughput": 66.0 * ok,
        "mean_e2e_latency_ms": 800.0,
        "median_e2e_latency_ms": 800.0,
        "std_e2e_latency_ms": 81.6,
        "p90_e2e_latency_ms": 880.0,
        "p95_e2e_latency_ms": 890.0,
        "p99_e2e_latency_ms": 898.0,
        "mean_ttft_ms": 600.0,
        "median_ttft_ms": 600.0,
        "std_ttft_ms": 81.6,
        "p90_ttft_ms": 680.0,
        "p95_ttft_ms": 690.0,
        "p99_ttft_ms": 698.0,
        "mean_tpot_ms": 66.7,
        "median_tpot_ms": 66.7,
        "std_tpot_ms": 0.0,
        "p90_tpot_ms": 66.7,
        "p95_tpot_ms": 66.7,
        "p99_tpot_ms": 66.7,
        "mean_itl_ms": 66.7,
        "median_itl_ms": 50.0,
        "std_itl_ms": 23.6,
        "p90_itl_ms": 100.0,
        "p95_itl_ms": 100.0,
        "p99_itl_ms": 100.0,
        "concurrency": 1.2,
        "accept_length": 1.62,
        "max_output_tokens_per_s": 8.0,
        "max_concurrent_requests": 3,
        "input_lens": [128] * n,
        "output_lens": [4] * ok + [0] * failed,
        "ttfts": ttfts,
        "itls": itls,
        "generated_texts": ["a b c d"] * ok + [""] * failed,
        "errors": [""] * ok + ["Bad Request: prompt too long"] * failed,
    }


def prov() -> Provenance:
    return Provenance(url="http://127.0.0.1:30000", backend="sglang.benchmark.serving", api="completions")


def test_parse_stdout_0523_block() -> None:
    block = parse_stdout(STDOUT_0523)
    assert block["Backend"] == "sglang-oai"
    assert block["Traffic request rate"] == math.inf
    assert block["Successful requests"] == 63.0
    assert block["Output token throughput (tok/s)"] == pytest.approx(19.53)
    assert block["Peak output token throughput (tok/s)"] == pytest.approx(32.0)
    assert block["Median TPOT (ms)"] == pytest.approx(745.80)
    assert block["Max ITL (ms)"] == pytest.approx(6003.19)
    assert "#Input tokens" not in block  # lines outside the block are not part of it


def test_parse_stdout_054_block_without_tpot_lines() -> None:
    block = parse_stdout("noise\n" + STDOUT_054 + "\nmore noise: 1\n")
    assert block["Max request concurrency"] == "not set"
    assert block["P99 TTFT (ms)"] == pytest.approx(580.90)
    assert "Mean TPOT (ms)" not in block
    with pytest.raises(RemoteBenchError):
        parse_stdout("no block here")


def test_parse_jsonl_takes_the_last_object() -> None:
    first = json.dumps({"completed": 1})
    second = json.dumps(sample_jsonl_obj())
    assert parse_jsonl(f"{first}\n{second}\n")["completed"] == 3
    assert parse_jsonl(f"{first}\n{{torn")["completed"] == 1
    with pytest.raises(RemoteBenchError):
        parse_jsonl("")


def test_remote_result_maps_summary_and_details() -> None:
    r = remote_result(sample_jsonl_obj(), total=4, provenance=prov(), concurrency=4, request_rate=math.inf)
    s = r.summary
    assert (s.total, s.completed, s.failed) == (4, 3, 1)
    assert s.output_throughput == pytest.approx(6.0)
    assert s.ttft_ms.median == 600.0 and s.ttft_ms.p90 == 680.0 and s.ttft_ms.count == 3
    assert s.e2e_ms.p99 == 898.0
    assert s.itl_ms.count == 9 and s.itl_ms.p95 == 100.0
    assert s.peak_output_throughput == 8.0 and s.peak_concurrent == 3
    assert s.accept_length == pytest.approx(1.62)
    assert math.isnan(s.queue_ms.mean)  # SGLang's client does not measure it
    frame = r.requests
    assert list(frame["status"]) == ["ok", "ok", "ok", "failed"]
    assert frame["ttft_ms"].iloc[0] == pytest.approx(500.0)
    assert frame["e2e_ms"].iloc[0] == pytest.approx(700.0)  # TTFT + sum of ITLs
    assert frame["tpot_ms"].iloc[0] == pytest.approx(200.0 / 3)
    assert frame["error"].iloc[3] == "Bad Request: prompt too long"
    assert r.row()["ttft_ms"]["median"] == 600.0


def test_build_argv_per_workload() -> None:
    wl = random_workload(64, 1024, 128, seed=5, range_ratio=0.5)
    argv = build_argv(
        python=["python3"],
        module="sglang.benchmark.serving",
        base_url="http://127.0.0.1:30000",
        workload=wl,
        load=LoadSpec(concurrency=16, warmup=2),
        options=ClientOptions(api="chat", model="m"),
        output_file="/tmp/o.jsonl",
    )
    joined = " ".join(argv)
    assert argv[:3] == ["python3", "-m", "sglang.benchmark.serving"]
    for part in (
        "--backend sglang-oai-chat",
        "--dataset-name random-ids",
        "--num-prompts 64",
        "--random-input-len 1024",
        "--random-output-len 128",
        "--random-range-ratio 0.5",
        "--seed 5",
        "--request-rate inf",
        "--max-concurrency 16",
        "--warmup-requests 2",
        "--model m",
        "--output-file /tmp/o.jsonl --output-details",
    ):
        assert part in joined
    gsp = build_argv(
        python=["python3"],
        module="sglang.bench_serving",
        base_url="http://x:1",
        workload=shared_prefix_workload(2, 3, 100, 10, 5),
        load=LoadSpec(concurrency=None, request_rate=4.0),
        options=ClientOptions(api="generate", ignore_eos=False),
        output_file="o",
    )
    assert "--gsp-system-prompt-len 100" in " ".join(gsp) and "--max-concurrency" not in gsp
    assert "--disable-ignore-eos" in gsp and "--backend sglang " in " ".join(gsp) + " "
    with pytest.raises(RemoteBenchError, match="Poisson"):
        build_argv(
            python=["p"],
            module="m",
            base_url="u",
            workload=wl,
            load=LoadSpec(request_rate=1.0, burstiness=0.5),
            options=ClientOptions(),
            output_file="o",
        )


FAKE_SGLANG = """
import json, sys

argv = sys.argv[1:]
out = argv[argv.index("--output-file") + 1]
with open(out + ".argv", "w") as f:
    json.dump([sys.argv[0]] + argv, f)
if "--num-prompts" in argv and argv[argv.index("--num-prompts") + 1] == "13":
    print("Traceback (most recent call last):", file=sys.stderr)
    print("RuntimeError: server not ready", file=sys.stderr)
    sys.exit(1)
with open(out, "a") as f:
    f.write(json.dumps({"completed": 0}) + "\\n")
    f.write(json.dumps(OBJ) + "\\n")
print(STDOUT)
"""


def fake_sglang(root: Path) -> list[str]:
    for module in ("sglang.bench_serving", "sglang.benchmark.serving"):
        path = root.joinpath(*module.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in (path.parent, root / "sglang"):
            (parent / "__init__.py").touch()
        code = f"OBJ = {sample_jsonl_obj()!r}\nSTDOUT = {STDOUT_0523!r}\n" + textwrap.dedent(FAKE_SGLANG)
        path.write_text(code)
    return ["env", f"PYTHONPATH={root}", sys.executable]


@pytest.mark.parametrize(
    ("version", "module"), [("0.5.23", "sglang.benchmark.serving"), ("0.5.4", "sglang.bench_serving")]
)
def test_run_remote_through_a_host(tmp_path: Path, version: str, module: str, any_host: Host) -> None:
    # any_host: this machine, and the same machine through the real sshd (SSH transport, SFTP fetch).
    python = fake_sglang(tmp_path / "site")
    wl = random_workload(4, 128, 4, seed=9)
    r = run_remote(
        any_host,
        "http://127.0.0.1:30000",
        wl,
        LoadSpec(concurrency=4),
        work_dir=str(tmp_path / "work"),
        sglang_version=version,
        python=python,
        timeout_s=60,
    )
    assert r.provenance.backend == module
    assert r.provenance.engine == "sglang" and r.provenance.engine_version == "0.5.23"
    assert r.summary.completed == 3 and r.summary.failed == 1 and r.concurrency == 4
    assert r.summary.itl_ms.max == pytest.approx(6003.19)  # from the printed block: the JSONL has no max
    (argv_file,) = (tmp_path / "work").glob("*.argv")
    argv = json.loads(argv_file.read_text())
    assert argv[0].endswith(module.replace(".", "/") + ".py")
    assert "--seed" in argv and argv[argv.index("--seed") + 1] == "9"


def test_run_remote_failure_quotes_the_output(tmp_path: Path) -> None:
    python = fake_sglang(tmp_path / "site")
    with pytest.raises(RemoteBenchError, match="server not ready"):
        run_remote(
            LocalHost(),
            "http://127.0.0.1:30000",
            random_workload(13, 8, 4),
            work_dir=str(tmp_path / "work"),
            python=python,
            timeout_s=60,
        )


def test_build_argv_carries_the_new_request_and_load_options() -> None:
    wl = random_workload(8, 64, 8, seed=1)
    opts = ClientOptions(api="generate", stream=False, temperature=0.7, top_p=0.9, headers={"X-Team": "infra"})
    argv = build_argv(
        python=["python3"],
        module="sglang.benchmark.serving",
        base_url="http://127.0.0.1:30000",
        workload=wl,
        load=LoadSpec(concurrency=None, flush_cache=True),
        options=opts,
        output_file="o.jsonl",
    )
    joined = " ".join(argv)
    for part in ("--disable-stream", "--temperature 0.7", "--top-p 0.9", "--header X-Team=infra", "--flush-cache"):
        assert part in joined
    assert "--max-concurrency" not in argv  # no cap
    with pytest.raises(RemoteBenchError, match=r"sglang.bench_serving .*--temperature"):
        build_argv(
            python=["p"],
            module="sglang.bench_serving",
            base_url="u",
            workload=wl,
            load=LoadSpec(),
            options=opts,
            output_file="o",
        )
    with pytest.raises(RemoteBenchError, match="OPENAI_API_KEY"):
        build_argv(
            python=["p"],
            module="sglang.benchmark.serving",
            base_url="u",
            workload=wl,
            load=LoadSpec(),
            options=ClientOptions(api_key="k"),
            output_file="o",
        )


def test_sharegpt_caps_reach_the_remote_command(tmp_path: Path) -> None:
    from dsv4lab.bench.workload import sharegpt_workload

    data = tmp_path / "s.json"
    conv = [{"from": "human", "value": "hello there " * 10}, {"from": "gpt", "value": "x" * 400}]
    data.write_text(json.dumps([{"conversations": conv}] * 4))
    wl = sharegpt_workload(data, 4, output_len=32, context_len=4096)
    argv = build_argv(
        python=["p"],
        module="sglang.benchmark.serving",
        base_url="u",
        workload=wl,
        load=LoadSpec(),
        options=ClientOptions(),
        output_file="o",
        dataset_path="/remote/s.json",
    )
    joined = " ".join(argv)
    assert "--sharegpt-output-len 32" in joined and "--sharegpt-context-len 4096" in joined


def test_remote_results_state_bench_servings_definitions(tmp_path: Path) -> None:
    python = fake_sglang(tmp_path / "site")
    r = run_remote(
        LocalHost(),
        "http://127.0.0.1:30000",
        random_workload(4, 128, 4, seed=9),
        LoadSpec(concurrency=4),
        ClientOptions(api="generate"),
        work_dir=str(tmp_path / "work"),
        python=python,
        timeout_s=60,
    )
    assert r.ttft_clock == "connect" and r.itl_unit == "token"
    assert "bench_serving" in r.definitions["clock"] and "last line" in r.definitions["e2e"]
