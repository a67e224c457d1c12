"""What a benchmark learns from the server before it measures — the engine, the tokenizer, the vocabulary —
and how a run whose every request failed reads, against the stand-in speaking vLLM's endpoints.

The real vLLM runs in tests/test_vllm_engine.py; these run everywhere, in seconds, and pin the parts the
real server cannot be made to do on demand (a tokenizer that never converges, a vocabulary with holes).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest

from dsv4lab.bench import BenchResult, ClientOptions, LoadSpec, RequestSpec, Workload, random_workload, run_async
from dsv4lab.bench.ab import run_ab
from dsv4lab.bench.results import BenchRuns
from dsv4lab.bench.runner import sweep
from dsv4lab.bench.tokens import vocab_size_by_search
from dsv4lab.cli.bench import bench_main
from tests.test_bench_cli import ServerThread
from tests.test_bench_fakeserver import ServerBehaviour, ToyTokenizer, fake_server

FAIL_RED = "#cf222e"  # htmlview's colour for a failure


async def _run(behaviour: ServerBehaviour, workload: Workload, **options: object) -> tuple[BenchResult, list[str]]:
    server = await fake_server(behaviour)
    try:
        opts = ClientOptions(request_timeout_s=20, **options)  # type: ignore[arg-type]
        result = await run_async(server.url, workload, LoadSpec(concurrency=4), opts, progress=False)
    finally:
        await server.stop()
    return result, server.paths


def test_vocab_search_finds_the_edge_in_few_probes() -> None:
    for vocab in (1, 5, 1024, 1025, 3000, 32000, 128256, 151936):
        probes: list[int] = []

        async def decodes(start: int, vocab: int = vocab, probes: list[int] = probes) -> bool:
            probes.append(start)
            return start < vocab

        assert asyncio.run(vocab_size_by_search(decodes)) == vocab
        assert len(probes) <= 2 * 18 + 2, (vocab, len(probes))


def test_prompts_are_fitted_to_the_servers_tokenizer_and_counted_by_it() -> None:
    wl = random_workload(12, 40, 4, seed=3)
    result, paths = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), wl))
    ok = result.requests
    assert list(ok["status"]) == ["ok"] * 12 and ok["prompt_tokens_from_server"].all()
    assert list(ok["prompt_tokens"]) == [40] * 12  # the BOS the server adds is part of the 40
    prompts = result.provenance.workload["params"]["prompts"]
    assert prompts["vocab_size"] == ToyTokenizer.vocab and prompts["vocab_from"] == "POST /detokenize"
    assert prompts["added_by_server"] == 1 and prompts["prompts_off_target"] == 0
    assert result.provenance.workload["mean_prompt_len"] == 40
    assert "/tokenize" in paths and "/detokenize" in paths
    assert "fitted with the server's tokenizer" in result.prompts_text and "500" in result.prompts_text


def test_fitted_prompts_are_the_same_for_the_same_seed_and_server() -> None:
    wl = random_workload(6, 24, 2, seed=9)
    a, _ = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), wl))
    b, _ = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), wl))
    assert a.provenance.workload == b.provenance.workload


def test_token_ids_come_from_the_servers_vocabulary_without_its_specials() -> None:
    server_seen: list[list[int]] = []

    async def go() -> BenchResult:
        server = await fake_server(ServerBehaviour(vllm=True, itl_s=0.0))
        try:
            wl = random_workload(8, 30, 3, seed=1, token_ids=True)
            return await run_async(server.url, wl, LoadSpec(concurrency=2), ClientOptions(), progress=False)
        finally:
            server_seen.extend(b["prompt"] for b in server.bodies)
            await server.stop()

    result = asyncio.run(go())
    assert result.summary.completed == 8 and list(result.requests["prompt_tokens"]) == [30] * 8
    ids = [i for prompt in server_seen for i in prompt]
    assert max(ids) < ToyTokenizer.vocab and ToyTokenizer.bos not in ids
    assert result.provenance.workload["params"]["prompts"]["method"] == "token ids drawn from the model's vocabulary"


def test_without_a_tokenizer_the_word_prompts_go_out_and_the_result_says_so() -> None:
    result, _ = asyncio.run(_run(ServerBehaviour(itl_s=0.0), random_workload(3, 16, 2, seed=1)))
    assert result.summary.completed == 3
    method = result.provenance.workload["params"]["prompts"]["method"]
    assert method.startswith("word prompts (lengths are targets)") and "HTTP 404" in method
    # Asked not to, the client does not ask.
    off = random_workload(3, 16, 2, seed=1, server_tokenizer=False)
    result, paths = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), off))
    assert "/tokenize" not in paths and "prompts" not in result.provenance.workload["params"]


def test_vllm_is_named_from_its_version_endpoint_and_sglang_from_server_info() -> None:
    wl = random_workload(2, 8, 2, seed=1, server_tokenizer=False)
    vllm, _ = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), wl))
    p = vllm.provenance
    assert (p.engine, p.engine_version) == ("vllm", "0.32.0")
    assert p.engine_from == "GET /version and /v1/models (owned_by vllm)"
    info = {"version": "0.5.23"}
    sglang, _ = asyncio.run(_run(ServerBehaviour(itl_s=0.0, server_info=info), wl))
    p = sglang.provenance
    assert (p.engine, p.engine_version, p.engine_from) == ("sglang", "0.5.23", "GET /server_info")
    assert vllm.row()["engine"] == "vllm" and vllm.flat()["engine_version"] == "0.32.0"


def _out_of_vocabulary() -> Workload:
    reqs = tuple(RequestSpec(i, "", 3, 4, (1, 2, 19837)) for i in range(4))
    return Workload("oov", 0, reqs)


def test_a_refusal_in_the_stream_keeps_the_status_the_server_gave() -> None:
    result, _ = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), _out_of_vocabulary()))
    assert result.outcome == "failed" and set(result.requests["http_status"]) == {400}
    assert result.failure == "4 of 4 requests: HTTP 400 (in the stream): Token id 19837 is out of vocabulary"


def test_an_http_error_reads_as_the_servers_message() -> None:
    result, _ = asyncio.run(_run(ServerBehaviour(http_status=404, itl_s=0.0), random_workload(2, 8, 2)))
    assert result.failure == "2 of 2 requests: HTTP 404: overloaded"


def test_a_run_that_completed_nothing_is_a_failed_run_in_every_view() -> None:
    result, _ = asyncio.run(_run(ServerBehaviour(vllm=True, itl_s=0.0), _out_of_vocabulary()))
    reason = "HTTP 400 (in the stream): Token id 19837 is out of vocabulary"
    page = result._repr_html_()
    assert FAIL_RED in page and "✗ FAILED" in page and reason in page and "tok/s" not in page
    assert "FAILED" in repr(result) and reason in repr(result) and "tok/s" not in repr(result)
    row = result.row()
    assert (row["outcome"], row["completed"]) == ("failed", 0) and reason in row["failure"]
    assert result.flat()["outcome"] == "failed" and reason in result.flat()["failure"]
    table = BenchRuns([result])._repr_html_()
    assert FAIL_RED in table and "✗ 1 of 1 run failed" in table and reason in table


def test_a_sweep_whose_runs_all_failed_ends_red_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    served = ServerThread(ServerBehaviour(vllm=True, itl_s=0.0))
    try:
        runs = sweep(served.server.url, _out_of_vocabulary(), [1, 2], progress=True)
    finally:
        served.close()
    assert [r.outcome for r in runs] == ["failed", "failed"]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "✗ FAILED" in last and "Token id 19837 is out of vocabulary" in last and "HTTP 400" in last
    assert "✓" not in last and "best" not in last


def test_an_ab_whose_arm_failed_is_no_success(capsys: pytest.CaptureFixture[str]) -> None:
    good = ServerThread(ServerBehaviour(itl_s=0.0))
    bad = ServerThread(ServerBehaviour(http_status=503, itl_s=0.0))
    try:
        runs = run_ab(good.server.url, bad.server.url, random_workload(2, 8, 2), [1], repeats=1, progress=True)
    finally:
        good.close()
        bad.close()
    assert [r.outcome for r in runs.b] == ["failed"]
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "✗ FAILED" in last and "B: 2 of 2 requests: HTTP 503: overloaded" in last and "✓" not in last


def test_the_cli_exits_1_and_its_json_carries_the_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    served = ServerThread(ServerBehaviour(vllm=True, itl_s=0.0))
    try:
        argv = ["--url", served.server.url, "--num-prompts", "2", "--output-len", "2"]
        assert bench_main([*argv, "--json"]) == 0
        (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert row["outcome"] == "ok" and row["engine"] == "vllm"  # --api defaults to completions on vLLM
        served.server.behaviour.http_status = 404
        assert bench_main([*argv, "--json"]) == 1
        (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert row["outcome"] == "failed" and row["failure"] == "2 of 2 requests: HTTP 404: overloaded"
        assert bench_main([*argv, "--no-progress"]) == 1
        out = capsys.readouterr().out
        assert "✗ FAILED: no request completed (2 of 2 requests: HTTP 404: overloaded)" in out
    finally:
        served.close()


def test_fitting_settles_even_when_truncation_splits_a_character() -> None:
    # A tokenizer with a fixed point of overshoot (a cut id re-encodes as more tokens each time), like a
    # byte-level BPE whose cut ends inside a UTF-8 character: the fit still ends, near the target.
    from dsv4lab.bench import tokens

    class Stubborn:
        async def detokenize(self, ids: list[int]) -> str:
            return " ".join(str(i) for i in ids)

        async def tokenize(self, text: str, *, special: bool) -> list[int]:
            ids = [int(w) for w in text.split()]
            return ids + ([7, 7] if ids and ids[-1] >= 90 else [])

    def pick(rng: random.Random) -> int:
        return rng.randrange(100)

    for seed in range(20):
        text, count = asyncio.run(tokens._fit_text(Stubborn(), 30, random.Random(seed), pick))  # type: ignore[arg-type]
        assert abs(count - 30) <= 2 and text


def test_failures_that_differ_only_in_numbers_are_one_reason() -> None:
    import pandas as pd

    from dsv4lab.bench.results import failure_text

    errors = [f"HTTP 400 (in the stream): Token id {19000 + i} is out of vocabulary" for i in range(5)]
    errors += ["HTTP 500: boom", "HTTP 503: busy 1", "HTTP 503: busy 2"]
    frame = pd.DataFrame({"status": ["failed"] * 8 + ["ok"], "error": [*errors, ""]})
    assert failure_text(frame, 9) == (
        "5 of 9 requests: e.g. HTTP 400 (in the stream): Token id 19000 is out of vocabulary; "
        "2 of 9 requests: e.g. HTTP 503: busy 1; 1 other reason"
    )
