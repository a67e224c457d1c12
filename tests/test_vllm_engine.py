"""vLLM as an engine of the lab, against a REAL vLLM (the CPU build serving the tiny random Llama).

The issue's CLI contract end to end, on one server for the module (start-up is most of the time):
``dsv4lab launch --engine vllm`` renders and starts ``vllm serve`` through the one launch script,
``dsv4lab watch`` says READY from vLLM's own signals, ``dsv4lab bench`` measures it through the run dir, and
the bench client's figures are checked against the server's own (``usage.prompt_tokens`` and the
``vllm:prompt_tokens_total`` counter of ``/metrics``: the client once believed its 64-word prompts were 64
tokens and its token ids valid). Last, a SIGKILL of the API server mid-benchmark is a partial result and a
CRASHED verdict with nothing of the server's process group left running (vLLM's EngineCore and worker
outlive their API server unless the group is ended), and ``dsv4lab stop`` ends the whole tree. A stop during
start-up and the failures that need no start-up (an unknown flag, a model path that is not there) have
servers of their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.bench import ClientOptions, LoadSpec, RequestSpec, Workload, random_workload, run
from dsv4lab.cli.bench import bench_main
from tests.sshd import free_port
from tests.vllmserver import (
    HELPERS,
    SERVED_NAME,
    VENV,
    VLLMServer,
    cli,
    gone,
    roles,
    served_requests,
    wait_for_requests,
)

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

PYTHON = str(VENV / "bin" / "python")
#: Start-up is ~40 s on two idle cores with --enforce-eager, several times that beside a busy suite.
READY_TIMEOUT_S = 420
INPUT_LEN = 64
FAIL_RED = "#cf222e"


def _launch_args(model: Path, run_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        "launch", "--engine", "vllm",
        "--set", f"model_path={model}", "--set", "max_model_len=1024", "--set", "dtype=float32",
        "--set", "enforce_eager=true", "--set", "env.VLLM_CPU_KVCACHE_SPACE=1", "--set", "env.HF_HUB_OFFLINE=1",
        "--set", f"port={port}", *extra,
        "--python", PYTHON, "--run-dir", str(run_dir), "--json",
    ]  # fmt: skip


@dataclass
class Launched:
    """The module's server, as ``dsv4lab launch --json`` described it, and the view the bench tests use."""

    run_dir: Path
    handle: dict[str, Any]
    server: VLLMServer
    env: dict[str, str]

    @property
    def pgid(self) -> int:
        return int(self.handle["launcher_pid"])


@pytest.fixture(scope="module")
def launched(vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """One ``dsv4lab launch --engine vllm`` for the module, watched to READY; stopped (the whole group) after."""
    tmp = tmp_path_factory.mktemp("vllm-engine")
    state = tmp / "state"
    state.mkdir()
    env = {**os.environ, "DSV4LAB_STATE_DIR": str(state)}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    run_dir, port = tmp / "run", free_port()
    started = cli(*_launch_args(vllm_model, run_dir, port, "--set", f"served_model_name={SERVED_NAME}"), env=env)
    assert started.returncode == 0, started.stderr
    handle = json.loads(started.stdout)
    vocab = json.loads((vllm_model / "config.json").read_text())["vocab_size"]
    url = f"http://127.0.0.1:{port}"
    view = VLLMServer(url, port, vllm_model, SERVED_NAME, int(vocab), run_dir / "server.log")
    try:
        yield Launched(run_dir, handle, view, env)
    finally:
        stopped = cli("stop", str(run_dir), env=env, timeout_s=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not gone(int(handle["launcher_pid"])), "processes of the server's group outlived dsv4lab stop"


def test_launch_and_watch_follow_the_contract(launched: Launched) -> None:
    handle, run_dir = launched.handle, launched.run_dir
    assert handle["target"] == "vllm" and handle["version"] == "0.32.0" and handle["port"] == launched.server.port
    script = (run_dir / "launch.sh").read_text()
    assert "vllm.entrypoints.cli.main serve" in script and "--enforce-eager" in script
    watched = cli("watch", str(run_dir), "--json", "--timeout", str(READY_TIMEOUT_S), env=launched.env)
    verdict = json.loads(watched.stdout)
    assert verdict["verdict"] == "READY", (verdict, (run_dir / "server.log").read_text()[-3000:])
    assert roles(launched.pgid) >= HELPERS, roles(launched.pgid)  # the helpers that outlive a killed server
    # The launch's memory prediction on this host is kept beside the handle (the memory chart draws it).
    recorded = json.loads((run_dir / "handle.json").read_text())
    assert recorded["preflight"]["backend"] == "cpu" and recorded["preflight"]["fits"] is True


def _bench_args(run_dir: Path, *extra: str) -> list[str]:
    return [
        "bench", "--run-dir", str(run_dir), "--backend", "vllm", "--dataset-name", "random",
        "--input-len", "64", "--output-len", "32", "--num-prompts", "40", "--concurrency", "4", *extra, "--json",
    ]  # fmt: skip


def test_bench_through_the_run_dir(launched: Launched) -> None:
    measured = cli(*_bench_args(launched.run_dir), env=launched.env)
    assert measured.returncode == 0, measured.stderr
    result = _first_run(json.loads(measured.stdout))
    assert result["engine"] == "vllm" and result["engine_version"] == "0.32.0"
    assert result["completed"] == 40 and result["failed"] == 0 and result["output_throughput"] > 0


def _served_prompt_tokens(vllm: VLLMServer) -> tuple[float, float]:
    return vllm.counter("vllm:prompt_tokens_total"), vllm.counter("vllm:request_success_total")


def test_prompts_have_the_asked_length_under_the_servers_tokenizer(launched: Launched) -> None:
    vllm = launched.server
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


def test_a_run_the_server_refuses_is_a_red_failed_run_with_its_reason(launched: Launched) -> None:
    vllm = launched.server
    beyond = Workload("oov", 0, tuple(RequestSpec(i, "", 3, 4, (7, 8, vllm.vocab_size + 5)) for i in range(4)))
    refused = run(vllm.url, beyond, LoadSpec(concurrency=2), progress=False)
    reason = f"HTTP 400 (in the stream): Token id {vllm.vocab_size + 5} is out of vocabulary"
    assert refused.outcome == "failed" and refused.failure == f"4 of 4 requests: {reason}"
    page = refused._repr_html_()
    assert FAIL_RED in page and "✗ FAILED" in page and reason in page
    unknown = run(vllm.url, random_workload(2, 16, 2), options=ClientOptions(model="nope"), progress=False)
    assert unknown.outcome == "failed" and "HTTP 404: The model `nope` does not exist" in str(unknown.failure)


def test_the_engine_and_version_are_the_servers_own(launched: Launched) -> None:
    vllm = launched.server
    version = json.loads(vllm.get("/version"))["version"]
    result = run(vllm.url, random_workload(1, 8, 2, server_tokenizer=False), LoadSpec(warmup=0), progress=False)
    p = result.provenance
    assert (p.engine, p.engine_version) == ("vllm", version)
    assert p.engine_from is not None and "GET /version" in p.engine_from


def test_the_bench_cli_against_vllm_by_url(launched: Launched, capsys: pytest.CaptureFixture[str]) -> None:
    vllm = launched.server
    argv = ["--url", vllm.url, "--num-prompts", "6", "--input-len", str(INPUT_LEN), "--output-len", "8"]
    assert bench_main([*argv, "--concurrency", "2", "--json"]) == 0  # no --api: completions, as vLLM speaks
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert (row["outcome"], row["completed"], row["engine"]) == ("ok", 6, "vllm")
    assert abs(row["total_input_tokens"] / row["completed"] - INPUT_LEN) <= 2
    assert row["prompts"]["vocab_size"] == vllm.vocab_size

    assert bench_main([*argv, "--model", "nope", "--json"]) == 1
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert row["outcome"] == "failed" and "HTTP 404: The model `nope` does not exist" in row["failure"]


def test_a_sigkill_mid_benchmark_is_partial_crashed_and_reaped(launched: Launched) -> None:
    """Last in the module: it kills the module's server."""
    run_dir, env = launched.run_dir, launched.env
    long_bench = [*_bench_args(run_dir)[:-1], "--num-prompts", "400", "--output-len", "64", "--json"]
    done_before = served_requests(launched.server.port)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dsv4lab", *long_bench], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    api = int((run_dir / "server.pid").read_text())
    wait_for_requests(launched.server.port, done_before + 6)  # under way, not still fitting its prompts
    assert proc.poll() is None, "the benchmark ended before the kill"
    os.kill(api, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert out, err
    partial = _first_run(json.loads(out))
    assert partial["partial"] and partial["completed"] < 400, partial
    assert "CRASHED" in json.dumps(partial["diagnosis"]) or "CRASHED" in (partial.get("abort_reason") or "")
    # The benchmark's look at the dead server reaped what it left: no EngineCore, no worker.
    left = gone(launched.pgid)
    assert not left, [(p.pid, p.name()) for p in left]
    after = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "30", env=env).stdout)
    assert after["verdict"] == "CRASHED" and after["exit_status"] == 137, after


def test_stop_ends_the_whole_tree_of_a_running_vllm(vllm_model: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    handle = json.loads(cli(*_launch_args(vllm_model, run_dir, free_port()), env=cli_env).stdout)
    pgid = int(handle["launcher_pid"])
    try:
        # Stop during start-up, once the engine's processes exist: the API server, EngineCore, worker.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not roles(pgid) >= HELPERS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert roles(pgid) >= HELPERS, roles(pgid)
    finally:
        stopped = cli("stop", str(run_dir), env=cli_env, timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not gone(pgid, within_s=5.0)
    verdict = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "10", env=cli_env).stdout)
    assert verdict["verdict"] == "STOPPED", verdict


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        (["--set", "extra_args=--no-such-flag"], "flag"),
        (["--set", "model_path=/nonexistent/tiny-model"], "model"),
    ],
    ids=["unknown flag", "model path"],
)
def test_failures_before_start_up_are_crashes_with_a_cause(
    vllm_model: Path, cli_env: dict[str, str], tmp_path: Path, extra: list[str], cause: str
) -> None:
    run_dir = tmp_path / "run"
    args = _launch_args(vllm_model, run_dir, free_port(), *extra)
    started = cli(*args, env=cli_env)
    assert started.returncode == 0, started.stderr
    pgid = int(json.loads(started.stdout)["launcher_pid"])
    verdict = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "240", env=cli_env).stdout)
    assert verdict["verdict"] == "CRASHED", verdict
    assert verdict["exit_status"] != 0, verdict  # None: judged from the fatal line before the exit
    diagnosis: dict[str, Any] = verdict["diagnosis"] or {}
    text = json.dumps(diagnosis).lower()
    assert cause in text, diagnosis
    assert not gone(pgid)


def _first_run(data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if isinstance(data, list):
        data = data[0]
    assert isinstance(data, dict), data
    return data
